"""The multi-turn agent loop: many episodes at once, one `generate` call per turn for all
the episodes waiting on the model, sandboxes leased only while code runs.

    batch = await rollout(policy, tasks, group_size=4, max_turns=3, pool=pool)
    for tr in batch.trajectories:          # token_ids, loss_mask, old_logprobs, reward
        ...
    batch.stats.gen_s, batch.stats.env_s   # time in the model vs in the environment

One episode, turn by turn:

    context ── Policy.generate ──► output ids (kept exactly; never re-tokenised)
       ▲        (no sandbox held)        │ extract the code (```python block, else raw)
       │                                 ▼
       │        ┌──────────── concurrently, under the environment slots ────────────┐
       │        │ run it in the episode's session   │ grade it with the trusted     │
       │        │ (leased through Leaser, parked    │ judge (hidden + visible tests,│
       │        │ again after the run)              │ its own fresh sandboxes)      │
       │        └───────────────────────────────────────────────────────────────────┘
       └── feedback ids ◄── compile/run errors, failing VISIBLE tests (truncated);
                            hidden tests are never named, shown or quoted

The episode stops when the judge passes the code, after `max_turns`, when the context
is full, or when the machinery fails (reward None: excluded, never 0.0). The reward is
the judge's grade of the last turn's code, minus `turn_penalty` per extra turn.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field, replace
from typing import Any

from trialbox import telemetry
from trialbox.errors import InfraError, NodeLost, SandboxUnavailable, UsageError
from trialbox.judge.answer import read_code
from trialbox.judge.function import JudgeConfig, open_harness
from trialbox.judge.grade import grade
from trialbox.judge.reward import RewardSpec, reward
from trialbox.judge.seeds import FINAL, ends_episode, seed_of, turn_grade
from trialbox.judge.stdio import StdioJudgeConfig
from trialbox.rollout.policy import Generation, Policy
from trialbox.rollout.prepare import GroupLeaser, Prepare, prepare_groups
from trialbox.rollout.text import (
    default_prompt,
    exec_summary,
    feedback_report,
    wrap_feedback,
)
from trialbox.sandbox.base import Sandbox, SandboxProvider
from trialbox.sandbox.languages import language, run_code
from trialbox.sandbox.mounts import PathObstructed
from trialbox.schedule.lease import DirectLeaser, Leaser
from trialbox.types import (
    ExecResult,
    ExecStatus,
    Grade,
    Limits,
    Outcome,
    Task,
    TaskKind,
    Trajectory,
    Turn,
)


@dataclass(frozen=True)
class AgentConfig:
    """How episodes are run. Cross-field checks in `__post_init__` say what to change."""

    max_turns: int = 3
    """Model turns per episode at most (the episode stops earlier when the code passes)."""
    max_new_tokens: int = 256
    """Tokens one turn may generate."""
    temperature: float = 1.0
    """Sampling temperature (0: greedy)."""
    stop: tuple[str, ...] = ()
    """Stop strings (besides the EOS id); empty: stop only at EOS or `max_new_tokens`."""
    max_context_tokens: int = 4096
    """Prompt + every turn's output and feedback; an episode that fills it stops."""
    turn_penalty: float = 0.0
    """Subtracted from the reward per turn after the first (0: no penalty)."""
    reward_spec: RewardSpec = field(default_factory=RewardSpec)
    """How the judge's grade becomes a reward (binary by default)."""
    language: str = "python"
    """Language of stdio tasks' programs (function tasks are Python)."""
    execute: bool = True
    """Also run the code in the episode's own session (its stderr becomes feedback).
    False: the judge alone decides and informs (one sandbox run fewer per turn)."""
    exec_limits: Limits = field(default_factory=lambda: Limits(
        wall_s=5, cpu_s=5, memory_mb=256, disk_mb=32, pids=32))
    """Limits of the run in the episode's own session (the judge has its own)."""
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    """Function-task judging (limits, timeouts, infra retries)."""
    stdio_judge: StdioJudgeConfig = field(default_factory=StdioJudgeConfig)
    """Stdio-task judging."""
    max_concurrent_env: int = 4
    """Turns being executed and judged at once (each uses 2–3 sandboxes)."""
    max_batch: int | None = None
    """Prompts per `generate` call at most (None: every episode waiting)."""
    batch_wait_s: float | None = None
    """How long a waiting prompt may wait for others before a partial batch is sent.
    None: wait until every live episode is waiting (the biggest batches: right for a
    local model, whose cost barely grows with the batch); a small number suits a
    server with continuous batching (vLLM)."""
    feedback_chars: int = 1200
    """Feedback text per turn at most (long tracebacks are cut in the middle)."""
    render_prompt: Callable[[Task], str] | None = None
    """Task → first prompt text (default: `default_prompt`). Must not show hidden tests."""
    render_feedback: Callable[[str], str] | None = None
    """Feedback report → the text appended to the context (default: `wrap_feedback`);
    the report itself (`feedback_report`) never contains hidden tests."""
    prepare: Prepare | None = None
    """`async (task, session)`: set-up `rollout()` runs once per task in a session of
    `prepare_limits` and snapshots; every episode of the task's group then starts from a
    fork of it (rollout/prepare.py; a tier without snapshots runs it per episode)."""
    prepare_limits: Limits = field(default_factory=lambda: Limits(
        wall_s=120, cpu_s=120, memory_mb=1024, disk_mb=256, pids=64))
    """The set-up session's limits (the episodes' forks get `exec_limits`; their
    `disk_mb` bounds what each writes on top of the prepared state)."""

    def __post_init__(self) -> None:
        def positive_int(name: str) -> None:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise UsageError(f"AgentConfig.{name} must be an int >= 1, got {v!r}")

        for name in ("max_turns", "max_new_tokens", "max_context_tokens",
                     "max_concurrent_env", "feedback_chars"):
            positive_int(name)
        if self.max_batch is not None:
            positive_int("max_batch")
        if self.max_new_tokens >= self.max_context_tokens:
            raise UsageError(f"AgentConfig.max_new_tokens ({self.max_new_tokens}) must be "
                             f"below max_context_tokens ({self.max_context_tokens}); raise "
                             "max_context_tokens or lower max_new_tokens")
        if not 0 <= self.temperature < 100:
            raise UsageError(f"AgentConfig.temperature must be in [0, 100), got "
                             f"{self.temperature!r}")
        if not 0 <= self.turn_penalty <= 1:
            raise UsageError(f"AgentConfig.turn_penalty must be in [0, 1], got "
                             f"{self.turn_penalty!r}")
        if self.batch_wait_s is not None and not self.batch_wait_s >= 0:
            raise UsageError(f"AgentConfig.batch_wait_s must be None or >= 0, got "
                             f"{self.batch_wait_s!r}")
        if not all(isinstance(s, str) and s for s in self.stop):
            raise UsageError("AgentConfig.stop must be a tuple of non-empty strings")
        language(self.language)  # UnknownLanguage (a UsageError) lists the choices
        if self.prepare is not None and not callable(self.prepare):
            raise UsageError(f"AgentConfig.prepare must be an async function (task, "
                             f"session) or None, got {type(self.prepare).__name__}")
        if not isinstance(self.prepare_limits, Limits):
            raise UsageError(f"AgentConfig.prepare_limits must be a trialbox.types.Limits, "
                             f"got {type(self.prepare_limits).__name__}")


