"""Training episodes as scheduler tasks: every episode of every GRPO step is a task of
the journaled scheduler (docs/scheduler.md), so a training run can be watched
(`trialbox tasks status RUN --db out_dir/journal.db`) and resumed in the middle of a step
after a crash (`trialbox train CONFIG --resume`).

    step s, task i, sample j  ──►  task  s<s>.t<i>.e<j>:<task id>   (priority TRAIN)
        QUEUED ─► GENERATING ⇄ EXECUTING (the turn's run and judging, under the
        scheduler's quota: `ctx.slot()`) ─► GRADING ─► DONE, reward
        its trajectory (token ids, loss mask, log-probs, turns, grade, reward) journaled
        in `grades` before the task is final

* Generation stays batched: the step's episodes share one `Episodes` (one batcher), so
  their `generate` calls are coalesced exactly as in a plain rollout.
* Admission: the scheduler's slots hold every episode of the steps in flight (an
  episode that is thinking holds no sandbox), and its quota pool (`ctx.slot`, capacity
  `[rollout] env_workers` quotas) admits one turn's run and judging at a time per quota;
  waiters are served by (tier, submission order), so an older step's turns go first.
* Resume: an episode whose trajectory was journaled with a reward is not run again (the
  job returns the stored reward; the trainer reads the trajectory back); episodes in
  flight at the crash are run again from their start. An excluded episode (reward None:
  infrastructure, or the task's own tests broke) is retried up to twice, then FAILED.
* The run's config (`runs.config`) holds `kind: train`, the format and the inputs that
  decide the episodes (seed, tasks, group size, rollout, model, warm start): a journal
  of another run or another version is refused, naming what to change.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from trialbox.errors import UsageError
from trialbox.judge.evaluate import grade_from_json
from trialbox.rollout.agent import AgentConfig, Episodes, Grader, RolloutBatch, finish_stats
from trialbox.rollout.policy import Policy, Tokenizer
from trialbox.rollout.text import default_prompt
from trialbox.sandbox.base import SandboxProvider
from trialbox.schedule.quotas import Capacity
from trialbox.schedule.scheduler import (
    Priority,
    Scheduler,
    SchedulerConfig,
    TaskContext,
    TaskSpec,
)
from trialbox.store.journal import Journal
from trialbox.types import ExecStatus, Limits, Outcome, Task, Trajectory, Turn

KIND = "train"
FORMAT = 1
"""The layout of a training run's journal records; another one is refused on resume."""

TURN_QUOTA = Limits(cpus=1, memory_mb=256, disk_mb=64)
"""What one turn in the environment reserves; capacity is `env_workers` of these."""


def episode_task_id(step: int, task: int, sample: int, task_id: str) -> str:
    return f"s{step}.t{task}.e{sample}:{task_id}"


def fingerprint(config: Any) -> dict[str, Any]:
    """What decides a run's episodes: another value on resume is another run."""
    def plain(x: Any) -> Any:
        return json.loads(json.dumps(x, default=str))
    return {"format": FORMAT, "seed": config.run.seed, "tasks": plain(asdict(config.tasks)),
            "tasks_per_step": config.grpo.tasks_per_step,
            "group_size": config.grpo.group_size,
            "algorithm": config.grpo.algorithm.value,
            "rollout": plain(asdict(config.rollout)), "model": plain(asdict(config.model)),
            "sft": plain(asdict(config.sft))}


def journal_path(config: Any) -> str:
    return config.run.journal or os.path.join(config.run.out_dir, "journal.db")


