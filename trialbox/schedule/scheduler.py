"""The scheduler: admission, priorities, preemption, timeouts, retries and recovery, with
every task move journaled before it takes effect.

    journal = Journal("run.db")
    async def job(ctx: TaskContext) -> float | None:      # one episode of one task
        for turn in range(len(ctx.turns), 3):
            code = await policy.generate(ctx.payload, ctx.turns)    # GENERATING
            async with ctx.lease() as sb:                           # EXECUTING
                result = await run_code(sb, code)
            await ctx.record_turn({"code": code, "status": result.status.value})
        await ctx.grading()                                         # GRADING
        return reward                          # float -> DONE; None -> infra, retried

    async with Scheduler(journal, "run-1", job, SchedulerConfig(max_active=8)) as s:
        await s.submit([TaskSpec("t1", payload={...}), TaskSpec("t2", priority=0)])
        await s.drain()                        # every task final

Rules the code below keeps (docs/scheduler.md says why):

* A task moves only through `TaskRecord.move` (the lifecycle table) and the move is staged
  in the journal; whoever acts on the move (starts the job, grants the lease, reports the
  result) first awaits the batch's commit. One commit per event-loop tick serves every
  task that moved in it.
* A final state and the task's one result row are staged in the same batch: both or
  neither. `results` has the task as its primary key: a second result is impossible.
* Only infrastructure failures are retried (an `InfraError`, or the job returning None),
  with exponential backoff and jitter, at most `max_retries` times; then FAILED, reward
  None. A job that raises anything else is FAILED at once (a bug is not retried).
* Preemption: when a task waits for a slot and every slot is taken, the least urgent
  in-flight task that is less urgent than it (and is generating or executing) is
  cancelled, goes PREEMPTED -> QUEUED at the front of its tier, keeps its journaled turns
  and its parked session, and resumes later from them.
* A crash (this process dying) is recovered by `start()`: tasks that were in flight go
  RETRYING -> QUEUED (cause "crash", not counted against `max_retries`), waiting tasks
  are queued as they were, final tasks are left alone.
"""

from __future__ import annotations

import asyncio
import enum
import random
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any

from trialbox.errors import InfraError, UsageError
from trialbox.sandbox.base import Sandbox
from trialbox.schedule.lease import Opener, _default_opener
from trialbox.schedule.leasing import SchedulerLeaser
from trialbox.schedule.lifecycle import FINAL, IN_FLIGHT, TaskRecord
from trialbox.schedule.queues import TieredQueue
from trialbox.schedule.quotas import Capacity, Quota, RateLimiter, ResourcePool
from trialbox.store.journal import Journal, JournalError
from trialbox.telemetry.instrument import task_moved
from trialbox.types import ExecResult, Limits, TaskState

S = TaskState


class Priority(enum.IntEnum):
    """The priority classes that share one machine's sandbox capacity (a `TaskSpec`'s
    `priority`, i.e. its tier, with the default three tiers). Lower is more urgent: it is
    dispatched first, may preempt the classes below it, and its quota reservations wait
    ahead of theirs."""

    INTERACTIVE = 0
    """A service request a person or a client is waiting on (`/v1` submissions)."""
    EVAL = 1
    """An evaluation attempt (`trialbox eval --db`); also `TaskSpec`'s default."""
    TRAIN = 2
    """A training episode (`trialbox train`): uses whatever capacity is left."""


