"""The trainer: supervised warm start, then GRPO (or PPO: `[grpo] algorithm = "ppo"`)
over multi-turn episodes judged in real sandboxes. `train()` reads top to bottom:

    setup ─► [SFT warm start] ─► held-out pass@1 ─► for each step:
        rollout (agent loop: generate ─► judge ─► feedback ─► …)   trialbox.rollout
                (async: the producer's batch, rolled out ahead by   pipeline.py
                 weights at most max_staleness steps older)
        rewards ─► group advantages (None = excluded, counted)    losses.py
                   (PPO: values ─► GAE ─► whitened, in ppo_step)  ppo.py
        update epochs, gradient accumulation over micro-batches   update.py
                   (NaN ─► step skipped)
        log (metrics.jsonl, TensorBoard) ─► checkpoint            runfiles.py
    ─► held-out pass@1 again

    result = asyncio.run(train(load_config("trialbox/train/demo.toml")))

A run directory holds `metrics.jsonl` (one line per step, plus `eval` and `sft` lines),
`tb/` (TensorBoard events), `checkpoint/` (model, optimizer, step, PPO's value head; `[run] resume =
true` continues from it) and `sft/` (the model after the warm start), `final/` (the trained model).
"""

from __future__ import annotations

import asyncio
import copy
import json
import math
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from trialbox import telemetry
from trialbox.errors import UsageError
from trialbox.judge.reward import RewardSpec
from trialbox.rollout.agent import AgentConfig, RolloutBatch, rollout
from trialbox.rollout.hf_policy import HFPolicy
from trialbox.rollout.policy import ByteTokenizer
from trialbox.sandbox.pool import CellPool
from trialbox.train import demo_tasks
from trialbox.train.config import Algorithm, RewardKind, RolloutMode, TrainConfig
from trialbox.train.losses import group_advantages, rewards_tensor
from trialbox.train.pipeline import (
    AsyncBatches,
    Batches,
    ModelClock,
    PrioritySlots,
    StepBatch,
    SyncBatches,
    TimedPolicy,
    WeightCopies,
)
from trialbox.train.model import build_model, load_model, resolve_device, save_model
from trialbox.train.ppo import VALUE_HEAD_FILE, ValueHead, ppo_step
from trialbox.train.replay import SuccessReplay
from trialbox.train.runfiles import Checkpoint, MetricsLog
from trialbox.train.sft import sft
from trialbox.train.update import UpdateStats, policy_step
from trialbox.types import Outcome, Task, Trajectory

Progress = Callable[[str, dict[str, Any]], None]
"""(event, record): "sft" (every few SFT steps), "eval", "step", "skip", "stop"."""


@dataclass
class TrainResult:
    out_dir: str
    steps_done: int
    pass_before: float | None
    pass_after: float | None
    stopped: str = ""
    """Why training stopped early ("" when it ran every step)."""
    history: list[dict[str, Any]] = field(default_factory=list)
    sft_seconds: float = 0.0
    wall_s: float = 0.0


# --------------------------------------------------------------------------- plumbing

def train_tasks(config: TrainConfig, step: int) -> list[Task]:
    """The tasks of one GRPO step: a function of the seed and the step (so a resumed
    run sees the tasks it would have seen)."""
    return demo_tasks.make_tasks(demo_tasks.Split.TRAIN, config.grpo.tasks_per_step,
                                 seed=config.run.seed * 1_000_003 + step)


def agent_config(config: TrainConfig, *, max_turns: int | None = None,
                 temperature: float | None = None) -> AgentConfig:
    """The agent loop for the demo tasks: raw completions of the `return ` line,
    judge-only (no separate run: the visible tests' feedback says what failed)."""
    r = config.rollout
    spec = RewardSpec() if r.reward is RewardKind.BINARY else \
        RewardSpec(pass_rate=0.5, all_passed=0.5, binary=False)
    return AgentConfig(reward_spec=spec,
        max_turns=max_turns or r.max_turns, max_new_tokens=r.max_new_tokens,
        temperature=r.temperature if temperature is None else temperature,
        stop=("\n",), max_context_tokens=config.positions, turn_penalty=r.turn_penalty,
        execute=False, max_concurrent_env=r.env_workers,
        render_prompt=demo_tasks.render_prompt, render_feedback=demo_tasks.render_feedback)


