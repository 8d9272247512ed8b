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
    async def lease_started(self, episode: str, sb: Sandbox) -> None: ...

    async def lease_ended(self, episode: str) -> None: ...


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

    async def _open(self, limits: Limits | None) -> Sandbox:
        if self.rate is not None:
            await self.rate.take()
        return await self._inner(limits)

    def quota(self, limits: Limits | None) -> Quota:
        limits = limits or self.default_limits
        return Quota.of(limits) if limits is not None else Quota.of(Limits())

    @asynccontextmanager
    async def _lease(self, episode: str, limits: Limits | None) -> AsyncIterator[Sandbox]:
        limits = limits or self.default_limits
        async with self.resources.hold(self.quota(limits)):
            async with self.direct.lease(episode, limits) as sb:
                if self.observer is not None:
                    await self.observer.lease_started(episode, sb)
                yield sb
            # Only a lease that ended normally goes back to GENERATING; on an exception
            # (preemption, timeout, a failure) the scheduler decides the next state.
            if self.observer is not None:
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
