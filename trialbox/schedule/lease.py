"""Sandbox leases: the seam between the agent loop and whoever owns sandboxes.

An episode keeps one sandbox *session* (its files) from its first execution to its end,
but holds *compute* only while code runs: the agent loop wraps each execution in

    async with leaser.lease(episode_id, limits) as sb:
        result = await run_code(sb, code)
    ...                                   # the model thinks: nothing held but files
    await leaser.end(episode_id)          # the episode is over: the session closes

`DirectLeaser` is the simplest owner (no admission control: every lease is granted at
once). The scheduler's leaser implements the same `Leaser` protocol and adds admission,
priorities, quotas and a creation rate limit; the agent loop does not change.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Protocol

from trialbox.errors import UsageError
from trialbox.sandbox.base import Sandbox
from trialbox.types import Limits

Opener = Callable[[Limits | None], Awaitable[Sandbox]]


class Leaser(Protocol):
    def lease(self, episode: str,
              limits: Limits | None = None) -> AbstractAsyncContextManager[Sandbox]:
        """The episode's session, with compute, for the duration of the `async with`.
        The first lease of an episode opens the session; later ones find its files
        intact. On exit the session is parked (compute handed back)."""
        ...

    async def end(self, episode: str) -> None:
        """The episode is over: close its session. Idempotent; unknown ids are ignored."""
        ...


@dataclass
class LeaseStats:
    leases: int = 0
    sessions_opened: int = 0
    sessions_closed: int = 0
    leased_s: float = 0.0          # total time inside `lease()` blocks


async def _default_opener(limits: Limits | None) -> Sandbox:
    from trialbox.sandbox import open_sandbox
    return await open_sandbox(limits=limits)


class DirectLeaser:
    """One session per episode, opened at its first lease, parked between leases and
    closed by `end()`. Two leases of the same episode never overlap (an episode's turns
    are sequential; a second concurrent lease waits for the first)."""

    def __init__(self, opener: Opener = _default_opener):
        self.opener = opener
        self.stats = LeaseStats()
        self._sessions: dict[str, Sandbox] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    @asynccontextmanager
    async def _lease(self, episode: str, limits: Limits | None) -> AsyncIterator[Sandbox]:
        if not isinstance(episode, str) or not episode:
            raise UsageError("an episode id must be a non-empty string")
        lock = self._locks.setdefault(episode, asyncio.Lock())
        async with lock:
            sb = self._sessions.get(episode)
            if sb is None:
                sb = await self.opener(limits)
                self._sessions[episode] = sb
                self.stats.sessions_opened += 1
            self.stats.leases += 1
            t0 = time.monotonic()
            try:
                yield sb
            finally:
                self.stats.leased_s += time.monotonic() - t0
                if episode in self._sessions:
                    await sb.park()

    def lease(self, episode: str,
              limits: Limits | None = None) -> AbstractAsyncContextManager[Sandbox]:
        return self._lease(episode, limits)

    async def end(self, episode: str) -> None:
        sb = self._sessions.pop(episode, None)
        self._locks.pop(episode, None)
        if sb is not None:
            await sb.close()
            self.stats.sessions_closed += 1

    async def close(self) -> None:
        """End every episode still open."""
        for episode in list(self._sessions):
            await self.end(episode)

    @property
    def open_sessions(self) -> int:
        return len(self._sessions)