# --------------------------------------------------------------------------- results

@dataclass
class RolloutStats:
    """Where a rollout's time went."""

    episodes: int = 0
    turns: int = 0
    passed: int = 0
    excluded: int = 0
    """Episodes with reward None (infrastructure or the task's own tests failed)."""
    gen_calls: int = 0
    batch_sizes: list[int] = field(default_factory=list)
    gen_s: float = 0.0
    """Wall time inside `Policy.generate` (calls do not overlap)."""
    env_s: float = 0.0
    """Sum over turns of the time executing and judging (turns overlap, so this can
    exceed the wall time)."""
    env_wall_s: float = 0.0
    """Wall time during which at least one turn was executing or being judged."""
    wall_s: float = 0.0
    model_tokens: int = 0
    """Tokens generated (the loss-masked ones)."""

    def to_json(self) -> dict[str, Any]:
        return {"episodes": self.episodes, "turns": self.turns, "passed": self.passed,
                "excluded": self.excluded, "gen_calls": self.gen_calls,
                "mean_batch": (sum(self.batch_sizes) / len(self.batch_sizes)
                               if self.batch_sizes else 0.0),
                "gen_s": round(self.gen_s, 4), "env_s": round(self.env_s, 4),
                "env_wall_s": round(self.env_wall_s, 4), "wall_s": round(self.wall_s, 4),
                "model_tokens": self.model_tokens}


@dataclass
class RolloutBatch:
    """The trajectories, task by task (a task's `group_size` samples side by side)."""

    trajectories: list[Trajectory]
    stats: RolloutStats