@dataclass
class SchedulerConfig:
    """How the scheduler admits, orders, bounds and retries work."""

    max_active: int = 64
    """Tasks holding a slot at once (GENERATING, EXECUTING or GRADING)."""
    max_queued: int = 100_000
    """New submissions beyond this many waiting tasks are refused (QueueFull)."""
    tiers: int = 3
    """Priority tiers; 0 is the most urgent. `TaskSpec.priority` picks one."""
    aging_s: float = 60.0
    """A waiting task moves up one tier per this many seconds waited (no starvation)."""
    preempt: bool = True
    """Evict less urgent in-flight work when more urgent work waits for a slot."""
    max_preemptions: int = 3
    """A task preempted this many times is not preempted again (no thrashing)."""
    turn_timeout_s: float | None = None
    """Longest one turn (generation + its execution) may take; then TIMED_OUT."""
    task_timeout_s: float | None = None
    """Longest one attempt of a task may take in flight (queueing excluded)."""
    max_retries: int = 3
    """Infrastructure failures retried per task; one more is FAILED (reward None)."""
    backoff_s: float = 0.5
    """First retry's delay; doubles per failure, with jitter in [50%, 100%]."""
    backoff_max_s: float = 30.0
    """Cap on one retry's delay."""
    limits: Limits | None = None
    """Sandbox limits of a lease that gives none; also the default task quota."""
    capacity: Capacity | None = None
    """The machine's resources; None detects this machine's."""
    reserve: float = 0.3
    """Share of the capacity never handed to tasks (host, judge, bursts)."""
    sandbox_rate: float = 50.0
    """New sandbox sessions per second, at most (a token bucket)."""
    sandbox_burst: int = 20
    """Sessions that may be created at once before the rate applies."""

    def __post_init__(self) -> None:
        if self.max_active < 1:
            raise UsageError(f"max_active must be at least 1, got {self.max_active}")
        if self.max_queued < 1:
            raise UsageError(f"max_queued must be at least 1, got {self.max_queued}")
        if self.max_retries < 0:
            raise UsageError(f"max_retries must be >= 0, got {self.max_retries}")
        for name in ("turn_timeout_s", "task_timeout_s"):
            v = getattr(self, name)
            if v is not None and not v > 0:
                raise UsageError(f"{name} must be positive or None, got {v}")
        if not 0 <= self.backoff_s <= self.backoff_max_s:
            raise UsageError("need 0 <= backoff_s <= backoff_max_s, got "
                             f"{self.backoff_s} and {self.backoff_max_s}")


@dataclass(frozen=True)
class TaskSpec:
    """A task to submit. `payload` is the job's input (JSON-serialisable: it is journaled
    so a restarted scheduler can resume the task without the caller)."""

    task_id: str
    payload: Any = None
    priority: int = Priority.EVAL
    """The tier (0 most urgent); `Priority` names the classes."""
    trace_id: str = ""
    """Links the task's transitions to its trace; a fresh one when empty."""


Job = Callable[["TaskContext"], Awaitable[float | None]]


@dataclass
class SchedulerStats:
    transitions: int = 0
    dispatched: int = 0
    preemptions: int = 0
    retries: int = 0
    recovered: int = 0
    finals: dict[str, int] = field(default_factory=dict)
    dispatch_latency_s: deque[float] = field(default_factory=lambda: deque(maxlen=100_000))
    """For the latest 100,000 dispatches: from the moment the task could have had its
    slot (submitted to a free slot, or the slot freed) to the first instruction of its
    job. Scheduler overhead on the critical path, journal commits included."""


