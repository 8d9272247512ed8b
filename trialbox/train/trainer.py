"""The trainer: supervised warm start, then GRPO (or PPO: `[grpo] algorithm = "ppo"`)
over multi-turn episodes judged in real sandboxes. `train()` reads top to bottom:

    setup ([tasks] splits, [policy]) ─► [SFT warm start] ─► pass@1 on [eval] split
    ─► for each step:
        rollout (agent loop: generate ─► judge ─► feedback ─► …)   trialbox.rollout
                (async: the producer's batch, rolled out ahead by   pipeline.py
                 weights at most max_staleness steps older)
        rewards ─► group advantages (None = excluded, counted)    losses.py
                   (PPO: values ─► GAE ─► whitened, in ppo_step)  ppo.py
        update epochs, gradient accumulation over micro-batches   update.py
                   (NaN ─► step skipped; the update function is
                    chosen once, `make_update`)
        log (metrics.jsonl, TensorBoard) ─► checkpoint            runfiles.py
    ─► pass@1 again, the rise with its paired 95% interval      confidence.py

With `[policy] kind = "openai"` the run only evaluates the served model (`evaluate_served`).

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
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch

from trialbox import telemetry
from trialbox.errors import UsageError
from trialbox.judge.reward import RewardSpec
from trialbox.rollout.agent import AgentConfig, Grader, RolloutBatch, rollout
from trialbox.rollout.hf_policy import HFPolicy
from trialbox.rollout.openai_policy import OpenAIConfig, OpenAIPolicy
from trialbox.rollout.policy import ByteTokenizer, Policy
from trialbox.rollout.text import default_prompt
from trialbox.sandbox.base import SandboxProvider
from trialbox.sandbox.pool import CellPool
from trialbox.train import demo_tasks
from trialbox.store.journal import Journal
from trialbox.train import episodes as journaled
from trialbox.train.confidence import paired_rise, wilson
from trialbox.train.config import Algorithm, PolicyKind, RewardKind, RolloutMode, TrainConfig
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
from trialbox.train.tasksets import EvalTasks, TaskSets, sft_pair, task_sets
from trialbox.train.update import UpdateStats, policy_step
from trialbox.types import Outcome, StepSummary, Task, TrainState, Trajectory

Progress = Callable[[str, dict[str, Any]], None]
"""(event, record): "sft" (every few SFT steps), "eval", "step", "skip", "stop",
"episodes" (the journal, and how many episodes were run now or read back from it)."""
StartGeneration = Callable[[Any, ByteTokenizer], Awaitable[Any]]
"""(model, tokenizer) -> started policy servers: `publish(model, version)`,
`policy(version, seed)`, `status()`, `servers_info()`, `close()`
(`rollout.fleet.PolicyFleet`)."""


@dataclass
class TrainResult:
    out_dir: str
    steps_done: int
    pass_before: float | None
    pass_after: float | None
    stopped: str = ""
    """Why training stopped early ("" when it ran every step)."""
    history: list[StepSummary] = field(default_factory=list)
    sft_seconds: float = 0.0
    wall_s: float = 0.0
    eval_before: dict[str, Any] | None = None
    """The evaluation record before training (`evaluate_pass1`: split, ci95, note, …)."""
    eval_after: dict[str, Any] | None = None
    rise: tuple[float, float, float] | None = None
    """pass@1 after - before on the same tasks, with its paired 95% interval."""


# --------------------------------------------------------------------------- plumbing

def run_task_sets(config: TrainConfig) -> TaskSets:
    """The run's tasks ([tasks]), loaded and checked: a UsageError before anything is
    written when a source is missing or a split the run uses is empty."""
    training = config.policy.kind is PolicyKind.LOCAL and bool(
        config.grpo.steps or config.sft.steps)
    return task_sets(config.tasks, seed=config.run.seed,
                     tasks_per_step=config.grpo.tasks_per_step,
                     sft_size=max(2000, config.sft.steps * config.sft.batch_size // 4),
                     training=training,
                     eval_split=config.eval.split if config.eval.tasks else None)


def train_tasks(config: TrainConfig, step: int) -> list[Task]:
    """The tasks of one GRPO step of the demo family: a function of the seed and the
    step (so a resumed run sees the tasks it would have seen)."""
    return TaskSets(config.tasks, config.run.seed, config.grpo.tasks_per_step,
                    0).train_step(step)


def trained_on(config: TrainConfig, sets: TaskSets) -> list[Task]:
    """Every task the run trains on: the warm start's and each GRPO step's."""
    if config.policy.kind is not PolicyKind.LOCAL:
        return []
    sft_tasks = sets.sft_tasks if config.sft.steps else []
    return sft_tasks + [t for s in range(config.grpo.steps) for t in sets.train_step(s)]


def agent_config(config: TrainConfig, *, max_turns: int | None = None,
                 temperature: float | None = None) -> AgentConfig:
    """The agent loop. The demo family: raw completions of the `return ` line,
    judge-only (no separate run: the visible tests' feedback says what failed). Other
    sources: the agent's default prompt and feedback (a whole function or program in a
    ```python block, the run's stderr and the failing visible tests)."""
    r = config.rollout
    spec = RewardSpec() if r.reward is RewardKind.BINARY else \
        RewardSpec(pass_rate=0.5, all_passed=0.5, binary=False)
    demo = config.tasks.demo
    return AgentConfig(reward_spec=spec,
        max_turns=max_turns or r.max_turns, max_new_tokens=r.max_new_tokens,
        temperature=r.temperature if temperature is None else temperature,
        stop=("\n",) if demo else (), max_context_tokens=config.positions,
        turn_penalty=r.turn_penalty, execute=not demo, max_concurrent_env=r.env_workers,
        render_prompt=demo_tasks.render_prompt if demo else None,
        render_feedback=demo_tasks.render_feedback if demo else None)


async def evaluate_pass1(policy: Policy, config: TrainConfig, pool: SandboxProvider,
                         tasks: EvalTasks, grader: Grader | None = None) -> dict[str, Any]:
    """pass@1 on `tasks`: one single-turn sample per task, graded by the judge, with its
    95% Wilson interval. Excluded (infra) episodes leave the denominator and are
    counted; `passed_ids` (the tasks passed) lets two evaluations be paired."""
    batch = await rollout(policy, tasks.tasks, group_size=1, pool=pool, grader=grader,
                          config=agent_config(config, max_turns=1,
                                              temperature=config.eval.temperature))
    graded = batch.stats.episodes - batch.stats.excluded
    outcomes: dict[str, int] = {}
    by_template: dict[str, list[int]] = {}
    teacher_bugs = 0  # answers that are exactly the warm start's teacher's bug
    by_id = {t.task_id: t for t in tasks.tasks}
    for t in batch.trajectories:
        key = t.grade.outcome.value if t.grade is not None else "none"
        outcomes[key] = outcomes.get(key, 0) + 1
        if not config.tasks.demo:
            continue
        task = by_id[t.task_id]
        row = by_template.setdefault(demo_tasks.template_of(task), [0, 0])
        row[0] += int(t.passed)
        row[1] += int(t.reward is not None)
        bug = demo_tasks.teacher_bug(task)
        said = " ".join(t.turns[0].output_text.split("\n", 1)[0].split()) if t.turns else ""
        teacher_bugs += int(bug is not None and said == bug.strip())
    lo, hi = wilson(batch.stats.passed, graded)
    return {"pass1": batch.stats.passed / graded if graded else None,
            "ci95": [lo, hi], "split": tasks.split.value, "note": tasks.note,
            "removed": tasks.removed,
            "outcomes": outcomes, "teacher_bugs": teacher_bugs,
            "by_template": dict(sorted(by_template.items())),
            "passed": batch.stats.passed, "graded": graded,
            "excluded": batch.stats.excluded, "tasks": len(tasks.tasks),
            "passed_ids": sorted(t.task_id for t in batch.trajectories if t.passed),
            "graded_ids": sorted(t.task_id for t in batch.trajectories
                                 if t.reward is not None),
            "temperature": config.eval.temperature, "wall_s": batch.stats.wall_s}


def rise_ci(before: dict[str, Any], after: dict[str, Any]) -> tuple[float, float, float]:
    """The paired rise of pass@1 (mean, lo, hi) over the tasks graded both times."""
    both = sorted(set(before["graded_ids"]) & set(after["graded_ids"]))
    b, a = set(before["passed_ids"]), set(after["passed_ids"])
    return paired_rise([i in b for i in both], [i in a for i in both])


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


def sft_data(config: TrainConfig, sets: TaskSets) -> list[tuple[str, str]]:
    """The warm start's (context, completion) pairs: the demo's unverified teacher, or
    a file source's canonical solutions (`tasksets.sft_pair`)."""
    if config.tasks.demo:
        return demo_tasks.sft_pairs(sets.sft_tasks, seed=config.run.seed,
                                    retry_share=config.sft.retry_share,
                                    teacher_error=config.sft.teacher_error)
    pairs = [p for t in sets.sft_tasks if (p := sft_pair(t, default_prompt)) is not None]
    if not pairs:
        raise UsageError(f"[sft] steps = {config.sft.steps}, but no task of the train "
                         "split has a canonical_solution to imitate; set [sft] steps = 0 "
                         "(start from [model] path) or add solutions")
    return pairs


def check_fits(config: TrainConfig, sets: TaskSets, evals: EvalTasks | None) -> None:
    """A file source's prompts must fit the local model's positions with a turn's
    tokens after them (the byte-level model: one token per byte)."""
    if config.tasks.demo:
        return  # TrainConfig checks the demo family's sizes
    positions = config.positions
    if config.model.path:
        with open(os.path.join(config.model.path, "config.json")) as f:
            positions = int(json.load(f).get("n_positions", positions))
    tasks = sets.train + (evals.tasks if evals is not None else [])
    longest = max((len(default_prompt(t).encode()) for t in tasks), default=0)
    if longest + config.rollout.max_new_tokens > positions:
        raise UsageError(
            f"[tasks] the longest prompt is {longest} tokens, which with [rollout] "
            f"max_new_tokens = {config.rollout.max_new_tokens} does not fit the model's "
            f"{positions} positions; raise [model] n_positions, or use a larger model "
            "([model] path) or shorter tasks")


async def evaluate_served(config: TrainConfig, evals: EvalTasks,
                          pool: SandboxProvider | None,
                          say: Progress, t_start: float,
                          grader: Grader | None = None) -> TrainResult:
    """[policy] kind = "openai": pass@1 of the served model on the eval split (no
    training: trialbox cannot update a served model's weights yet)."""
    p = config.policy
    policy = OpenAIPolicy(p.base_url, p.model, served_tokenizer(p.tokenizer),
                          api_key=os.environ.get(p.api_key_env) if p.api_key_env else None,
                          config=OpenAIConfig(timeout_s=p.timeout_s,
                                              max_concurrency=p.max_concurrency,
                                              prompt_as=p.prompt_as))
    os.makedirs(config.run.out_dir, exist_ok=True)
    log = MetricsLog(config.run.out_dir, append=False)
    own_pool: CellPool | None = None
    if pool is None:
        from trialbox.judge.function import judge_pool_config
        pool = own_pool = await CellPool(judge_pool_config(
            warm=2 * config.rollout.env_workers)).start()
    try:
        record = await evaluate_pass1(policy, config, pool, evals, grader)
        log.write("eval", 0, {"when": 0, "policy": p.model, **record})
        say("eval", {"when": "served", **record})
        with open(os.path.join(config.run.out_dir, "config.json"), "w") as f:
            json.dump(asdict(config), f, default=str, indent=1)
    finally:
        log.close()
        await policy.aclose()
        if own_pool is not None:
            await own_pool.close()
    return TrainResult(config.run.out_dir, 0, record["pass1"], None, eval_before=record,
                       wall_s=time.monotonic() - t_start)


def served_tokenizer(spec: str) -> Any:
    """[policy] tokenizer: "byte", or a local transformers tokenizer directory."""
    if spec == "byte":
        return ByteTokenizer()
    if not os.path.isdir(spec):
        raise UsageError(f"[policy] tokenizer {spec!r} is neither 'byte' nor a directory; "
                         "give the served model's tokenizer directory")
    from transformers import AutoTokenizer
    try:
        return AutoTokenizer.from_pretrained(spec, local_files_only=True)
    except (OSError, ValueError) as e:
        raise UsageError(f"[policy] tokenizer {spec!r}: no tokenizer could be loaded "
                         f"({e})") from e


Update = Callable[[list[Trajectory], int], UpdateStats]
"""Rewards -> advantages -> update epochs for one step's trajectories (runs in a worker
thread); `make_update` picks the algorithm's once, when the trainer is built."""


def make_update(config: TrainConfig, model: Any, opt: torch.optim.Optimizer, *,
                head: ValueHead | None, ref: Any, pad_id: int,
                device: torch.device,
                history: list[list[Trajectory]] | None = None) -> Update:
    """The update function of `[grpo] algorithm` (no algorithm test inside the loop).
    `history`: the earlier steps' trajectories of a resumed run (read back from the
    journal), which refill the replay buffer as the uninterrupted run had filled it."""
    g = config.grpo
    temperature = config.rollout.temperature
    max_tokens = config.rollout.max_turns * config.rollout.max_new_tokens

    if g.algorithm is Algorithm.PPO:
        assert head is not None
        critic = head

        def ppo_update(trajs: list[Trajectory], step: int) -> UpdateStats:
            # per-token GAE advantages from the value head, inside ppo_step
            _, valid = rewards_tensor([t.reward for t in trajs])
            return ppo_step(model, critic, opt, trajs, valid, g, ref=ref,
                            temperature=temperature, max_tokens=max_tokens, pad_id=pad_id,
                            device=device)
        return ppo_update

    # self-imitation (`[grpo] replay`): judge-passed answers of earlier steps
    replay = SuccessReplay(g.replay_capacity, seed=config.run.seed) if g.replay else None
    if replay is not None:
        for earlier in history or []:
            replay.add(earlier)

    def grpo_update(trajs: list[Trajectory], step: int) -> UpdateStats:
        values, valid = rewards_tensor([t.reward for t in trajs])
        # (G, K): a task's K samples side by side
        adv = group_advantages(values.view(-1, g.group_size),
                               valid.view(-1, g.group_size), g.advantage).view(-1)
        upd = policy_step(model, opt, trajs, adv, valid, g, ref=ref,
                          temperature=temperature, max_tokens=max_tokens, pad_id=pad_id,
                          device=device,
                          replay=replay.sample(g.replay, step) if replay else None)
        if replay is not None:
            replay.add(trajs)  # after: a step replays only earlier steps' answers
        return upd
    return grpo_update


# --------------------------------------------------------------------------- the loop

async def train(config: TrainConfig, pool: SandboxProvider | None = None,
                progress: Progress | None = None,
                grader: Grader | None = None,
                generation: StartGeneration | None = None) -> TrainResult:
    """Run the whole recipe of `config`; see the module docstring. `pool`: where the
    episodes' own sessions run (default: a namespace `CellPool` here; `--backend ray`:
    `cluster.sessions.RemoteProvider`, on cluster nodes). `grader`: where the trusted
    judge runs (`--backend ray`: on cluster nodes); default `pool`. `generation`: where
    the policy samples, when not here (`--policy-servers N`: `(model, tokenizer) ->`
    a started `rollout.fleet.PolicyFleet`, given each version of the weights as
    the trainer makes it; the trainer keeps the model it updates)."""
    say: Progress = progress or (lambda event, record: None)
    t_start = time.monotonic()
    run, g = config.run, config.grpo

    # ---- setup (every check before anything is written) -------------------------------
    sets = run_task_sets(config)
    evals = sets.eval_tasks(config.eval.split, config.eval.tasks,
                            trained_on(config, sets)) if config.eval.tasks else None
    if evals is not None and not evals.tasks:
        raise UsageError(f"[eval] the {config.eval.split.value} split has no task left to "
                         f"measure ({evals.note}); give more tasks in that split")
    if config.policy.kind is PolicyKind.OPENAI:
        assert evals is not None  # TrainConfig requires [eval] tasks for a served model
        return await evaluate_served(config, evals, pool, say, t_start, grader)
    check_fits(config, sets, evals)
    pairs = sft_data(config, sets) if not run.resume and config.sft.steps else []
    device = resolve_device(run.device)
    run_id = os.path.basename(os.path.normpath(run.out_dir))
    use_journal = run.journal != "off"
    journal_file = journaled.journal_path(config)
    inputs = journaled.fingerprint(config)
    if use_journal:
        journaled.check_journal(journal_file, run_id, inputs, run.resume,
                                default_place=not run.journal)
    if run.threads:
        torch.set_num_threads(run.threads)
    ckpt = Checkpoint(run.out_dir)
    tok = ByteTokenizer()
    state = TrainState()
    model: Any
    if run.resume:
        state = ckpt.load_state()
        if state.step >= g.steps:
            raise UsageError(f"--resume: nothing to resume, the run in {run.out_dir} has "
                             f"done all {state.step} of its [grpo] steps; raise [grpo] "
                             "steps to train further, or drop --resume to start afresh")
        model, _ = load_model(ckpt.path)
    elif config.model.path:
        model, _ = load_model(config.model.path)
    else:
        model = build_model(config.model.shape, tok, seed=run.seed)
    model.to(device)
    os.makedirs(run.out_dir, exist_ok=True)  # every check passed: the first write
    log = MetricsLog(run.out_dir, append=run.resume,
                     keep_through=state.step if run.resume else None)
    if use_journal and not run.resume and not run.journal:
        journaled.remove_journal(journal_file)  # a fresh run replaces its directory's
    own_pool: CellPool | None = None
    if pool is None:
        from trialbox.judge.function import judge_pool_config
        pool = own_pool = await CellPool(judge_pool_config(
            warm=2 * config.rollout.env_workers)).start()
    result = TrainResult(run.out_dir, 0, None, None)
    fleet: Any = None
    try:
        # ---- supervised warm start (fresh runs only) -----------------------------------
        if pairs:
            stats = sft(model, tok, pairs, config.sft, device=device, progress=lambda s, loss:
                        say("sft", {"step": s, "steps": config.sft.steps, "loss": loss})
                        if s % 10 == 0 or s == config.sft.steps else None)
            result.sft_seconds = stats.seconds
            save_model(model, tok, os.path.join(run.out_dir, "sft"))
            log.write("sft", 0, {"loss": stats.final_loss, "seconds": stats.seconds,
                                 "steps": stats.steps})
        policy = HFPolicy(model, tok, seed=run.seed)
        if generation is not None:  # the policy servers, with the weights of now
            fleet = await generation(model, tok)
            await fleet.publish(model, state.step)
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

        if not run.resume and evals is not None:
            before = await evaluate_pass1(
                policy if fleet is None else fleet.policy(state.step, run.seed),
                config, pool, evals, grader)
            state = replace(state, pass_before=before["pass1"], eval_before=before)
            log.write("eval", 0, {"when": 0, **before})
            say("eval", {"when": "before", **before})
        if not run.resume:  # step 0: a crash from here on resumes (SFT and eval done)
            ckpt.save(model, tok, opt, state, head)
        result.pass_before = state.pass_before
        result.eval_before = state.eval_before

        # ---- GRPO ---------------------------------------------------------------------
        agent = agent_config(config)
        clock = ModelClock()  # when the model works; the rest of the time it waits
        asynchronous = config.rollout.mode is RolloutMode.ASYNC
        # async: one private copy of the weights per batch in flight (pipeline.py);
        # with policy servers each holds the versions in flight instead
        copies = WeightCopies(model, config.rollout.max_staleness + 1) \
            if asynchronous and fleet is None else None

        # Every episode is a task of the journaled scheduler (episodes.py): its quota
        # pool admits the environment's env_workers turns at once, the oldest step
        # first. The model is not sandbox capacity: one generate call or update at a
        # time on its one device, the oldest batch first (PrioritySlots, pipeline.py).
        # journal = "off": the previous path, the environment behind PrioritySlots too.
        model_slots = PrioritySlots(1)
        env_slots = PrioritySlots(config.rollout.env_workers)
        eps: journaled.JournaledEpisodes | None = None
        journal: Journal | None = None
        if use_journal:
            journal = Journal(journal_file)
            eps = journaled.JournaledEpisodes(
                journal, run_id, agent, pool, group_size=g.group_size,
                env_workers=config.rollout.env_workers,
                in_flight=config.rollout.max_staleness + 1 if asynchronous else 1,
                inputs=inputs, tasks_per_step=g.tasks_per_step, tokenizer=tok,
                grader=grader)
            await eps.__aenter__()

        def launch(step: int, version: int) -> Awaitable[RolloutBatch]:
            """Step `step`'s rollout, sampled by the live model (sync) or by a copy of
            its weights taken now (async; `version` is what the trainer published)."""
            def sample_with(sampler: Policy) -> Awaitable[RolloutBatch]:
                # on policy servers, generation does not take the trainer's device
                timed = TimedPolicy(sampler, clock, None if fleet is not None
                                    else model_slots.lane(step))
                if eps is not None:
                    return eps.rollout(step, sets.train_step(step), timed)
                return rollout(timed, sets.train_step(step),
                               group_size=g.group_size, pool=pool, config=agent,
                               env_slots=env_slots.lane(step), grader=grader)
            if fleet is not None:  # seeded as the local policy is: (seed, step)
                return sample_with(fleet.policy(version, run.seed * 1_000_003 + step))
            if copies is None:
                if eps is not None:  # a function of (seed, step): a resumed run draws
                    # as the uninterrupted one did from the step it resumes at
                    policy.generator.manual_seed(run.seed * 1_000_003 + step)
                return sample_with(policy)
            return copies.run_on_snapshot(model, lambda weights: sample_with(
                HFPolicy(weights, tok, seed=run.seed * 1_000_003 + step)))

        # the update, chosen once: GRPO (group advantages) or PPO (value head + GAE)
        history = [eps.step_trajectories(s, sets.train_step(s))
                   for s in range(state.step)] if eps is not None and run.resume \
            and g.replay and g.algorithm is Algorithm.GRPO else None
        update = make_update(config, model, opt, head=head, ref=ref, pad_id=tok.pad_id,
                             device=device, history=history)

        batches: Batches = AsyncBatches(
            launch, first=state.step, steps=g.steps,
            max_staleness=config.rollout.max_staleness) if asynchronous \
            else SyncBatches(launch)
        batches.start()
        clock.lap()
        try:
            while state.step < g.steps:
                step = state.step
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
                if fleet is not None:  # the servers hold version step + 1 first
                    await fleet.publish(model, step + 1)
                batches.publish(step + 1)  # async: launches batch step + 1 + K

                # log
                record = step_record(got, upd, t0=t0, t_rollout=t_rollout,
                                     t_update=t_update, lap=clock.lap(), ppo=head is not None)
                state = replace(state, step=step + 1)
                scalars = {k: float(record[k]) for k in ("pass_rate", "loss", "kl")
                           if isinstance(record[k], (int, float))
                           and math.isfinite(record[k])}
                telemetry.record_train_step(run_id, step + 1, reward_mean=record["reward"],
                                            **scalars)
                if upd.skipped:
                    state = replace(state, bad_in_a_row=state.bad_in_a_row + 1)
                    record["skipped"] = "non-finite loss"
                    log.write("skip", step + 1, record)
                    say("skip", {"step": step + 1, **record})
                    if state.bad_in_a_row >= g.max_bad_steps:
                        result.stopped = (f"{state.bad_in_a_row} steps in a row had a "
                                          "non-finite loss (max_bad_steps = "
                                          f"{g.max_bad_steps})")
                        say("stop", {"reason": result.stopped})
                        break
                else:
                    state = replace(state, bad_in_a_row=0)
                    log.write("step", step + 1, record)
                    say("step", {"step": step + 1, "steps": g.steps, **record})
                state = replace(state, history=(*state.history, StepSummary(
                    step + 1, record["reward"], record["pass_rate"], record["pass_turn1"])))

                # checkpoint (async: the batches in flight are not saved; see pipeline.py)
                if state.step % run.checkpoint_every == 0 or state.step == g.steps:
                    ckpt.save(model, tok, opt, state, head)
        finally:
            await batches.aclose()
            if eps is not None:
                await eps.__aexit__(None, None, None)
                say("episodes", {"journal": journal_file, "run": run_id,
                                 **asdict(eps.counts)})
            if journal is not None:
                journal.close()

        # ---- the end: held-out pass@1 again, the final model ---------------------------
        result.steps_done = state.step
        if evals is not None:
            final_seed = run.seed * 1_000_003 + g.steps + 999_983
            if eps is not None:
                policy.generator.manual_seed(final_seed)
            after = await evaluate_pass1(
                policy if fleet is None else fleet.policy(state.step, final_seed),
                config, pool, evals, grader)
            result.pass_after = after["pass1"]
            result.eval_after = after
            if result.eval_before is not None:
                result.rise = rise_ci(result.eval_before, after)
                after = {**after, "rise_ci95": list(result.rise)}
            log.write("eval", state.step, {"when": state.step, **after})
            say("eval", {"when": "after", **after})
        save_model(model, tok, os.path.join(run.out_dir, "final"))
        if head is not None:
            torch.save(head.state_dict(), os.path.join(run.out_dir, "final",
                                                       VALUE_HEAD_FILE))
        result.history = list(state.history)
        result.wall_s = time.monotonic() - t_start
        with open(os.path.join(run.out_dir, "config.json"), "w") as f:
            json.dump(asdict(config), f, default=str, indent=1)
        if fleet is not None:
            say("generation", {**fleet.status(), "on": await fleet.servers_info()})
    finally:
        log.close()
        if fleet is not None:
            await fleet.close()
        if own_pool is not None:
            await own_pool.close()
    return result