# --------------------------------------------------------------------------- batching

class _Batcher:
    """Collects the prompts of episodes waiting on the model and sends them in one
    `generate` call: when every live episode is waiting (default), when `max_batch`
    prompts wait, or `batch_wait_s` after the first one arrived. Calls never overlap
    (a local model has one device; a server batches on its side anyway).

    A batch goes out in the episodes' own order (their index in the rollout), not in the
    order their judgements came back: a sampler that draws for the batch's rows from one
    random stream then gives each episode the same draws whatever the sandboxes' timing,
    so with the default batching a seeded run repeats itself exactly."""

    def __init__(self, policy: Policy, cfg: AgentConfig, live: int, stats: RolloutStats):
        self.policy, self.cfg, self.live, self.stats = policy, cfg, live, stats
        self.waiting: list[tuple[list[int], float, asyncio.Future[tuple[Generation,
                                                                         float]], int]] = []
        self._wake = asyncio.Event()

    async def generate(self, context: list[int], order: int = 0) -> tuple[Generation, float]:
        """This episode's next generation and the wall time of the call it rode in;
        `order`: the episode's place in its batch (see the class docstring)."""
        fut: asyncio.Future[tuple[Generation, float]] = \
            asyncio.get_running_loop().create_future()
        entry = (context, time.monotonic(), fut, order)
        self.waiting.append(entry)
        self._wake.set()
        try:
            return await fut
        except asyncio.CancelledError:  # preempted or stopped: it no longer waits
            if entry in self.waiting:
                self.waiting.remove(entry)
            raise

    def join(self) -> None:
        """One more live episode (an episode started on its own, e.g. a scheduler job):
        full batches wait for it too."""
        self.live += 1
        self._wake.set()

    def finished(self) -> None:
        """An episode is over: it will not ask again."""
        self.live -= 1
        self._wake.set()

    def _full(self) -> bool:
        # a waiter cancelled this tick has a cancelled future before it leaves the list
        self.waiting = [w for w in self.waiting if not w[2].done()]
        n = len(self.waiting)
        return n >= self.live or (self.cfg.max_batch is not None and n >= self.cfg.max_batch)

    async def run(self) -> None:
        """Until every episode is over; one made with `live=0` (episodes `join` as they
        start, e.g. scheduler jobs) runs until cancelled."""
        open_ended = self.live == 0
        while open_ended or self.live > 0 or self.waiting:
            timeout: float | None = None
            if self.waiting:
                if self._full():
                    await self._send()
                    continue
                if self.cfg.batch_wait_s is not None:
                    timeout = self.waiting[0][1] + self.cfg.batch_wait_s - time.monotonic()
                    if timeout <= 0:
                        await self._send()
                        continue
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), timeout)
            except TimeoutError:
                pass

    async def _send(self) -> None:
        n = len(self.waiting) if self.cfg.max_batch is None \
            else min(len(self.waiting), self.cfg.max_batch)
        batch, self.waiting = self.waiting[:n], self.waiting[n:]
        batch.sort(key=lambda w: w[3])  # episode order, not arrival order
        t0 = time.monotonic()
        try:
            with telemetry.model_output(**{"batch.size": n}) as sp:
                gens = await self.policy.generate(
                    [ctx for ctx, _, _, _ in batch], max_new_tokens=self.cfg.max_new_tokens,
                    temperature=self.cfg.temperature, stop=list(self.cfg.stop) or None)
                if len(gens) != len(batch):
                    raise InfraError(f"the policy returned {len(gens)} generations for "
                                     f"{len(batch)} prompts")
                if sp is not None:
                    sp.set_attribute("tokens", sum(len(g.token_ids) for g in gens))
        except BaseException as e:
            for _, _, fut, _ in batch:
                if not fut.done():
                    fut.set_exception(e)
            if not isinstance(e, Exception):
                raise
            return
        dt = time.monotonic() - t0
        self.stats.gen_calls += 1
        self.stats.batch_sizes.append(n)
        self.stats.gen_s += dt
        for (_, _, fut, _), gen in zip(batch, gens, strict=True):
            if not fut.done():
                fut.set_result((gen, dt))


def _fit(gen: Generation, room: int, decode: Callable[[Sequence[int]], str]) -> Generation:
    """The generation cut to `room` tokens (the context's free space): a prefix of the
    exact ids and their log-probs, the text decoded from that prefix."""
    if len(gen.token_ids) <= room:
        return gen
    ids = gen.token_ids[:room]
    return Generation(decode(ids), ids, gen.logprobs[:room], "length")


