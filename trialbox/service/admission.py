"""Admission: every sandbox-using request is a task of the journaled scheduler.

The service has no queue of its own (DESIGN.md decision 5): a request that runs code or
grades asks `Admission.slot()`, which submits one scheduler task at the interactive
priority (tier 0, above evaluation and training episodes) and waits until the scheduler
dispatches it. The request's work then runs inside the task — its one-shot sandbox is
`ctx.lease()`d (EXECUTING only while code runs; the session closes as the task ends),
its grade is journaled — and its outcome becomes the task's final state:

    async with admission.slot(timeout=5.0, kind="exec") as ticket:
        async with ticket.ctx.lease(limits) as sb:          # EXECUTING
            result = await run_code(sb, code)
        ticket.reward = 1.0 if result.ok else 0.0

Overload keeps its HTTP meaning: at most `running` requests hold a slot (the scheduler's
`max_active`) and at most `queued` wait (its `max_queued`); one more is refused at once
with `Overloaded` (→ 503 + Retry-After), as is a waiter that gets no slot within
`wait_s` (or before its deadline) — its task is cancelled (CANCELLED in the journal,
nothing run).

What a service task records (run `service-<start>-<pid>` in the journal, readable with
`trialbox tasks status RUN --db FILE`): QUEUED → GENERATING (admitted) [→ EXECUTING →
GENERATING per lease] → GRADING → DONE with reward 1.0 when the run ended `ok`, 0.0
otherwise (its status is in the answer), or for a submission the grade's reward; a
submission whose grade is excluded (infra) and a request whose work raised (a deadline,
the machinery) end FAILED with reward None; one refused while waiting ends CANCELLED.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import os
import shutil
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from trialbox.errors import SandboxUnavailable, Unavailable
from trialbox.sandbox.base import SandboxProvider
from trialbox.schedule.queues import QueueFull
from trialbox.schedule.quotas import Capacity
from trialbox.schedule.scheduler import Scheduler, SchedulerConfig, TaskContext, TaskSpec
from trialbox.store.journal import Journal
from trialbox.types import Limits

INTERACTIVE = 0
"""The scheduler tier of service requests: the most urgent (evaluation 1, training 2)."""


class Overloaded(Unavailable):
    """No slot now; `retry_after` (seconds) is when one is likely."""

    def __init__(self, message: str, retry_after: int):
        super().__init__(message)
        self.retry_after = retry_after


class RequestAborted(Unavailable):
    """The request's handler went away (client disconnected, server shutting down)
    while its task held a slot: the task ends FAILED, never with a reward."""


@dataclass
class Ticket:
    """A granted slot: the request's scheduler task."""

    ctx: TaskContext
    reward: float | None = 1.0
    """The task's final reward when the work returns normally: set it from the outcome
    (a run's ok, a grade's reward; None = excluded, the task ends FAILED)."""
    done: asyncio.Future[float | None] = field(default_factory=lambda:
                                               asyncio.get_running_loop().create_future())


