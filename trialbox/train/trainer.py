"""The trainer: supervised warm start, then GRPO (or PPO: `[grpo] algorithm = "ppo"`)
over multi-turn episodes judged in real sandboxes. `train()` reads top to bottom, each
phase a function named for it (section comments set the plumbing apart):

    setup       prepare: [tasks] splits, [policy], every check before   tasksets.py
                anything is written; the model to start from
    warm start  warm_start (SFT, fresh runs only); build_learner:       sft.py
                the KL reference, PPO's value head, the optimizer       learner.py
    pass@1      HeldOut.before, on the [eval] split; step 0's checkpoint
    for each step:
      rollout     batches.get: the agent loop (generate ─► judge ─►     rollouts.py
                  feedback ─► …); async: rolled out ahead by weights    pipeline.py
                  at most max_staleness steps older
      advantages  rewards ─► group advantages (None = excluded,         losses.py
                  counted); PPO: values ─► GAE ─► whitened, in ppo_step ppo.py
      update      update_step: epochs of gradient accumulation over     update.py
                  micro-batches (NaN ─► step skipped); the update
                  function (advantages + update) chosen once, `make_update`
      log         step_record ─► log_step (metrics.jsonl, TensorBoard,  metrics.py
                  telemetry) ─► checkpoint                              runfiles.py
    the end     HeldOut.after: pass@1 again, the rise with its paired   confidence.py
                95% interval; save_final

With `[policy] kind = "openai"` the run only evaluates the served model (`evaluate_served`).

    result = asyncio.run(train(load_config("trialbox/train/demo.toml")))

A run directory holds `metrics.jsonl` (one line per step, plus `eval` and `sft` lines),
`tb/` (TensorBoard events), `checkpoint/` (model, optimizer, step, PPO's value head; `[run] resume =
true` continues from it) and `sft/` (the model after the warm start), `final/` (the trained model).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager, closing
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch

from trialbox import telemetry
from trialbox.errors import UsageError
from trialbox.judge.reward import RewardSpec
from trialbox.rollout.agent import AgentConfig, Grader, rollout
from trialbox.rollout.hf_policy import HFPolicy
from trialbox.rollout.openai_policy import OpenAIConfig, OpenAIPolicy
from trialbox.rollout.policy import ByteTokenizer, Policy
from trialbox.rollout.text import default_prompt
from trialbox.sandbox.base import SandboxProvider
from trialbox.sandbox.pool import CellPool
from trialbox.train import demo_tasks
from trialbox.train import episodes as journaled
from trialbox.train.confidence import paired_rise, wilson
from trialbox.train.config import Algorithm, PolicyKind, RewardKind, TrainConfig
from trialbox.train.learner import build_learner, save_final
from trialbox.train.losses import group_advantages, rewards_tensor
from trialbox.train.metrics import Progress, log_step, step_record
from trialbox.train.model import build_model, load_model, resolve_device, save_model
from trialbox.train.pipeline import ModelClock, PrioritySlots
from trialbox.train.ppo import ValueHead, ppo_step
from trialbox.train.replay import SuccessReplay
from trialbox.train.rollouts import PolicyServers, StepRollouts, sampling_seed
from trialbox.train.runfiles import Checkpoint, MetricsLog
from trialbox.train.sft import sft
from trialbox.train.tasksets import EvalTasks, TaskSets, sft_pair, task_sets
from trialbox.train.update import UpdateStats, policy_step
from trialbox.types import StepSummary, Task, TrainState, Trajectory

StartGeneration = Callable[[Any, ByteTokenizer], Awaitable[PolicyServers]]
"""(model, tokenizer) -> started policy servers (`rollouts.PolicyServers`:
`rollout.fleet.PolicyFleet`)."""


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
    async with judge_pool(config, pool) as pool:
        try:
            record = await evaluate_pass1(policy, config, pool, evals, grader)
            log.write("eval", 0, {"when": 0, "policy": p.model, **record})
            say("eval", {"when": "served", **record})
            write_config(config)
        finally:
            log.close()
            await policy.aclose()
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
    evals = eval_tasks(config, sets)
    if config.policy.kind is PolicyKind.OPENAI:
        assert evals is not None  # TrainConfig requires [eval] tasks for a served model
        return await evaluate_served(config, evals, pool, say, t_start, grader)
    start = prepare(config, sets, evals)
    state, model, tok, run_id = start.state, start.model, start.tok, start.run_id
    result = TrainResult(run.out_dir, 0, None, None)
    async with AsyncExitStack() as stack:  # closes, last first: servers, pool, log
        log = stack.enter_context(closing(open_run_dir(config, start)))  # the first write
        pool = await stack.enter_async_context(judge_pool(config, pool))

        # ---- supervised warm start (fresh runs only), the learner ----------------------
        if start.pairs:
            result.sft_seconds = warm_start(config, start, log, say)
        policy = HFPolicy(model, tok, seed=run.seed)
        fleet = await stack.enter_async_context(  # None: the policy samples here
            policy_servers(generation, model, tok, state.step))
        learner = build_learner(config, model, tok, start.device, start.ckpt)

        # ---- pass@1 before training, step 0's checkpoint (fresh runs only) -------------
        held_out = HeldOut(config, evals, pool, grader, policy, fleet, log, say) \
            if evals is not None else None
        if not run.resume:
            if held_out is not None:
                state = await held_out.before(state)
            learner.save(start.ckpt, state)  # a crash from here on resumes (SFT, eval done)
        result.pass_before, result.eval_before = state.pass_before, state.eval_before

        # ---- GRPO -----------------------------------------------------------------------
        clock = ModelClock()  # when the model works; the rest of the time it waits
        model_slots = PrioritySlots(1)  # the model: one generate call or update at a time
        async with StepRollouts(config, sets, agent_config(config), pool, grader,
                                model=model, tok=tok, policy=policy, fleet=fleet,
                                clock=clock, model_slots=model_slots,
                                journal_file=start.journal_file, run_id=run_id,
                                inputs=start.inputs, say=say) as rollouts:
            # the update, chosen once: GRPO (group advantages) or PPO (value head + GAE)
            update = make_update(config, model, learner.opt, head=learner.head,
                                 ref=learner.ref, pad_id=tok.pad_id, device=start.device,
                                 history=rollouts.read_back(state.step) if run.resume
                                 and g.replay and g.algorithm is Algorithm.GRPO else None)
            batches = rollouts.batches(first=state.step)
            clock.lap()
            while state.step < g.steps:
                step, t0 = state.step, time.monotonic()
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
                    # rewards -> advantages -> update epochs
                    upd, t_update = await update_step(update, got.batch.trajectories, step,
                                                      model_slots, clock, run_id)
                if fleet is not None:  # the servers hold version step + 1 first
                    await fleet.publish(model, step + 1)
                batches.publish(step + 1)  # async: launches batch step + 1 + K

                # log
                record = step_record(got, upd, t0=t0, t_rollout=t_rollout,
                                     t_update=t_update, lap=clock.lap(),
                                     ppo=learner.head is not None)
                state, result.stopped = log_step(state, record, skipped=upd.skipped,
                                                 log=log, say=say, run_id=run_id, g=g)
                if result.stopped:
                    break

                # checkpoint (async: the batches in flight are not saved; see pipeline.py)
                if state.step % run.checkpoint_every == 0 or state.step == g.steps:
                    learner.save(start.ckpt, state)

        # ---- the end: held-out pass@1 again, the final model ---------------------------
        result.steps_done = state.step
        if held_out is not None:
            await held_out.after(state, result, reseed=start.journal_file is not None)
        save_final(learner, run.out_dir)
        result.history, result.wall_s = list(state.history), time.monotonic() - t_start
        write_config(config)
        if fleet is not None:
            say("generation", {**fleet.status(), "on": await fleet.servers_info()})
    return result


# --------------------------------------------------------------------------- its phases
# In the order train() calls them.

@dataclass(frozen=True)
class Start:
    """Where a local run starts, decided by `prepare` before anything is written."""

    sets: TaskSets
    evals: EvalTasks | None
    pairs: list[tuple[str, str]]
    """The warm start's (context, completion) pairs (none: no warm start)."""
    device: torch.device
    run_id: str
    """The run directory's name: the run's name in the journal and the telemetry."""
    journal_file: str | None
    """The episodes' journal (None: [run] journal = "off")."""
    inputs: dict[str, Any]
    """What decides the run's episodes (`episodes.fingerprint`)."""
    ckpt: Checkpoint
    state: TrainState
    """Fresh, or the checkpoint's ([run] resume)."""
    model: Any
    tok: ByteTokenizer


