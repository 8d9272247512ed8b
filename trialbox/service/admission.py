"""The bounded admission queue in front of the sandboxes.

At most `running` sandbox-using requests execute at once and at most `queued` wait;
one more is refused at once with `Overloaded` (→ 503 + Retry-After) instead of piling
up until the process falls over. A waiter that does not get a slot within `wait_s` (or
before its own deadline) is refused the same way.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from trialbox.errors import Unavailable


class Overloaded(Unavailable):
    """No slot now; `retry_after` (seconds) is when one is likely."""

    def __init__(self, message: str, retry_after: int):
        super().__init__(message)
        self.retry_after = retry_after


class Admission:
    """A semaphore with a bounded waiting room and a moving estimate of service time."""

    def __init__(self, running: int, queued: int, wait_s: float):
        self.limit, self.queue_limit, self.wait_s = running, queued, wait_s
        self.running = 0
        """Requests holding a slot now."""
        self.waiting = 0
        """Requests waiting for a slot now (the queue depth)."""
        self.admitted = 0
        self._sem: asyncio.Semaphore | None = None
        self._mean_s = 0.5  # exponential moving average of the time a slot is held

    def retry_after(self) -> int:
        """Seconds until a slot is likely free: the queue ahead divided over the slots,
        times the mean hold time; at least 1."""
        ahead = self.waiting + 1
        return max(1, min(60, math.ceil(ahead / self.limit * self._mean_s)))

    @asynccontextmanager
    async def slot(self, timeout: float | None = None) -> AsyncIterator[None]:
        """Hold one execution slot for the body of the `async with`."""
        if self._sem is None:
            self._sem = asyncio.Semaphore(self.limit)
        if self.running >= self.limit and self.waiting >= self.queue_limit:
            raise Overloaded(f"server at capacity: {self.running} requests running and "
                             f"{self.waiting} queued (limit {self.queue_limit}); retry later",
                             self.retry_after())
        wait = self.wait_s if timeout is None else max(0.0, min(self.wait_s, timeout))
        self.waiting += 1
        try:
            await asyncio.wait_for(self._sem.acquire(), wait)
        except TimeoutError:
            raise Overloaded(f"no sandbox slot became free within {wait:.1f} s "
                             f"({self.running} running, {self.waiting - 1} queued); "
                             "retry later", self.retry_after()) from None
        finally:
            self.waiting -= 1
        self.running += 1
        self.admitted += 1
        t0 = time.monotonic()
        try:
            yield
        finally:
            self.running -= 1
            self._sem.release()
            self._mean_s = 0.9 * self._mean_s + 0.1 * (time.monotonic() - t0)