# --------------------------------------------------------------------------- episodes

class _EnvBusy:
    """Counts the wall time during which at least one turn is in the environment."""

    def __init__(self, stats: RolloutStats):
        self.stats, self.inside, self.since = stats, 0, 0.0

    def enter(self) -> None:
        if self.inside == 0:
            self.since = time.monotonic()
        self.inside += 1

    def leave(self) -> None:
        self.inside -= 1
        if self.inside == 0:
            self.stats.env_wall_s += time.monotonic() - self.since


Grader = Callable[[Task, str, "int | None"], Awaitable[Grade]]
"""(task, completion, seed) -> the trusted judge's grade of that completion, its tests'
`random` seeded with `seed` (None: the judge derives the final-domain seed itself;
judge/seeds.py)."""

EnvSlot = Callable[[str], AbstractAsyncContextManager[Any]]
"""episode id -> the admission of one turn's environment work (its run and its grading):
a shared semaphore for a plain rollout, the scheduler's quota reservation
(`SchedulerLeaser.slot`) for episodes that are scheduler tasks."""


@dataclass
class _Env:
    """What every episode of one rollout shares."""

    cfg: AgentConfig
    provider: SandboxProvider
    leaser: Leaser
    batcher: _Batcher
    slot: EnvSlot
    grader: Grader | None
    harnesses: list[Sandbox]
    busy: _EnvBusy
    policy: Policy
    lost: set[str] = field(default_factory=set)
    """Episodes whose session went with its cluster node (NodeLost): proven
    infrastructure, so no control session is asked (it would open on another node)."""


async def _run_in_session(env: _Env, episode_id: str, task: Task,
                          code: str) -> ExecResult:
    """Run the code in the episode's own session, leased only for the run. Function
    tasks: the prompt plus the code as solution.py (catches syntax errors and crashes at
    import); stdio tasks: the program on the first visible test's input. A session that
    cannot be had is an INFRA result for this episode, not an error for the rollout."""
    try:
        async with env.leaser.lease(episode_id, env.cfg.exec_limits) as sb:
            if task.kind is TaskKind.FUNCTION:
                return await _exec_file(sb, "solution.py", _solution(task, code), env.cfg)
            stdin = task.visible_tests[0].stdin if task.visible_tests else b""
            return await run_code(sb, code, env.cfg.language, stdin=stdin,
                                  limits=env.cfg.exec_limits)
    except NodeLost as e:
        env.lost.add(episode_id)
        return ExecResult(ExecStatus.INFRA, message=f"the episode's sandbox: {e}")
    except InfraError as e:
        return ExecResult(ExecStatus.INFRA, message=f"the episode's sandbox: {e}")


async def _exec_file(sb: Sandbox, path: str, source: str, cfg: AgentConfig) -> ExecResult:
    try:
        await sb.write_file(path, source.encode("utf-8", errors="surrogateescape"))
    except UsageError as e:  # too large for the workspace, or an earlier turn made
        # solution.py a directory: the candidate's doing either way
        status = ExecStatus.EXIT if isinstance(e, PathObstructed) else ExecStatus.DISK
        return ExecResult(status, message=str(e))
    return await sb.exec(["python3", path], limits=cfg.exec_limits)


async def _session_control(env: _Env, episode_id: str) -> bool:
    """The control for an episode whose own session run ended `infra`: a fresh session
    from the same leaser and limits runs `python3 -c pass`. True: the machinery works
    (so the failure was the episode's own doing); False: it does not (excluded)."""
    control = f"{episode_id}/control"
    try:
        async with env.leaser.lease(control, env.cfg.exec_limits) as sb:
            r = await sb.exec(["python3", "-c", "pass"], limits=env.cfg.exec_limits)
        return r.status is ExecStatus.OK
    except InfraError:
        return False
    finally:
        await env.leaser.end(control)


def _solution(task: Task, code: str) -> str:
    """What the judge runs for a function task: the prompt plus the completion. A whole
    function (from a fenced block) is appended after the prompt and redefines it; a
    raw completion continues the prompt's last line."""
    return task.prompt + code


def _completion(code: str, code_from: str) -> str:
    return ("\n" + code) if code_from == "fenced" else code