def eval_tasks(config: TrainConfig, sets: TaskSets) -> EvalTasks | None:
    """[eval]'s tasks, none the run trains on (None: no evaluation); a UsageError when
    the split has none left."""
    if not config.eval.tasks:
        return None
    evals = sets.eval_tasks(config.eval.split, config.eval.tasks, trained_on(config, sets))
    if not evals.tasks:
        raise UsageError(f"[eval] the {config.eval.split.value} split has no task left to "
                         f"measure ({evals.note}); give more tasks in that split")
    return evals


def prepare(config: TrainConfig, sets: TaskSets, evals: EvalTasks | None) -> Start:
    """Every check a local run makes before it writes anything (the prompts fit, the
    warm start has data, the device exists, the journal may be written, a resumed run
    has steps left), and the model it starts from: the checkpoint's (resume), [model]
    path's, or a fresh one of [model]'s shape."""
    run = config.run
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
        if state.step >= config.grpo.steps:
            raise UsageError(f"--resume: nothing to resume, the run in {run.out_dir} has "
                             f"done all {state.step} of its [grpo] steps; raise [grpo] "
                             "steps to train further, or drop --resume to start afresh")
        model, _ = load_model(ckpt.path)
    elif config.model.path:
        model, _ = load_model(config.model.path)
    else:
        model = build_model(config.model.shape, tok, seed=run.seed)
    model.to(device)
    return Start(sets, evals, pairs, device, run_id, journal_file if use_journal else None,
                 inputs, ckpt, state, model, tok)