class Admission:
    """The scheduler in front of the sandboxes, with the service's overload answers and a
    moving estimate of how long a slot is held (for Retry-After)."""

    def __init__(self, running: int, queued: int, wait_s: float,
                 max_limits: Limits | None = None, journal: str | None = None):
        self.limit, self.queue_limit, self.wait_s = running, queued, wait_s
        self.max_limits = max_limits or Limits()
        self.journal_path = journal
        """The journal file (None: a temporary one, deleted at shutdown)."""
        self.run_id = ""
        self.running = 0
        """Requests holding a slot now."""
        self.waiting = 0
        """Requests waiting for a slot now (the queue depth)."""
        self.admitted = 0
        self.scheduler: Scheduler | None = None
        self.journal: Journal | None = None
        self._tmpdir: str | None = None
        self._seq = itertools.count(1)
        self._granted: dict[str, asyncio.Future[Ticket]] = {}
        self._mean_s = 0.5  # exponential moving average of the time a slot is held

    # ------------------------------------------------------------------ lifecycle
    async def start(self, provider: SandboxProvider) -> Admission:
        """Open the journal and start the scheduler; its leases open sessions of
        `provider`."""
        if self.journal_path is None:
            self._tmpdir = tempfile.mkdtemp(prefix="trialbox-serve-")
            path = os.path.join(self._tmpdir, "journal.db")
        else:
            path = self.journal_path
        self.journal = Journal(path)
        self.run_id = f"service-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{os.getpid()}"
        m = self.max_limits
        # Slots are the admission bound; quotas are sized so that `running` leases of the
        # largest limits a request may ask for always fit (no second, hidden bound), and
        # the creation rate is the per-client token bucket's business (guard.py).
        capacity = Capacity(cpus=self.limit * max(m.cpus, 1.0),
                            memory_mb=self.limit * m.memory_mb,
                            disk_mb=self.limit * m.disk_mb)
        config = SchedulerConfig(max_active=self.limit, max_queued=max(1, self.queue_limit),
                                 preempt=False, max_retries=0, capacity=capacity,
                                 reserve=0.0, sandbox_rate=1e9, sandbox_burst=1 << 30)
        self.scheduler = await Scheduler(self.journal, self.run_id, self._job, config,
                                         opener=provider.open).start()
        return self

    async def close(self) -> None:
        sched, journal = self.scheduler, self.journal
        self.scheduler = self.journal = None
        if sched is not None:
            await sched.close()
        if journal is not None:
            journal.close()
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None

    # ------------------------------------------------------------------ slots
    def retry_after(self) -> int:
        """Seconds until a slot is likely free: the queue ahead divided over the slots,
        times the mean hold time; at least 1."""
        ahead = self.waiting + 1
        return max(1, min(60, math.ceil(ahead / self.limit * self._mean_s)))

    def _overloaded(self) -> Overloaded:
        return Overloaded(f"server at capacity: {self.running} requests running and "
                          f"{self.waiting} queued (limit {self.queue_limit}); retry later",
                          self.retry_after())

    async def _job(self, ctx: TaskContext) -> float | None:
        granted = self._granted.pop(ctx.task_id, None)
        if granted is None or granted.done():  # its request gave up while it was queued
            raise RequestAborted("the request gave up before it was admitted")
        ticket = Ticket(ctx)
        granted.set_result(ticket)
        return await ticket.done  # the request's work runs in its handler, then resolves

    @asynccontextmanager
    async def slot(self, timeout: float | None = None,
                   kind: str = "run") -> AsyncIterator[Ticket]:
        """Hold one slot — one scheduler task — for the body of the `async with`."""
        sched = self.scheduler
        if sched is None:
            raise SandboxUnavailable("the scheduler is not running (server starting or "
                                     "shutting down); retry shortly")
        if self.running >= self.limit and self.waiting >= self.queue_limit:
            raise self._overloaded()
        wait = self.wait_s if timeout is None else max(0.0, min(self.wait_s, timeout))
        task_id = f"{kind}-{next(self._seq)}"
        granted: asyncio.Future[Ticket] = asyncio.get_running_loop().create_future()
        self._granted[task_id] = granted
        self.waiting += 1
        try:
            try:
                await sched.submit([TaskSpec(task_id, payload={"kind": kind},
                                             priority=INTERACTIVE)])
            except QueueFull:
                raise self._overloaded() from None
            try:
                ticket = await asyncio.wait_for(asyncio.shield(granted), wait)
            except TimeoutError:
                if not granted.done():
                    granted.cancel()
                    await sched.cancel(task_id)
                    raise Overloaded(f"no sandbox slot became free within {wait:.1f} s "
                                     f"({self.running} running, {self.waiting - 1} queued); "
                                     "retry later", self.retry_after()) from None
                ticket = granted.result()  # granted in the same instant: take it
            except BaseException:
                if not granted.done():
                    granted.cancel()
                    await asyncio.shield(sched.cancel(task_id))
                elif not granted.cancelled():
                    granted.result().done.set_exception(RequestAborted(
                        "the request was cancelled as it was admitted"))
                raise
        finally:
            self._granted.pop(task_id, None)
            self.waiting -= 1
        self.running += 1
        self.admitted += 1
        t0 = time.monotonic()
        try:
            yield ticket
        except Exception as e:
            ticket.done.set_exception(e)
            raise
        except BaseException as e:
            ticket.done.set_exception(RequestAborted(f"the request was aborted ({e!r})"))
            raise
        else:
            ticket.done.set_result(ticket.reward)
        finally:
            self.running -= 1
            self._mean_s = 0.9 * self._mean_s + 0.1 * (time.monotonic() - t0)