async def _judge(env: _Env, task: Task, completion: str, seed: int | None) -> Grade:
    """The trusted judge's grade, its tests' random draws seeded with `seed`
    (judge/seeds.py). The judges retry infrastructure failures they see in results; one
    raised as an exception (a sandbox that cannot be had) is INFRA too."""
    try:
        if env.grader is not None:
            return await env.grader(task, completion, seed)
        if task.kind is TaskKind.STDIO:
            return await grade(task, completion, env.provider,
                               stdio_config=env.cfg.stdio_judge, language=env.cfg.language)
        harness = env.harnesses.pop() if env.harnesses else \
            await open_harness(env.provider, env.cfg.judge)
        try:
            return await grade(task, completion, env.provider, config=env.cfg.judge,
                               harness=harness, seed=seed)
        finally:
            env.harnesses.append(harness)
    except SandboxUnavailable:
        raise  # a tier this node does not offer: the configuration's problem (grade.py)
    except InfraError as e:
        return Grade(task.task_id, Outcome.INFRA, message=f"the judge's sandbox: {e}")


async def _environment(env: _Env, episode_id: str, task: Task, code: str | None,
                       code_from: str, last: bool) -> tuple[ExecResult | None, Grade | None]:
    """Run and grade one turn's code, concurrently, within the environment slots. A
    turn without code is not run; it is graded (as the empty completion) only when it
    is the last, so the reward still comes from the judge. The last turn is graded in
    the final domain (its grade is the reward whatever it says), the others in the
    turn domain (judge/seeds.py)."""
    if code is None and not last:
        return None, None
    async with env.slot(episode_id):
        env.busy.enter()
        try:
            if code is None:
                return None, await _judge(env, task, "", seed_of(task, "", FINAL))
            completion = _completion(code, code_from)
            if not env.cfg.execute:
                return None, await _final(env, task, completion, last)
            run, grade = await asyncio.gather(_run_in_session(env, episode_id, task, code),
                                              _final(env, task, completion, last))
            return run, grade
        finally:
            env.busy.leave()


async def _final(env: _Env, task: Task, completion: str, last: bool) -> Grade:
    """A turn's grade, in the turn or final domain (`seeds.turn_grade`)."""
    return await turn_grade(lambda seed: _judge(env, task, completion, seed), task,
                            completion, last=last)


async def _episode(env: _Env, task: Task, prompt_ids: tuple[int, ...], episode_id: str,
                   group_id: str, order: int = 0) -> Trajectory:
    """One episode under an `episode` span (its sandbox and judge spans nest under it;
    the batched `model.generate` spans belong to the rollout, not to one episode)."""
    with telemetry.episode(episode_id, **{"task.id": task.task_id}) as sp:
        tr = await _episode_body(env, task, prompt_ids, episode_id, group_id, order)
        if sp is not None:
            sp.set_attribute("episode.turns", len(tr.turns))
            sp.set_attribute("episode.stop", tr.stop_reason)
            sp.set_attribute("episode.excluded", tr.reward is None)
            if tr.reward is not None:
                sp.set_attribute("episode.reward", tr.reward)
        return tr


