"""`SchedulerLeaser`: the `Leaser` (lease.py) the scheduler hands its jobs.

Same protocol as `DirectLeaser` — the agent loop does not change — plus, per lease:

1. the task's quota is reserved from the machine's usable capacity (quotas.py), waiting
   first come first served when the machine is full;
2. opening a *new* session goes through the creation rate limit (a re-lease of a parked
   session is not a creation and does not wait);
3. the scheduler is told the lease started and ended, so the task moves
   GENERATING -> EXECUTING -> GENERATING in the journal (a lease of an episode the
   scheduler does not know is granted the same way, with no transitions).

Compute is held only inside the `async with`: between leases the session is parked
(files kept, cell handed back), so a task that is thinking holds no sandbox.

`slot(episode)` reserves the same quota for a stretch of environment work that is not one
run in the episode's session — an agent loop's turn: the run *and* the trusted judge's
own sandboxes, or the judge alone (`AgentConfig.execute = False`). A lease of that
episode inside its slot reserves nothing more (one reservation per episode at a time), so
one `ResourcePool` admits every sandbox of a turn. Waiters are ordered by the task's
(tier, submission order): see quotas.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Protocol

from trialbox.sandbox.base import Sandbox
from trialbox.schedule.lease import DirectLeaser, Leaser, Opener, _default_opener
from trialbox.schedule.quotas import Quota, RateLimiter, ResourcePool
from trialbox.types import Limits


class LeaseObserver(Protocol):
    async def lease_started(self, episode: str, sb: Sandbox | None) -> None: ...

    async def lease_ended(self, episode: str) -> None: ...

    def priority_of(self, episode: str) -> tuple[int, ...]:
        """Where the episode's reservations wait: smaller first (quotas.py)."""
        ...


class SchedulerLeaser:
    def __init__(self, resources: ResourcePool, rate: RateLimiter | None = None,
                 opener: Opener = _default_opener, default_limits: Limits | None = None):
        self.resources = resources
        self.rate = rate
        self.default_limits = default_limits
        self.observer: LeaseObserver | None = None
        self._inner = opener
        self.direct = DirectLeaser(self._open)
        self.stats = self.direct.stats
        self._holding: dict[str, int] = {}
        """Episodes inside a `slot()` (their quota is already reserved), and how deep."""

    async def _open(self, limits: Limits | None) -> Sandbox:
        if self.rate is not None:
            await self.rate.take()
        return await self._inner(limits)

    def quota(self, limits: Limits | None) -> Quota:
        limits = limits or self.default_limits
        return Quota.of(limits) if limits is not None else Quota.of(Limits())

    def _priority(self, episode: str) -> tuple[int, ...]:
        return self.observer.priority_of(episode) if self.observer is not None else ()

    @asynccontextmanager
    async def _reserve(self, episode: str, limits: Limits | None) -> AsyncIterator[None]:
        if self._holding.get(episode):  # inside this episode's slot: reserved already
            yield
            return
        async with self.resources.hold(self.quota(limits), self._priority(episode)):
            self._holding[episode] = self._holding.get(episode, 0) + 1
            try:
                yield
            finally:
                n = self._holding.pop(episode) - 1
                if n:
                    self._holding[episode] = n

    def slot(self, episode: str,
             limits: Limits | None = None) -> AbstractAsyncContextManager[None]:
        """The episode's quota, reserved for the `async with` (no session is opened): the
        admission of one turn's environment work (EXECUTING for the scheduler). Leases
        of the episode inside it reserve nothing more and move nothing."""
        return self._slot(episode, limits or self.default_limits)

    @asynccontextmanager
    async def _slot(self, episode: str, limits: Limits | None) -> AsyncIterator[None]:
        outer = not self._holding.get(episode)
        async with self._reserve(episode, limits):
            if outer and self.observer is not None:
                await self.observer.lease_started(episode, None)
            yield
            if outer and self.observer is not None:
                await self.observer.lease_ended(episode)

    @asynccontextmanager
    async def _lease(self, episode: str, limits: Limits | None) -> AsyncIterator[Sandbox]:
        limits = limits or self.default_limits
        outer = not self._holding.get(episode)  # inside a slot: the slot moves the task
        async with self._reserve(episode, limits):
            async with self.direct.lease(episode, limits) as sb:
                if outer and self.observer is not None:
                    await self.observer.lease_started(episode, sb)
                yield sb
            # Only a lease that ended normally goes back to GENERATING; on an exception
            # (preemption, timeout, a failure) the scheduler decides the next state.
            if outer and self.observer is not None:
                await self.observer.lease_ended(episode)

    def lease(self, episode: str,
              limits: Limits | None = None) -> AbstractAsyncContextManager[Sandbox]:
        return self._lease(episode, limits)

    async def end(self, episode: str) -> None:
        await self.direct.end(episode)

    async def close(self) -> None:
        await self.direct.close()

    @property
    def open_sessions(self) -> int:
        return self.direct.open_sessions


def _is_a_leaser(x: SchedulerLeaser) -> Leaser:
    """Never called: makes the type checker prove SchedulerLeaser keeps the protocol."""
    return x