async def evaluate_pass1(policy: HFPolicy, config: TrainConfig, pool: CellPool) -> \
        dict[str, Any]:
    """Held-out pass@1: one single-turn sample per unseen task, graded by the judge.
    Excluded (infra) episodes leave the denominator and are counted."""
    tasks = demo_tasks.make_tasks(demo_tasks.Split.HELDOUT, config.eval.tasks,
                                  config.eval.seed)
    batch = await rollout(policy, tasks, group_size=1, pool=pool,
                          config=agent_config(config, max_turns=1,
                                              temperature=config.eval.temperature))
    graded = batch.stats.episodes - batch.stats.excluded
    outcomes: dict[str, int] = {}
    by_template: dict[str, list[int]] = {}
    teacher_bugs = 0  # answers that are exactly the warm start's teacher's bug
    by_id = {t.task_id: t for t in tasks}
    for t in batch.trajectories:
        key = t.grade.outcome.value if t.grade is not None else "none"
        outcomes[key] = outcomes.get(key, 0) + 1
        task = by_id[t.task_id]
        row = by_template.setdefault(demo_tasks.template_of(task), [0, 0])
        row[0] += int(t.passed)
        row[1] += int(t.reward is not None)
        bug = demo_tasks.teacher_bug(task)
        said = " ".join(t.turns[0].output_text.split("\n", 1)[0].split()) if t.turns else ""
        teacher_bugs += int(bug is not None and said == bug.strip())
    return {"pass1": batch.stats.passed / graded if graded else None,
            "outcomes": outcomes, "teacher_bugs": teacher_bugs,
            "by_template": dict(sorted(by_template.items())),
            "passed": batch.stats.passed, "graded": graded,
            "excluded": batch.stats.excluded, "tasks": len(tasks),
            "temperature": config.eval.temperature, "wall_s": batch.stats.wall_s}


def step_record(got: StepBatch, upd: UpdateStats, *, t0: float, t_rollout: float,
                t_update: float, lap: tuple[float, float], ppo: bool) -> dict[str, Any]:
    """One line of metrics.jsonl for a step. `rollout_s` is how long the step waited for
    its batch (sync: the whole rollout); `lap_s` the wall time since the previous step's
    record (the previous step's logging and checkpoint included) and `policy_wait_s`
    how much of it the model neither generated nor trained (it waited on environments)."""
    trajs, s = got.batch.trajectories, got.batch.stats
    graded = [t for t in trajs if t.reward is not None]
    first = [t for t in graded if t.turns and t.turns[0].outcome is Outcome.PASSED]
    elapsed = max(1e-9, time.monotonic() - t0)
    lap_s, wait_s = lap
    record: dict[str, Any] = {
        "reward": sum(t.reward for t in graded if t.reward is not None)
        / max(1, len(graded)),
        "pass_rate": sum(t.passed for t in graded) / max(1, len(graded)),
        "pass_turn1": len(first) / max(1, len(graded)),
        "excluded": s.excluded, "episodes": s.episodes, "turns": s.turns,
        "trained_on": upd.trained_on, "loss": upd.loss, "kl": upd.kl,
        "clip_frac": upd.clip_frac, "grad_norm": upd.grad_norm,
        "replayed": upd.replayed, "replay_nll": upd.replay_nll,
        "gen_s": s.gen_s, "env_wall_s": s.env_wall_s, "rollout_s": t_rollout,
        "update_s": t_update, "model_tokens": s.model_tokens,
        "episodes_per_s": s.episodes / elapsed, "tokens_per_s": s.model_tokens / elapsed,
        "step_s": elapsed, "policy_version": got.version, "staleness": got.staleness,
        "lap_s": lap_s, "policy_wait_s": wait_s,
        "policy_wait_share": wait_s / max(1e-9, lap_s),
    }
    if ppo:
        record["value_loss"] = upd.value_loss
    return record


# --------------------------------------------------------------------------- the loop