def open_run_dir(config: TrainConfig, start: Start) -> MetricsLog:
    """The run directory and its metrics log (a resumed run keeps its records through
    the checkpoint's step); a fresh run replaces its directory's journal."""
    run = config.run
    os.makedirs(run.out_dir, exist_ok=True)
    log = MetricsLog(run.out_dir, append=run.resume,
                     keep_through=start.state.step if run.resume else None)
    if start.journal_file is not None and not run.resume and not run.journal:
        journaled.remove_journal(start.journal_file)
    return log


@asynccontextmanager
async def judge_pool(config: TrainConfig,
                     pool: SandboxProvider | None) -> AsyncIterator[SandboxProvider]:
    """`pool`, or when none is given a namespace `CellPool` of the run's own, closed at
    the end."""
    if pool is not None:
        yield pool
        return
    from trialbox.judge.function import judge_pool_config
    own = await CellPool(judge_pool_config(warm=2 * config.rollout.env_workers)).start()
    try:
        yield own
    finally:
        await own.close()


def warm_start(config: TrainConfig, start: Start, log: MetricsLog, say: Progress) -> float:
    """Supervised fine-tuning on the warm start's pairs, the model after it saved to
    out_dir/sft; its seconds."""
    stats = sft(start.model, start.tok, start.pairs, config.sft, device=start.device,
                progress=lambda s, loss:
                say("sft", {"step": s, "steps": config.sft.steps, "loss": loss})
                if s % 10 == 0 or s == config.sft.steps else None)
    save_model(start.model, start.tok, os.path.join(config.run.out_dir, "sft"))
    log.write("sft", 0, {"loss": stats.final_loss, "seconds": stats.seconds,
                         "steps": stats.steps})
    return stats.seconds


@asynccontextmanager
async def policy_servers(generation: StartGeneration | None, model: Any,
                         tok: ByteTokenizer, version: int) -> AsyncIterator[PolicyServers | None]:
    """The policy servers `generation` starts (None: none), holding the weights of now
    as `version`; closed at the end."""
    if generation is None:
        yield None
        return
    fleet = await generation(model, tok)
    try:
        await fleet.publish(model, version)
        yield fleet
    finally:
        await fleet.close()


@dataclass(frozen=True)
class HeldOut:
    """pass@1 on [eval]'s tasks before and after training, sampled by the local policy
    or by the policy servers' version, and logged (metrics.jsonl, progress)."""

    config: TrainConfig
    evals: EvalTasks
    pool: SandboxProvider
    grader: Grader | None
    policy: HFPolicy
    fleet: PolicyServers | None
    log: MetricsLog
    say: Progress

    def sampler(self, version: int, seed: int) -> Policy:
        return self.policy if self.fleet is None else self.fleet.policy(version, seed)

    async def before(self, state: TrainState) -> TrainState:
        """pass@1 before training; the state that carries it (into checkpoints)."""
        before = await evaluate_pass1(self.sampler(state.step, self.config.run.seed),
                                      self.config, self.pool, self.evals, self.grader)
        self.log.write("eval", 0, {"when": 0, **before})
        self.say("eval", {"when": "before", **before})
        return replace(state, pass_before=before["pass1"], eval_before=before)

    async def after(self, state: TrainState, result: TrainResult, *, reseed: bool) -> None:
        """pass@1 after training and its paired rise over the one before, into
        `result`. It samples with a seed of its own, a function of [run] seed and [grpo]
        steps; `reseed` (a journaled run, which resumes exactly) puts the local policy
        on it, so a resumed run ends as the uninterrupted one did."""
        seed = sampling_seed(self.config.run.seed, self.config.grpo.steps) + 999_983
        if reseed:
            self.policy.generator.manual_seed(seed)
        after = await evaluate_pass1(self.sampler(state.step, seed), self.config,
                                     self.pool, self.evals, self.grader)
        result.pass_after = after["pass1"]
        result.eval_after = after
        if result.eval_before is not None:
            result.rise = rise_ci(result.eval_before, after)
            after = {**after, "rise_ci95": list(result.rise)}
        self.log.write("eval", state.step, {"when": state.step, **after})
        self.say("eval", {"when": "after", **after})


async def update_step(update: Update, trajs: list[Trajectory], step: int,
                      model_slots: PrioritySlots, clock: ModelClock,
                      run_id: str) -> tuple[UpdateStats, float]:
    """One step's update (rewards -> advantages -> update epochs with gradient
    accumulation) in a worker thread, so the event loop keeps driving the producer; it
    waits for the model (the oldest batch first). The update's stats and its seconds."""
    async with model_slots.lane(step):
        t1 = time.monotonic()
        with telemetry.train_step(run_id, step + 1, episodes=len(trajs)), clock.busy():
            upd = await asyncio.to_thread(update, trajs, step)
        return upd, time.monotonic() - t1


def write_config(config: TrainConfig) -> None:
    """out_dir/config.json: the run's whole configuration, as it ran."""
    with open(os.path.join(config.run.out_dir, "config.json"), "w") as f:
        json.dump(asdict(config), f, default=str, indent=1)