def check_journal(path: str, run_id: str, inputs: dict[str, Any], resume: bool,
                  default_place: bool) -> None:
    """Refuse, before anything is written, a journal this run must not write to: another
    kind of run under this name, other inputs or another format on --resume, this run
    already there without --resume (unless the journal is the run directory's own, which
    a fresh run replaces with the rest of the directory), --resume of a journal that
    lacks the run."""
    if not os.path.exists(path):
        return
    with Journal(path) as journal:
        config = journal.run_config(run_id)
        runs = [r[0] for r in journal.conn.execute("SELECT run_id FROM runs")]
    if config is None:
        if resume and runs:
            raise UsageError(f"--resume: journal {path!r} has no run {run_id!r} (its runs: "
                             f"{', '.join(runs)}); set [run] journal to this run's journal, "
                             "or drop --resume to start afresh")
        return
    if config.get("kind") != KIND:
        raise UsageError(f"journal {path!r} holds a run {run_id!r} that is not a training "
                         f"run ({config.get('kind', 'a scheduler run')!r}); set [run] "
                         "journal to another file or [run] out_dir to another directory")
    if not resume:
        if default_place:
            return  # the fresh run replaces its directory's journal
        raise UsageError(f"journal {path!r} already holds run {run_id!r}; pass --resume to "
                         "finish it, or set [run] journal / out_dir to start a new one")
    stored = config.get("inputs", {})
    differ = sorted(k for k in set(stored) | set(inputs) if stored.get(k) != inputs.get(k))
    if differ:
        raise UsageError(
            f"--resume: run {run_id!r} in {path!r} was made by another "
            f"{'version of trialbox' if 'format' in differ else 'configuration'}: "
            f"{', '.join(differ)} differ (stored {[stored.get(k) for k in differ]}, now "
            f"{[inputs.get(k) for k in differ]}); resume with the run's own config, or "
            "start a new run in another out_dir")


def remove_journal(path: str) -> None:
    for suffix in ("", "-wal", "-shm"):
        try:
            os.remove(path + suffix)
        except FileNotFoundError:
            pass


# --------------------------------------------------------------------------- records

def trajectory_from_json(d: dict[str, Any]) -> Trajectory:
    """A `Trajectory` back from `Trajectory.to_json()` as journaled (floats round-trip
    exactly through JSON, so the log-probs are the sampled ones bit for bit)."""
    turns = tuple(Turn(
        output_text=t["output_text"], output_ids=tuple(t["output_ids"]),
        logprobs=tuple(t["logprobs"]), code=t.get("code"), code_from=t.get("code_from", ""),
        exec_status=ExecStatus(t["exec_status"]) if t.get("exec_status") else None,
        exec_summary=t.get("exec_summary", ""),
        outcome=Outcome(t["outcome"]) if t.get("outcome") else None,
        feedback_text=t.get("feedback_text", ""), feedback_ids=tuple(t["feedback_ids"]),
        finish_reason=t.get("finish_reason", ""), gen_s=t.get("gen_s", 0.0),
        env_s=t.get("env_s", 0.0)) for t in d["turns"])
    return Trajectory(
        task_id=d["task_id"], episode_id=d["episode_id"], prompt_ids=tuple(d["prompt_ids"]),
        turns=turns, token_ids=tuple(d["token_ids"]), loss_mask=tuple(d["loss_mask"]),
        old_logprobs=tuple(d["old_logprobs"]), reward=d["reward"],
        grade=grade_from_json(d["grade"]) if d.get("grade") else None,
        passed=d.get("passed", False), group_id=d.get("group_id", ""),
        stop_reason=d.get("stop_reason", ""), gen_s=d.get("gen_s", 0.0),
        env_s=d.get("env_s", 0.0), policy_version=d.get("policy_version"),
        environment=d.get("environment", ""))


def excluded(task: Task, episode_id: str, group_id: str, prompt_ids: tuple[int, ...],
             why: str) -> Trajectory:
    """An episode that ended without a trajectory (timed out, or failed before its
    first turn was recorded): no tokens to train on, reward None."""
    n = len(prompt_ids)
    return Trajectory(task.task_id, episode_id, prompt_ids, (), prompt_ids, (0,) * n,
                      (0.0,) * n, reward=None, group_id=group_id, stop_reason=why)