class TaskContext:
    """What a job sees of its task and the scheduler."""

    def __init__(self, sched: Scheduler, rec: TaskRecord, turns: list[Any]):
        self._s = sched
        self._rec = rec
        self.task_id = rec.task_id
        self.run_id = sched.run_id
        self.attempt = rec.attempt
        self.payload = rec.payload
        self.trace_id = rec.trace_id
        self.turns = turns
        """Turns journaled so far (across preemptions, retries and crashes): resume
        from them. After a retry or a crash the sandbox session is a new one."""

    def lease(self, limits: Limits | None = None) -> AbstractAsyncContextManager[Sandbox]:
        """The task's sandbox session with compute, for one execution (EXECUTING)."""
        return self._s.leaser.lease(self.task_id, limits)

    def slot(self, limits: Limits | None = None) -> AbstractAsyncContextManager[None]:
        """The task's quota for one turn's environment work without a session of its
        own (e.g. the judge's sandboxes); a `lease()` inside it reserves nothing more."""
        return self._s.leaser.slot(self.task_id, limits)

    @property
    def leaser(self) -> SchedulerLeaser:
        """For an agent loop that takes a `Leaser`: lease with `ctx.task_id` as episode."""
        return self._s.leaser

    def observe(self, result: ExecResult) -> None:
        """Note the environment that ran the code (journaled with the next transition)."""
        self._rec.runtime = result.runtime

    async def record_turn(self, turn: Any) -> None:
        """Journal one turn (a `Turn`, a dict, any JSON-able data); kept on preemption."""
        rec = self._rec
        fut = self._s.journal.stage_turn(self.run_id, rec.task_id, rec.turns, rec.attempt,
                                         turn)
        rec.turns += 1
        self.turns.append(turn)
        await fut

    async def record_grade(self, grade: Any) -> None:
        """Journal the judge's grade of this attempt (a `Grade` or any JSON-able data)."""
        await self._s.journal.stage_grade(self.run_id, self.task_id, self._rec.attempt,
                                          grade)

    async def grading(self) -> None:
        """The episode is over; the judge grades it (GRADING: no longer preemptible)."""
        if self._rec.state is not S.GRADING:
            await self._s._move(self._rec, S.GRADING)