async def _episode_body(env: _Env, task: Task, prompt_ids: tuple[int, ...],
                        episode_id: str, group_id: str, order: int = 0) -> Trajectory:
    cfg, tok = env.cfg, env.policy.tokenizer
    context = list(prompt_ids)
    turns: list[Turn] = []
    grade: Grade | None = None
    stop_reason = "max_turns"
    try:
        for k in range(cfg.max_turns):
            room = cfg.max_context_tokens - len(context)
            if room < 1:
                stop_reason = "context"
                break
            gen, gen_s = await env.batcher.generate(context, order)
            gen = _fit(gen, room, tok.decode)
            context += gen.token_ids
            code, code_from = read_code(task, gen.text, language=env.cfg.language)
            t0 = time.monotonic()
            run, g = await _environment(env, episode_id, task, code, code_from,
                                        last=k == cfg.max_turns - 1)
            env_s = time.monotonic() - t0
            grade = g or grade
            infra = run is not None and run.status is ExecStatus.INFRA
            if (infra and g is not None and not g.passed and episode_id not in env.lost
                    and g.outcome not in (Outcome.INFRA, Outcome.ERROR)
                    and await _session_control(env, episode_id)):
                # The trusted judge graded this very code, and a fresh session from the
                # same leaser runs a known-good program: the machinery works, so the
                # episode's broken session is the candidate's own doing (DESIGN.md
                # decision 1: an infrastructure failure is proven, never assumed). The
                # judge's grade ends the episode; no exclusion. (A session lost with its
                # cluster node is proven already: no control, excluded below.)
                stop_reason = "session_broken"
            elif g is not None and ends_episode(g):
                stop_reason = "passed"  # the judge's word stands, whatever the run
            elif infra or (g is not None and g.outcome is Outcome.INFRA):
                # The judge or the episode's own session failed: its feedback would be
                # about the machinery, not the code. Excluded (reward None).
                stop_reason = "infra"
            elif g is not None and g.outcome is Outcome.ERROR:
                stop_reason = "task_error"
            elif k == cfg.max_turns - 1:
                stop_reason = "max_turns"
            else:
                stop_reason = ""
            fb_text = ""
            fb_ids: tuple[int, ...] = ()
            if not stop_reason:
                fb_text = (cfg.render_feedback or wrap_feedback)(
                    feedback_report(task, code, run, g, cfg.feedback_chars))
                fb_ids = tuple(tok.encode(fb_text))
                if len(context) + len(fb_ids) >= cfg.max_context_tokens:
                    # No room to answer the feedback: end here, graded on this code.
                    fb_text, fb_ids, stop_reason = "", (), "context"
                    if g is None:
                        _, grade = await _environment(env, episode_id, task, None, "",
                                                      last=True)
            turns.append(Turn(
                output_text=gen.text, output_ids=gen.token_ids, logprobs=gen.logprobs,
                code=code, code_from=code_from,
                exec_status=run.status if run is not None else None,
                exec_summary=exec_summary(run), outcome=g.outcome if g else None,
                feedback_text=fb_text, feedback_ids=fb_ids,
                finish_reason=gen.finish_reason, gen_s=gen_s, env_s=env_s))
            context += fb_ids
            if stop_reason:
                break
    finally:
        env.batcher.finished()
        env.lost.discard(episode_id)
        await env.leaser.end(episode_id)
    return _trajectory(task, episode_id, group_id, prompt_ids, turns, grade, stop_reason,
                       cfg, _environment_id(env.provider))


def _environment_id(pool: Any) -> str:
    """The pool's `Runtime.id` (its image's content hash), "" for a pool without one."""
    runtime = getattr(pool, "runtime", None)
    return str(getattr(runtime, "id", "") or "")


def _trajectory(task: Task, episode_id: str, group_id: str, prompt_ids: tuple[int, ...],
                turns: list[Turn], grade: Grade | None, stop_reason: str,
                cfg: AgentConfig, environment: str = "") -> Trajectory:
    """Assemble token_ids / loss_mask / old_logprobs from the turns, and the reward."""
    ids, mask, logp = list(prompt_ids), [0] * len(prompt_ids), [0.0] * len(prompt_ids)
    for t in turns:
        ids += t.output_ids
        mask += [1] * len(t.output_ids)
        logp += t.logprobs
        ids += t.feedback_ids
        mask += [0] * len(t.feedback_ids)
        logp += [0.0] * len(t.feedback_ids)
    r: float | None
    if stop_reason == "infra" or grade is None:
        r = None  # the machinery failed (or nothing was graded): excluded, never 0.0
    else:
        r = reward(grade, cfg.reward_spec)
        if r is not None and len(turns) > 1:
            r -= cfg.turn_penalty * (len(turns) - 1)
    return Trajectory(
        task_id=task.task_id, episode_id=episode_id, prompt_ids=prompt_ids,
        turns=tuple(turns), token_ids=tuple(ids), loss_mask=tuple(mask),
        old_logprobs=tuple(logp), reward=r, grade=grade,
        passed=grade is not None and grade.passed and stop_reason == "passed",
        group_id=group_id, stop_reason=stop_reason,
        gen_s=sum(t.gen_s for t in turns), env_s=sum(t.env_s for t in turns),
        environment=environment)


# --------------------------------------------------------------------------- rollout

def check_tasks(tasks: Sequence[Task]) -> None:
    """UsageError unless every task has an agent loop (function tasks with an entry
    point, stdio tasks)."""
    if isinstance(tasks, Task) or not all(isinstance(t, Task) for t in tasks):
        raise UsageError("rollout: tasks must be a sequence of trialbox.types.Task")
    for t in tasks:
        if t.kind not in (TaskKind.FUNCTION, TaskKind.STDIO):
            raise UsageError(f"rollout: task {t.task_id} is a {t.kind.value} task; only "
                             "function and stdio tasks have an agent loop so far")
        if t.kind is TaskKind.FUNCTION and not t.entry_point:
            raise UsageError(f"rollout: function task {t.task_id} has no entry_point")