@dataclass
class EpisodeCounts:
    """What this process did (the rest was read back from the journal)."""

    run_now: int = 0
    read_back: int = 0
    """Episodes final in the journal before this process, or journaled with their reward
    before a crash cut off their DONE: not run again."""
    replayed: int = 0
    """Finished episodes of a resumed step whose contexts rode in the model's batches."""
    replay_differed: int = 0
    """Their turns the model regenerated differently from the record (0: deterministic)."""


@dataclass
class _Step:
    tasks: list[Task]
    episodes: Episodes
    prompts: list[tuple[int, ...]]


# --------------------------------------------------------------------------- the runs

class JournaledEpisodes:
    """The scheduler and journal a training run's episodes go through.

        async with JournaledEpisodes(journal, run_id, agent, provider, group_size=8,
                                     env_workers=4, in_flight=1, inputs=...) as eps:
            batch = await eps.rollout(step, tasks, policy)   # every episode a task
            eps.step_trajectories(step, tasks)               # read back, e.g. on resume
    """

    def __init__(self, journal: Journal, run_id: str, agent: AgentConfig,
                 provider: SandboxProvider, *, group_size: int, env_workers: int,
                 in_flight: int, inputs: dict[str, Any], tasks_per_step: int,
                 tokenizer: Tokenizer,
                 grader: Grader | None = None):
        self.journal, self.run_id, self.agent = journal, run_id, agent
        self.tokenizer = tokenizer
        self.provider, self.group_size, self.grader = provider, group_size, grader
        self.counts = EpisodeCounts()
        self._steps: dict[int, asyncio.Future[_Step]] = {}
        self._abandoned: list[Episodes] = []
        journal.add_run(run_id, {"kind": KIND, "inputs": inputs})
        # every episode of the steps in flight holds a slot (thinking holds no sandbox);
        # the turns in the environment are bounded by the quota pool below
        config = SchedulerConfig(
            max_active=max(1, in_flight * tasks_per_step * group_size), preempt=False,
            max_retries=2, backoff_s=0.1, backoff_max_s=1.0, limits=TURN_QUOTA,
            capacity=Capacity(cpus=env_workers * TURN_QUOTA.cpus,
                              memory_mb=env_workers * TURN_QUOTA.memory_mb,
                              disk_mb=env_workers * TURN_QUOTA.disk_mb),
            reserve=0.0, sandbox_rate=1e6, sandbox_burst=1 << 20)
        self.scheduler = Scheduler(journal, run_id, self._job, config,
                                   opener=provider.open)

    async def __aenter__(self) -> JournaledEpisodes:
        await self.scheduler.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.scheduler.close()  # stops the jobs; their states stay in flight
        for episodes in self._abandoned:  # a rollout given up (async mode stopped early)
            await episodes.aclose()
        self._abandoned.clear()

    def _step(self, step: int) -> asyncio.Future[_Step]:
        fut = self._steps.get(step)
        if fut is None:
            fut = self._steps[step] = asyncio.get_running_loop().create_future()
        return fut

    def _stored(self, task_id: str) -> Trajectory | None:
        grades = self.journal.grades_of(self.run_id, task_id)
        if not grades:
            return None
        return trajectory_from_json(grades[max(grades)]["trajectory"])

    async def _job(self, ctx: TaskContext) -> float | None:
        p: dict[str, Any] = ctx.payload  # type: ignore[assignment]
        earlier = self._stored(ctx.task_id)
        if earlier is not None and earlier.reward is not None:
            # its trajectory was journaled before a crash cut off its DONE: not run again
            self.counts.read_back += 1
            return earlier.reward
        st = await self._step(p["step"])  # recovered before its step was launched: wait
        i, j = p["task"], p["sample"]
        tr = await st.episodes.run(st.tasks[i], ctx.task_id,
                                   f"s{p['step']}.t{i}:{st.tasks[i].task_id}",
                                   order=i * self.group_size + j, prompt_ids=st.prompts[i])
        await ctx.record_grade({"trajectory": tr})
        self.counts.run_now += 1
        return tr.reward  # None: excluded, retried, then FAILED

    def specs(self, step: int, tasks: Sequence[Task]) -> list[TaskSpec]:
        return [TaskSpec(episode_task_id(step, i, j, t.task_id),
                         payload={"step": step, "task": i, "sample": j},
                         priority=Priority.TRAIN)
                for i, t in enumerate(tasks) for j in range(self.group_size)]

    async def rollout(self, step: int, tasks: Sequence[Task], policy: Policy) -> RolloutBatch:
        """Every episode of step `step` as a scheduler task (those already final in the
        journal are not run again); the trajectories in task order, a group side by side."""
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        episodes = Episodes(policy, self.agent, self.provider, leaser=self.scheduler.leaser,
                            env_slot=self.scheduler.leaser.slot, grader=self.grader)
        prompts = [episodes.prompt_ids(t) for t in tasks]
        fut = self._step(step)
        specs = self.specs(step, tasks)
        final = self.journal.results_of(self.run_id)
        self.counts.read_back += sum(s.task_id in final for s in specs)
        await episodes.__aenter__()
        ended = False
        try:
            ghosts: list[asyncio.Future[int]] = []
            if any(s.task_id not in final for s in specs):
                # A resumed step: the episodes that finished before the crash are not run
                # again, but their recorded contexts ride in the model's batches as they
                # did (`Episodes.replay`), so the episodes run again get the same rows,
                # order and random draws as in the uninterrupted run.
                for order, spec in enumerate(specs):
                    tr = self._stored(spec.task_id)
                    if tr is not None and tr.reward is not None:
                        ghosts.append(episodes.replay(tr, order))
            fut.set_result(_Step(list(tasks), episodes, prompts))
            try:
                await self.scheduler.submit(specs)
                await self.scheduler.wait(s.task_id for s in specs)
                self.counts.replay_differed += sum(await asyncio.gather(*ghosts))
                self.counts.replayed += len(ghosts)
            finally:
                del self._steps[step]
                for g in ghosts:
                    g.cancel()
            ended = True
        finally:
            if ended:
                await episodes.aclose()
            else:  # its jobs may still be judging: close it once the scheduler stopped
                self._abandoned.append(episodes)
        trajs = self.step_trajectories(step, tasks)
        finish_stats(episodes.stats, trajs, loop.time() - t0)
        return RolloutBatch(trajs, episodes.stats)

    def prompt_ids(self, task: Task) -> tuple[int, ...]:
        return tuple(self.tokenizer.encode((self.agent.render_prompt or default_prompt)(
            task)))

    def step_trajectories(self, step: int, tasks: Sequence[Task]) -> list[Trajectory]:
        """Step `step`'s trajectories from the journal: each episode's last journaled
        one (of its final attempt, or of an earlier attempt whose DONE a crash cut
        off), or an excluded stand-in when it ended without one."""
        results = self.journal.results_of(self.run_id)
        out = []
        for i, t in enumerate(tasks):
            for j in range(self.group_size):
                tid = episode_task_id(step, i, j, t.task_id)
                if tid not in results:
                    raise UsageError(f"step {step}: episode {tid} is not final in the "
                                     f"journal of run {self.run_id!r}")
                state, _, reward, cause = results[tid]
                tr = self._stored(tid)
                if tr is None:
                    tr = excluded(t, tid, f"s{step}.t{i}:{t.task_id}", self.prompt_ids(t),
                                  f"{state} ({cause})")
                elif state != "done":
                    tr = _with_reward(tr, None)
                out.append(tr)
        return out


def _with_reward(tr: Trajectory, reward: float | None) -> Trajectory:
    from dataclasses import replace
    return replace(tr, reward=reward)