class Scheduler:
    def __init__(self, journal: Journal, run_id: str, job: Job,
                 config: SchedulerConfig | None = None, *, opener: Opener = _default_opener,
                 on_dispatch: Callable[[TaskRecord], None] | None = None):
        if not isinstance(run_id, str) or not run_id:
            raise UsageError("run_id must be a non-empty string")
        self.journal = journal
        self.run_id = run_id
        self.job = job
        self.config = c = config or SchedulerConfig()
        self.queue = TieredQueue(c.tiers, c.aging_s, c.max_queued)
        self.resources = ResourcePool(c.capacity or Capacity.detect(), c.reserve)
        self.default_quota = Quota.of(c.limits) if c.limits else Quota.of(Limits())
        self.resources.check(self.default_quota)
        self.leaser = SchedulerLeaser(self.resources, RateLimiter(c.sandbox_rate,
                                      c.sandbox_burst), opener, c.limits)
        self.leaser.observer = self
        self.on_dispatch = on_dispatch
        self.stats = SchedulerStats()
        self.tasks: dict[str, TaskRecord] = {}
        """Tasks not yet final (final ones are dropped: memory stays bounded by the
        work outstanding, not by the run's history)."""
        self.known: set[str] = set()
        self._active: list[dict[str, TaskRecord]] = [{} for _ in range(c.tiers)]
        self._n_active = 0
        self._stopping = 0
        self._timers: set[asyncio.TimerHandle] = set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._fatal: JournalError | None = None
        self._waits: list[tuple[set[str], asyncio.Future[None]]] = []
        self._started = False
        self._closed = False
        self._rng = random.Random()

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> Scheduler:
        """Record the run, recover what a previous process left, start dispatching."""
        self.journal.add_run(self.run_id, {"max_active": self.config.max_active})
        await self._recover()
        self._started = True
        self._pump()
        return self

    async def __aenter__(self) -> Scheduler:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop: cancel jobs in flight (their state stays in flight in the journal, so a
        restart re-queues them, exactly as after a crash), end every session."""
        if self._closed:
            return
        self._closed = True
        for h in self._timers:
            h.cancel()
        running = [r.handle for tier in self._active for r in tier.values()
                   if isinstance(r.handle, asyncio.Task)]
        for t in running:
            t.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        try:
            self.journal.flush_now()
        except JournalError:
            pass
        await self.leaser.close()

    async def drain(self) -> None:
        """Wait until every submitted task is final. Raises the JournalError that
        stopped the scheduler, if one did."""
        while True:
            if self._fatal is not None:
                raise self._fatal
            if not self.tasks:
                return
            self._idle.clear()
            await self._idle.wait()

    async def wait(self, task_ids: Iterable[str]) -> None:
        """Wait until every one of these tasks is final (submitted ones, or known from the
        journal). Raises the JournalError that stopped the scheduler, if one did."""
        self._check_alive()
        left = {t for t in task_ids if t in self.tasks}
        if not left:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (left, fut)
        self._waits.append(entry)
        try:
            await fut
        finally:
            if entry in self._waits:
                self._waits.remove(entry)

    @property
    def unfinished(self) -> int:
        return len(self.tasks)

    # ------------------------------------------------------------------ submission
    async def submit(self, specs: Iterable[TaskSpec]) -> int:
        """Journal and queue new tasks; returns how many were new. Idempotent: ids the
        run already has (from this process or the journal) are skipped, so a restarted
        driver can submit its whole task list again. Raises QueueFull (nothing recorded)
        when the batch does not fit under `max_queued`."""
        self._check_alive()
        now = time.monotonic()
        fresh: list[TaskSpec] = []
        seen: set[str] = set()
        for spec in specs:
            if not isinstance(spec.task_id, str) or not spec.task_id:
                raise UsageError(f"task ids must be non-empty strings, got {spec.task_id!r}")
            if not isinstance(spec.priority, int) or not 0 <= spec.priority < self.config.tiers:
                raise UsageError(f"task {spec.task_id!r}: priority {spec.priority!r} is "
                                 f"outside 0..{self.config.tiers - 1} (0 is most urgent)")
            if spec.task_id in self.known or spec.task_id in seen:
                continue
            seen.add(spec.task_id)
            fresh.append(spec)
        self.queue.check_room(len(fresh))
        rows = [(s.task_id, s.priority, s.trace_id or uuid.uuid4().hex, s.payload)
                for s in fresh]
        new_ids = self.journal.add_tasks(self.run_id, rows, time.time())
        recs = []
        for (tid, prio, trace, payload) in rows:
            self.known.add(tid)
            if tid not in new_ids:
                continue  # journaled by an earlier process: recovery owns it
            rec = TaskRecord(tid, prio, payload, trace, now, self.default_quota)
            self.tasks[tid] = rec
            task_moved(None, rec.state)
            recs.append(rec)
        if recs:
            futs = [self._stage(rec, S.QUEUED) for rec in recs]
            await futs[-1]  # one batch: the last future is everyone's
            for rec in recs:
                if rec.state is S.QUEUED:  # not cancelled meanwhile
                    self._enqueue(rec)
            self._pump()
        return len(recs)

    async def cancel(self, task_id: str) -> bool:
        """Cancel a task that is not final; False if it already is. Unknown id: UsageError."""
        rec = self.tasks.get(task_id)
        if rec is None:
            if task_id in self.known:
                return False
            raise UsageError(f"run {self.run_id!r} has no task {task_id!r}")
        if rec.state in (S.PENDING, S.QUEUED, S.RETRYING, S.PREEMPTED):
            self.queue.discard(rec)  # no-op unless it is in the queue (not merely QUEUED)
            await self._finish(rec, S.CANCELLED, None, "cancel", "cancelled by the caller")
            return True
        if rec.stop is None and rec.in_job and isinstance(rec.handle, asyncio.Task):
            rec.stop = S.CANCELLED
            rec.handle.cancel()
            return True
        if rec.stop is None and rec.state is S.GENERATING and rec.handle is not None \
                and not rec.started:
            rec.stop = S.CANCELLED  # dispatched, its first step not run yet: it checks
            return True
        return False  # past its job (grading, recording): it finishes as it would

    # ------------------------------------------------------------------ moves
    def _stage(self, rec: TaskRecord, new: TaskState, cause: str = "",
               message: str = "") -> asyncio.Future[None]:
        old = rec.move(new)
        self.stats.transitions += 1
        task_moved(old, new)  # the dashboard's and /metrics' tasks-by-state (~1 µs)
        return self.journal.stage_transition(
            self.run_id, rec.task_id, rec.attempt, old.value, new.value, time.time(),
            sandbox=rec.sandbox, runtime=rec.runtime, trace_id=rec.trace_id, cause=cause,
            message=message)

    async def _move(self, rec: TaskRecord, new: TaskState, cause: str = "",
                    message: str = "") -> None:
        await self._stage(rec, new, cause, message)

    def _enqueue(self, rec: TaskRecord, front: bool = False) -> None:
        rec.queued_at = time.monotonic()
        rec.ready_at = rec.queued_at
        self.queue.push(rec, front=front, force=True)

    def _check_alive(self) -> None:
        if self._fatal is not None:
            raise self._fatal
        if self._closed:
            raise UsageError("this scheduler is closed; start a new one on the journal")

    # ------------------------------------------------------------------ dispatch
    def _pump(self, freed_at: float | None = None) -> None:
        """Fill free slots from the queue; preempt if urgent work still waits."""
        if not self._started or self._closed or self._fatal is not None:
            return
        c = self.config
        now = time.monotonic()
        while self._n_active < c.max_active and len(self.queue):
            rec = self.queue.pop(now)
            if rec is None:
                break
            if freed_at is not None and freed_at > rec.ready_at:
                rec.ready_at = freed_at
            self._n_active += 1
            self._active[rec.priority][rec.task_id] = rec
            self.stats.dispatched += 1
            if self.on_dispatch is not None:
                self.on_dispatch(rec)
            fut = self._stage(rec, S.GENERATING)
            rec.handle = asyncio.get_running_loop().create_task(self._run(rec, fut))
        if c.preempt and len(self.queue) and self._n_active >= c.max_active:
            self._maybe_preempt(now)

    def _maybe_preempt(self, now: float) -> None:
        best = self.queue.best(now)
        if best is None:
            return
        tier = self.queue.effective(best, now)
        # Victims still being preempted already free a slot each for the waiters.
        if self._stopping >= self.queue.waiting_at_or_above(tier):
            return
        for victim_tier in range(self.config.tiers - 1, tier, -1):
            for rec in reversed(self._active[victim_tier].values()):  # newest first
                if (rec.stop is None and rec.in_job
                        and rec.state in (S.GENERATING, S.EXECUTING)
                        and rec.preemptions < self.config.max_preemptions
                        and isinstance(rec.handle, asyncio.Task)):
                    rec.stop = S.PREEMPTED
                    self._stopping += 1
                    rec.handle.cancel()
                    return

    async def _run(self, rec: TaskRecord, started: asyncio.Future[None]) -> None:
        c = self.config
        outcome: tuple[TaskState, float | None, str, str] | None = None
        freed: float | None = None
        # Cancellable from here (not from create_task: a task cancelled before its first
        # step never runs this body, and its slot would never be given back).
        rec.in_job = True
        rec.started = True
        try:
            await started
            if rec.stop is S.CANCELLED:  # cancelled between its dispatch and now
                raise asyncio.CancelledError
            t0 = time.monotonic()
            self.stats.dispatch_latency_s.append(t0 - rec.ready_at)
            turns = (self.journal.turns_of(self.run_id, rec.task_id) if rec.turns else [])
            ctx = TaskContext(self, rec, turns)
            try:
                if c.turn_timeout_s is None and c.task_timeout_s is None:
                    reward = await self.job(ctx)
                else:
                    rec.deadline = None if c.task_timeout_s is None else t0 + c.task_timeout_s
                    async with asyncio.timeout_at(self._turn_deadline(rec)) as tm:
                        rec.timeout = tm
                        reward = await self.job(ctx)
            finally:
                rec.in_job = False
                freed = time.monotonic()
            if rec.state is not S.GRADING:
                await self._move(rec, S.GRADING)
            if reward is None:
                await self._infra_failure(rec, "infra", "the job returned no reward "
                                          "(infrastructure failure)")
            else:
                outcome = (S.DONE, float(reward), "", "")
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            if rec.stop is S.PREEMPTED and rec.state in (S.GENERATING, S.EXECUTING):
                rec.preemptions += 1
                self.stats.preemptions += 1
                await self._move(rec, S.PREEMPTED, "preempt", "more urgent work waited")
                await self._move(rec, S.QUEUED)
            elif rec.stop is S.CANCELLED:
                outcome = (S.CANCELLED, None, "cancel", "cancelled by the caller")
            else:
                raise  # the scheduler is closing: leave the state in flight for recovery
        except TimeoutError as e:
            timer = rec.timeout
            if isinstance(timer, asyncio.Timeout) and timer.expired():
                outcome = (S.TIMED_OUT, None, "timeout", "ran past the turn or task time "
                           "limit")
            else:  # the job's own timeout (e.g. a model server's): infrastructure
                await self._infra_failure(rec, "infra", f"job raised {e!r}")
        except JournalError as e:
            self._stop_fatally(e)
            return
        except InfraError as e:
            await self._infra_failure(rec, "infra", str(e))
        except Exception as e:  # a bug in the job: not retried, never a reward of 0.0
            outcome = (S.FAILED, None, "error", f"{type(e).__name__}: {e}"[:500])
        finally:
            rec.timeout = None
            rec.in_job = False
            rec.started = False
        try:
            if outcome is not None:
                await self._finish(rec, *outcome)
            self._release(rec)
            if rec.state is S.QUEUED:  # preempted: back at the front of its tier
                self._enqueue(rec, front=True)
            if rec.stop is S.PREEMPTED:  # counted when chosen, whatever became of it
                self._stopping -= 1
            rec.stop = None
            self._pump(freed)
        except JournalError as e:
            self._stop_fatally(e)

    def _turn_deadline(self, rec: TaskRecord) -> float | None:
        now = time.monotonic()
        task_deadline = rec.deadline
        turn = self.config.turn_timeout_s
        turn_deadline = None if turn is None else now + turn
        if task_deadline is None:
            return turn_deadline
        return task_deadline if turn_deadline is None else min(task_deadline, turn_deadline)

    async def _infra_failure(self, rec: TaskRecord, cause: str, message: str) -> None:
        """Retry after a backoff (RETRYING, then QUEUED on a timer), or FAILED with
        reward None when the retries are spent."""
        rec.infra_failures += 1
        await self.leaser.end(rec.task_id)  # the session may be what broke
        if rec.infra_failures > self.config.max_retries:
            await self._finish(rec, S.FAILED, None, cause, f"{message}; gave up after "
                               f"{rec.infra_failures} infrastructure failures"[:500])
            return
        await self._move(rec, S.RETRYING, cause, message[:500])
        self.stats.retries += 1
        delay = min(self.config.backoff_max_s,
                    self.config.backoff_s * 2 ** (rec.infra_failures - 1))
        delay *= 0.5 + 0.5 * self._rng.random()
        self._later(delay, rec)

    def _later(self, delay: float, rec: TaskRecord) -> None:
        loop = asyncio.get_running_loop()
        handle: asyncio.TimerHandle

        def fire() -> None:
            self._timers.discard(handle)
            loop.create_task(self._requeue(rec))
        handle = loop.call_later(delay, fire)
        self._timers.add(handle)

    async def _requeue(self, rec: TaskRecord) -> None:
        if rec.state is not S.RETRYING or self._closed:
            return
        rec.attempt += 1
        try:
            await self._move(rec, S.QUEUED)
        except JournalError as e:
            self._stop_fatally(e)
            return
        if _state(rec) is S.QUEUED:  # not cancelled while the move committed
            self._enqueue(rec)
            self._pump()

    async def _finish(self, rec: TaskRecord, state: TaskState, reward: float | None,
                      cause: str = "", message: str = "") -> None:
        fut = self._stage(rec, state, cause, message)
        self.journal.stage_result(self.run_id, rec.task_id, rec.attempt, state.value, reward,
                                  cause)
        await fut
        self.stats.finals[state.value] = self.stats.finals.get(state.value, 0) + 1
        self.tasks.pop(rec.task_id, None)
        for left, waiter in self._waits:
            left.discard(rec.task_id)
            if not left and not waiter.done():
                waiter.set_result(None)
        await self.leaser.end(rec.task_id)
        if not self.tasks:
            self._idle.set()

    def _release(self, rec: TaskRecord) -> None:
        if self._active[rec.priority].pop(rec.task_id, None) is not None:
            self._n_active -= 1
        rec.handle = None

    def _stop_fatally(self, e: JournalError) -> None:
        """The journal cannot be written: nothing may take effect any more. Stop every
        job; their last committed state is what a restart will recover."""
        if self._fatal is None:
            self._fatal = e
            for _, waiter in self._waits:
                if not waiter.done():
                    waiter.set_exception(e)
            for tier in self._active:
                for rec in tier.values():
                    if isinstance(rec.handle, asyncio.Task) and rec.handle is not \
                            asyncio.current_task():
                        rec.handle.cancel()
        self._idle.set()

    # ------------------------------------------------------------------ lease hooks
    def priority_of(self, episode: str) -> tuple[int, ...]:
        """A task's quota reservations wait by (tier, submission order); other episodes'
        (not tasks of this scheduler) ahead of them, first come first served."""
        rec = self.tasks.get(episode)
        return () if rec is None else (rec.priority, rec.seq)

    async def lease_started(self, episode: str, sb: Sandbox | None) -> None:
        rec = self.tasks.get(episode)
        if rec is None or rec.state is not S.GENERATING:
            return
        rec.sandbox = "" if sb is None else str(getattr(sb, "id", "") or
                                                 f"{sb.tier}:{id(sb):x}")
        await self._move(rec, S.EXECUTING)

    async def lease_ended(self, episode: str) -> None:
        rec = self.tasks.get(episode)
        if rec is None or rec.state is not S.EXECUTING:
            return
        await self._move(rec, S.GENERATING)
        timer = rec.timeout
        if isinstance(timer, asyncio.Timeout) and self.config.turn_timeout_s is not None:
            timer.reschedule(self._turn_deadline(rec))  # a new turn starts

    # ------------------------------------------------------------------ recovery
    async def _recover(self) -> None:
        """Rebuild the in-memory view from the journal: in-flight tasks are retried
        (turns kept), waiting ones queued again, final ones only remembered as known."""
        now = time.monotonic()
        last: asyncio.Future[None] | None = None
        requeue: list[TaskRecord] = []
        for st in self.journal.load_run(self.run_id):
            self.known.add(st.task_id)
            state = st.state
            if state in FINAL:
                continue
            rec = TaskRecord(st.task_id, st.priority, st.payload, st.trace_id, now,
                             self.default_quota)
            rec.state, rec.attempt = state, st.attempt
            task_moved(None, state)
            rec.infra_failures, rec.preemptions, rec.turns = (st.infra_failures,
                                                              st.preemptions, st.turns)
            self.tasks[st.task_id] = rec
            self.stats.recovered += 1
            if state in IN_FLIGHT:
                last = self._stage(rec, S.RETRYING, "crash",
                                   "the scheduler process died while this task was "
                                   f"{state.name}; resumed from its journaled turns")
                state = S.RETRYING
            if state is S.RETRYING:
                rec.attempt += 1
            if state is not S.QUEUED:
                last = self._stage(rec, S.QUEUED)
            requeue.append(rec)
        if last is not None:
            await last
        for rec in requeue:
            if rec.state is S.QUEUED:  # not cancelled while the moves committed
                self._enqueue(rec)


def _state(rec: TaskRecord) -> TaskState:
    """The record's state now (a call, so the type checker does not carry a narrowing
    from before an `await` across it: another coroutine may have moved the task)."""
    return rec.state