async def train(config: TrainConfig, pool: CellPool | None = None,
                progress: Progress | None = None) -> TrainResult:
    """Run the whole recipe of `config`; see the module docstring."""
    say: Progress = progress or (lambda event, record: None)
    t_start = time.monotonic()
    run, g = config.run, config.grpo

    # ---- setup -----------------------------------------------------------------------
    device = resolve_device(run.device)
    if run.threads:
        torch.set_num_threads(run.threads)
    os.makedirs(run.out_dir, exist_ok=True)
    ckpt = Checkpoint(run.out_dir)
    tok = ByteTokenizer()
    state: dict[str, Any] = {"step": 0, "pass_before": None, "bad_in_a_row": 0,
                             "history": []}
    model: Any
    if run.resume:
        state = ckpt.load_state()
        model, _ = load_model(ckpt.path)
    elif config.model.path:
        model, _ = load_model(config.model.path)
    else:
        model = build_model(config.model.shape, tok, seed=run.seed)
    model.to(device)
    log = MetricsLog(run.out_dir, append=run.resume)
    own_pool = pool is None
    if pool is None:
        from trialbox.judge.function import judge_pool_config
        pool = await CellPool(judge_pool_config(warm=2 * config.rollout.env_workers)).start()
    result = TrainResult(run.out_dir, 0, None, None)
    try:
        # ---- supervised warm start (fresh runs only) -----------------------------------
        if not run.resume and config.sft.steps:
            pairs = demo_tasks.sft_pairs(demo_tasks.make_tasks(
                demo_tasks.Split.TRAIN, max(2000, config.sft.steps * config.sft.batch_size
                                            // 4), seed=run.seed + 7), seed=run.seed,
                retry_share=config.sft.retry_share, teacher_error=config.sft.teacher_error)
            stats = sft(model, tok, pairs, config.sft, device=device, progress=lambda s, loss:
                        say("sft", {"step": s, "steps": config.sft.steps, "loss": loss})
                        if s % 10 == 0 or s == config.sft.steps else None)
            result.sft_seconds = stats.seconds
            save_model(model, tok, os.path.join(run.out_dir, "sft"))
            log.write("sft", 0, {"loss": stats.final_loss, "seconds": stats.seconds,
                                 "steps": stats.steps})
        policy = HFPolicy(model, tok, seed=run.seed)
        ref = None
        if g.kl_coef > 0:  # the frozen starting point the KL term pulls towards (on a
            # resumed run: the checkpoint's model, the original start is not kept)
            ref = copy.deepcopy(model).train(False)
            for p in ref.parameters():
                p.requires_grad_(False)
        head: ValueHead | None = None
        params = list(model.parameters())
        if g.algorithm is Algorithm.PPO:  # the critic shares the optimizer (and lr)
            head = ValueHead(model.config.n_embd).to(device)
            if run.resume:
                head_file = os.path.join(ckpt.path, VALUE_HEAD_FILE)
                if not os.path.exists(head_file):
                    raise UsageError(f"[grpo] algorithm = 'ppo' but {ckpt.path} holds no "
                                     f"{VALUE_HEAD_FILE} (a GRPO checkpoint?); resume it "
                                     "with algorithm = 'grpo' or start afresh")
                head.load_state_dict(torch.load(head_file, map_location=device))
            params += list(head.parameters())
        opt = torch.optim.AdamW(params, lr=g.lr, weight_decay=0.0)
        if run.resume:
            # via the CPU: a checkpoint written on a GPU then loads anywhere, and
            # load_state_dict moves the moments to the parameters' device
            opt.load_state_dict(torch.load(os.path.join(ckpt.path, "optimizer.pt"),
                                           map_location="cpu"))

        if not run.resume and config.eval.tasks:
            before = await evaluate_pass1(policy, config, pool)
            state["pass_before"] = before["pass1"]
            log.write("eval", 0, {"when": 0, **before})
            say("eval", {"when": "before", **before})
        result.pass_before = state["pass_before"]

        # ---- GRPO ---------------------------------------------------------------------
        run_id = os.path.basename(os.path.normpath(run.out_dir))
        max_tokens = config.rollout.max_turns * config.rollout.max_new_tokens
        agent = agent_config(config)
        clock = ModelClock()  # when the model works; the rest of the time it waits
        asynchronous = config.rollout.mode is RolloutMode.ASYNC
        # async: one private copy of the weights per batch in flight (pipeline.py)
        copies = WeightCopies(model, config.rollout.max_staleness + 1) \
            if asynchronous else None

        # Batches in flight share the environment's env_workers slots and the model (one
        # generate call or update at a time), the oldest batch first (pipeline.py).
        env_slots = PrioritySlots(config.rollout.env_workers)
        model_slots = PrioritySlots(1)

        def launch(step: int, version: int) -> Awaitable[RolloutBatch]:
            """Step `step`'s rollout, sampled by the live model (sync) or by a copy of
            its weights taken now (async; `version` is what the trainer published)."""
            def sample_with(sampler: HFPolicy) -> Awaitable[RolloutBatch]:
                return rollout(TimedPolicy(sampler, clock, model_slots.lane(step)),
                               train_tasks(config, step),
                               group_size=g.group_size, pool=pool, config=agent,
                               env_slots=env_slots.lane(step))
            if copies is None:
                return sample_with(policy)
            return copies.run_on_snapshot(model, lambda weights: sample_with(
                HFPolicy(weights, tok, seed=run.seed * 1_000_003 + step)))

        # self-imitation (`[grpo] replay`): judge-passed answers of earlier steps
        replay = SuccessReplay(g.replay_capacity, seed=run.seed) if g.replay else None

        def update(trajs: list[Trajectory], step: int) -> UpdateStats:
            """Rewards -> advantages -> update epochs (runs in a worker thread)."""
            values, valid = rewards_tensor([t.reward for t in trajs])
            if head is not None:  # PPO: per-token GAE advantages, inside ppo_step
                return ppo_step(model, head, opt, trajs, valid, g, ref=ref,
                                temperature=config.rollout.temperature,
                                max_tokens=max_tokens, pad_id=tok.pad_id, device=device)
            # (G, K): a task's K samples side by side
            adv = group_advantages(values.view(-1, g.group_size),
                                   valid.view(-1, g.group_size), g.advantage).view(-1)
            upd = policy_step(model, opt, trajs, adv, valid, g, ref=ref,
                              temperature=config.rollout.temperature,
                              max_tokens=max_tokens, pad_id=tok.pad_id, device=device,
                              replay=replay.sample(g.replay, step) if replay else None)
            if replay is not None:
                replay.add(trajs)  # after: a step replays only earlier steps' answers
            return upd

        batches: Batches = AsyncBatches(
            launch, first=state["step"], steps=g.steps,
            max_staleness=config.rollout.max_staleness) if asynchronous \
            else SyncBatches(launch)
        batches.start()
        clock.lap()
        try:
            while state["step"] < g.steps:
                step = state["step"]
                t0 = time.monotonic()

                # One trace per iteration: its episodes (model output, sandbox runs,
                # grading, reward) and its training step nest under it
                # (docs/observability.md); an async batch is its own trace.
                with telemetry.span("train.iteration", {"run.id": run_id,
                                                        "train.step": step + 1}):
                    # rollout: multi-turn episodes through the agent loop and the real
                    # judge (sync: rolled out now; async: the producer's, stamped with
                    # the version that sampled it)
                    got = await batches.get(step)
                    t_rollout = time.monotonic() - t0
                    trajs = got.batch.trajectories

                    # rewards -> advantages -> update epochs with gradient accumulation,
                    # in a worker thread: the event loop keeps driving the producer
                    async with model_slots.lane(step):
                        t1 = time.monotonic()
                        with telemetry.train_step(run_id, step + 1, episodes=len(trajs)), \
                                clock.busy():
                            upd = await asyncio.to_thread(update, trajs, step)
                        t_update = time.monotonic() - t1
                batches.publish(step + 1)  # async: launches batch step + 1 + K

                # log
                record = step_record(got, upd, t0=t0, t_rollout=t_rollout,
                                     t_update=t_update, lap=clock.lap(), ppo=head is not None)
                state["step"] = step + 1
                scalars = {k: float(record[k]) for k in ("pass_rate", "loss", "kl")
                           if isinstance(record[k], (int, float))
                           and math.isfinite(record[k])}
                telemetry.record_train_step(run_id, step + 1, reward_mean=record["reward"],
                                            **scalars)
                if upd.skipped:
                    state["bad_in_a_row"] += 1
                    record["skipped"] = "non-finite loss"
                    log.write("skip", step + 1, record)
                    say("skip", {"step": step + 1, **record})
                    if state["bad_in_a_row"] >= g.max_bad_steps:
                        result.stopped = (f"{state['bad_in_a_row']} steps in a row had a "
                                          "non-finite loss (max_bad_steps = "
                                          f"{g.max_bad_steps})")
                        say("stop", {"reason": result.stopped})
                        break
                else:
                    state["bad_in_a_row"] = 0
                    log.write("step", step + 1, record)
                    say("step", {"step": step + 1, "steps": g.steps, **record})
                state["history"].append({"step": step + 1, "reward": record["reward"],
                                         "pass_rate": record["pass_rate"],
                                         "pass_turn1": record["pass_turn1"]})

                # checkpoint (async: the batches in flight are not saved; see pipeline.py)
                if state["step"] % run.checkpoint_every == 0 or state["step"] == g.steps:
                    ckpt.save(model, tok, opt, state, head)
        finally:
            await batches.aclose()

        # ---- the end: held-out pass@1 again, the final model ---------------------------
        result.steps_done = state["step"]
        if config.eval.tasks:
            after = await evaluate_pass1(policy, config, pool)
            result.pass_after = after["pass1"]
            log.write("eval", state["step"], {"when": state["step"], **after})
            say("eval", {"when": "after", **after})
        save_model(model, tok, os.path.join(run.out_dir, "final"))
        if head is not None:
            torch.save(head.state_dict(), os.path.join(run.out_dir, "final",
                                                       VALUE_HEAD_FILE))
        result.history = list(state["history"])
        result.wall_s = time.monotonic() - t_start
        with open(os.path.join(run.out_dir, "config.json"), "w") as f:
            json.dump(asdict(config), f, default=str, indent=1)
    finally:
        log.close()
        if own_pool:
            await pool.close()
    return result