class Episodes:
    """Episodes that share one policy (their `generate` calls coalesced into batches),
    one sandbox provider, one judge and one admission of environment work: what
    `rollout()` runs a whole batch on, and what a scheduler job runs one episode on.

        async with Episodes(policy, cfg, provider, leaser=sched.leaser,
                            env_slot=sched.leaser.slot) as episodes:
            async def job(ctx):                      # one scheduler task = one episode
                tr = await episodes.run(task, ctx.task_id, group_id, order=k)
                ...

    Episodes may start at any time (`run` joins the batcher: a full batch waits for
    every episode that is live and not in the environment). `provider`: where sessions
    come from (`SandboxProvider`: the namespace tier's `CellPool`, `FakeProvider`, ...);
    `leaser`: who lends the episodes their sessions (default: a `DirectLeaser` on
    `provider.open`, closed at the end); `env_slot`: the admission of one turn's run and
    grading, per episode id (default: one semaphore of `max_concurrent_env`);
    `grader`: the trusted judge (default: `judge.grade.grade` on `provider`, which picks
    the judge by the task's kind)."""

    def __init__(self, policy: Policy, config: AgentConfig, provider: SandboxProvider, *,
                 leaser: Leaser | None = None, env_slot: EnvSlot | None = None,
                 grader: Grader | None = None, live: int = 0):
        if not isinstance(provider, SandboxProvider):
            raise UsageError(f"rollout: pool must be a SandboxProvider (CellPool, "
                             f"FakeProvider, ...), got {type(provider).__name__}")
        self.cfg, self.policy, self.provider = config, policy, provider
        self.stats = RolloutStats()
        self.own_leaser = leaser is None
        if env_slot is None:
            sem = asyncio.Semaphore(config.max_concurrent_env)
            env_slot = lambda episode: sem  # noqa: E731
        self.env = _Env(config, provider, leaser or DirectLeaser(provider.open),
                        _Batcher(policy, config, live, self.stats), env_slot, grader, [],
                        _EnvBusy(self.stats), policy)
        self._batcher: asyncio.Future[None] | None = None

    def prompt_ids(self, task: Task) -> tuple[int, ...]:
        """The first prompt's ids; UsageError when it does not fit the context."""
        p = tuple(self.policy.tokenizer.encode((self.cfg.render_prompt or default_prompt)(
            task)))
        if not p or len(p) >= self.cfg.max_context_tokens:
            raise UsageError(f"rollout: the prompt of task {task.task_id} is {len(p)} "
                             f"tokens; it must be between 1 and max_context_tokens - 1 "
                             f"({self.cfg.max_context_tokens - 1}): raise "
                             "max_context_tokens or shorten the prompt")
        return p

    async def __aenter__(self) -> Episodes:
        self._batcher = asyncio.ensure_future(self.env.batcher.run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop the batcher, close the judge's harnesses and (if it is ours) the leaser."""
        if self._batcher is not None:
            self._batcher.cancel()
            try:
                await self._batcher
            except asyncio.CancelledError:
                pass
            self._batcher = None
        harnesses, self.env.harnesses = self.env.harnesses, []
        for h in harnesses:
            await h.close()
        if self.own_leaser and isinstance(self.env.leaser, DirectLeaser):
            await self.env.leaser.close()

    async def run(self, task: Task, episode_id: str, group_id: str, order: int = 0,
                  prompt_ids: tuple[int, ...] | None = None,
                  joined: bool = False) -> Trajectory:
        """One episode of `task` (its session leased as `episode_id`). `order`: its place
        in a batch (batches go out in this order: a seeded sampler then gives each episode
        the same draws whatever the sandboxes' timing). `joined`: already counted live."""
        if not joined:
            self.env.batcher.join()
        return await _episode(self.env, task, prompt_ids or self.prompt_ids(task),
                              episode_id, group_id, order)


    def replay(self, tr: Trajectory, order: int) -> asyncio.Future[int]:
        """Feed a finished episode's recorded contexts through the batcher again, turn by
        turn, with no environment (its trajectory stands as recorded): the model's
        batches are then made of the same rows, in the same order, as when it ran — what
        a resumed run needs for the episodes it does run again to be sampled exactly as
        the uninterrupted run sampled them. Joins the batcher now; the future gives how
        many turns the model regenerated differently from the record (0 when the
        computation is deterministic)."""
        env = self.env
        env.batcher.join()

        async def ghost() -> int:
            differ = 0
            try:
                context = list(tr.prompt_ids)
                for t in tr.turns:
                    gen, _ = await env.batcher.generate(list(context), order)
                    gen = _fit(gen, self.cfg.max_context_tokens - len(context),
                               self.policy.tokenizer.decode)
                    differ += gen.token_ids != t.output_ids
                    context += t.output_ids + t.feedback_ids
            finally:
                env.batcher.finished()
            return differ
        return asyncio.ensure_future(ghost())


async def rollout(policy: Policy, tasks: Sequence[Task], *, group_size: int = 1,
                  max_turns: int | None = None, config: AgentConfig | None = None,
                  pool: SandboxProvider | None = None,
                  leaser: Leaser | None = None,
                  env_slots: AbstractAsyncContextManager[Any] | None = None,
                  grader: Grader | None = None) -> RolloutBatch:
    """Run `group_size` episodes of every task concurrently; return their trajectories
    (task by task, a group's samples side by side) and where the time went.

    `pool`: the `SandboxProvider` sessions come from (default: the process's
    `CellPool`). `leaser`: who lends the episodes their sessions (default: a
    `DirectLeaser` on `pool.open`, closed at the end; with `AgentConfig.prepare`, forks
    of each task's prepared snapshot). `grader`: the trusted judge
    (default: `judge.grade.grade` on `pool`). `max_turns` overrides the
    config's. `env_slots`: the environment slots (`async with` around each turn's run and
    grading), when they are shared with other rollouts running at the same time;
    default: a fresh semaphore of `max_concurrent_env`. An `InfraError` from the policy
    (a dead model server) ends the rollout after every episode has released its sandbox;
    per-episode infrastructure failures do not: those episodes get reward None."""
    cfg = config or AgentConfig()
    if max_turns is not None:
        cfg = replace(cfg, max_turns=max_turns)
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise UsageError(f"rollout: group_size must be an int >= 1, got {group_size!r}")
    check_tasks(tasks)
    if cfg.prepare is not None and leaser is not None:
        raise UsageError("rollout: AgentConfig.prepare makes the episodes' leaser (forks "
                         "of each task's prepared snapshot); give prepare or a leaser, "
                         "not both")
    if pool is None:
        from trialbox.sandbox import default_pool
        pool = await default_pool()
    tag = uuid.uuid4().hex[:8]
    groups = [f"{task.task_id}/{tag}/{i}" for i, task in enumerate(tasks)]
    prepared: GroupLeaser | None = None
    if cfg.prepare is not None:  # once per task: each group starts from its snapshot
        prepared = await prepare_groups(pool, list(zip(groups, tasks, strict=True)),
                                        cfg.prepare, cfg.prepare_limits)
        leaser = prepared
    try:
        return await _rollout(policy, tasks, groups, group_size, cfg, pool, leaser,
                              env_slots, grader)
    finally:
        if prepared is not None:
            await prepared.close()


async def _rollout(policy: Policy, tasks: Sequence[Task], groups: list[str],
                   group_size: int, cfg: AgentConfig, pool: SandboxProvider,
                   leaser: Leaser | None, env_slots: AbstractAsyncContextManager[Any] | None,
                   grader: Grader | None) -> RolloutBatch:
    shared = env_slots
    episodes = Episodes(policy, cfg, pool, leaser=leaser, grader=grader,
                        env_slot=None if shared is None else (lambda episode: shared),
                        live=len(tasks) * group_size)
    prompts = [episodes.prompt_ids(t) for t in tasks]
    stats = episodes.stats
    stats.episodes = len(tasks) * group_size
    t0 = time.monotonic()
    async with episodes:
        results = await asyncio.gather(*(
            episodes.run(task, f"{groups[i]}/{j}", groups[i],
                         order=i * group_size + j, prompt_ids=prompts[i], joined=True)
            for i, task in enumerate(tasks) for j in range(group_size)),
            return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        raise errors[0]
    trajectories = [r for r in results if isinstance(r, Trajectory)]
    finish_stats(stats, trajectories, time.monotonic() - t0)
    return RolloutBatch(trajectories, stats)


def finish_stats(stats: RolloutStats, trajectories: Sequence[Trajectory],
                 wall_s: float) -> None:
    """The per-trajectory totals of a batch's stats (the batcher counted the calls)."""
    stats.episodes = len(trajectories)
    stats.wall_s = wall_s
    stats.turns = sum(len(t.turns) for t in trajectories)
    stats.passed = sum(t.passed for t in trajectories)
    stats.excluded = sum(t.reward is None for t in trajectories)
    stats.env_s = sum(t.env_s for t in trajectories)
    stats.model_tokens = sum(t.n_model_tokens for t in trajectories)
