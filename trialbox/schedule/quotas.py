"""Resource quotas against machine capacity, and the sandbox-creation rate limit.

A lease reserves its task's quota (CPU, memory, disk) from the machine's *usable*
capacity — what is left after the elastic reserve (30% by default) is set aside for the
host, the zygote, the judge and bursts — and gives it back when the lease ends. A quota
larger than the usable capacity can never be granted; that is refused at once with a
UsageError saying what to change, instead of waiting forever.

Waiters are served by priority, then first come first served (a large quota at the head
waits for room rather than being overtaken forever by small ones). The scheduler's leases
wait with their task's (tier, submission order): urgent tiers first, and within a tier
the task submitted first (a trainer's oldest batch before the younger ones).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import os
import shutil
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from trialbox.errors import UsageError
from trialbox.types import Limits


@dataclass(frozen=True)
class Quota:
    """What one task's lease reserves. Defaults: the seeds' reference 2 vCPU / 4 GB / 50 GB."""

    cpus: float = 2.0
    """Cores' worth of CPU bandwidth."""
    memory_mb: int = 4096
    """Memory, MiB."""
    disk_mb: int = 50 * 1024
    """Workspace storage, MiB."""

    def __post_init__(self) -> None:
        for name in ("cpus", "memory_mb", "disk_mb"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
                raise UsageError(f"Quota.{name} must be a number >= 0, got {v!r}")

    @classmethod
    def of(cls, limits: Limits) -> Quota:
        """The quota a sandbox with these limits needs."""
        return cls(cpus=limits.cpus, memory_mb=limits.memory_mb, disk_mb=limits.disk_mb)


@dataclass(frozen=True)
class Capacity:
    """A machine's resources (the same units as `Quota`)."""

    cpus: float
    memory_mb: int
    disk_mb: int

    @classmethod
    def detect(cls, path: str = "/tmp") -> Capacity:
        """This machine: usable cores, MemTotal, free space where workspaces live."""
        try:
            cpus = float(len(os.sched_getaffinity(0)))
        except (AttributeError, OSError):
            cpus = float(os.cpu_count() or 1)
        mem_mb = 0
        try:
            with open("/proc/meminfo") as f:
                for line in f:
                    if line.startswith("MemTotal:"):
                        mem_mb = int(line.split()[1]) // 1024
        except OSError:
            pass
        return cls(cpus=cpus, memory_mb=mem_mb, disk_mb=shutil.disk_usage(path).free >> 20)

    def usable(self, reserve: float) -> Capacity:
        if not 0 <= reserve < 1:
            raise UsageError(f"the elastic reserve must be in [0, 1), got {reserve}; "
                             "0.3 keeps 30% of the machine free")
        keep = 1 - reserve
        return Capacity(self.cpus * keep, int(self.memory_mb * keep), int(self.disk_mb * keep))


class ResourcePool:
    """Reservations of quotas against a usable capacity."""

    def __init__(self, capacity: Capacity, reserve: float = 0.3):
        self.total = capacity
        self.usable = capacity.usable(reserve)
        self.reserve = reserve
        self.cpus = 0.0
        self.memory_mb = 0
        self.disk_mb = 0
        self._waiters: list[tuple[tuple[int, ...], int, Quota, asyncio.Future[None]]] = []
        """A heap: (priority, arrival, quota, future); the smallest is served first."""
        self._arrival = itertools.count()
        self.peak_cpus = 0.0

    def check(self, q: Quota) -> None:
        """UsageError if `q` could never be granted on this machine."""
        u = self.usable
        for name, need, have in (("cpus", q.cpus, u.cpus), ("memory_mb", q.memory_mb,
                                 u.memory_mb), ("disk_mb", q.disk_mb, u.disk_mb)):
            if need > have:
                raise UsageError(
                    f"a task quota of {name}={need} exceeds this machine's usable {name}="
                    f"{have} ({getattr(self.total, name)} minus the {self.reserve:.0%} "
                    "elastic reserve); lower the task's limits or the reserve, or give the "
                    "scheduler a bigger machine")

    def _fits(self, q: Quota) -> bool:
        u = self.usable
        return (self.cpus + q.cpus <= u.cpus + 1e-9 and self.memory_mb + q.memory_mb
                <= u.memory_mb and self.disk_mb + q.disk_mb <= u.disk_mb)

    def _take(self, q: Quota) -> None:
        self.cpus += q.cpus
        self.memory_mb += q.memory_mb
        self.disk_mb += q.disk_mb
        self.peak_cpus = max(self.peak_cpus, self.cpus)

    def release(self, q: Quota) -> None:
        self.cpus -= q.cpus
        self.memory_mb -= q.memory_mb
        self.disk_mb -= q.disk_mb
        self._grant()

    def _grant(self) -> None:
        """Serve waiters in order while the most urgent one fits."""
        while self._waiters:
            _, _, wq, fut = self._waiters[0]
            if fut.done():  # the waiter gave up (cancelled)
                heapq.heappop(self._waiters)
                continue
            if not self._fits(wq):
                break
            heapq.heappop(self._waiters)
            self._take(wq)
            fut.set_result(None)

    async def acquire(self, q: Quota, priority: tuple[int, ...] = ()) -> None:
        """Reserve `q`, waiting behind more urgent waiters (smaller `priority`; equal
        ones first come first served)."""
        self.check(q)
        if not self._waiters and self._fits(q):
            self._take(q)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (priority, next(self._arrival), q, fut))
        self._grant()
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release(q)  # granted in the same tick we were cancelled
            raise

    @asynccontextmanager
    async def hold(self, q: Quota, priority: tuple[int, ...] = ()) -> AsyncIterator[None]:
        await self.acquire(q, priority)
        try:
            yield
        finally:
            self.release(q)

    @property
    def waiting(self) -> int:
        return len(self._waiters)


class RateLimiter:
    """A token bucket: at most `rate` events per second on average, `burst` at once.
    Sandbox creation goes through one, so a recovery or a burst of submissions cannot
    become a retry storm against the pool."""

    def __init__(self, rate: float, burst: int = 1):
        if not rate > 0:
            raise UsageError(f"rate must be positive (events per second), got {rate}")
        if burst < 1:
            raise UsageError(f"burst must be at least 1, got {burst}")
        self.rate = rate
        self.burst = burst
        self._tokens = float(burst)
        self._t = time.monotonic()
        self._lock = asyncio.Lock()
        self.waited_s = 0.0

    async def take(self) -> None:
        async with self._lock:  # FIFO: waiters are served in arrival order
            while True:
                now = time.monotonic()
                self._tokens = min(self.burst, self._tokens + (now - self._t) * self.rate)
                self._t = now
                if self._tokens >= 1:
                    self._tokens -= 1
                    return
                wait = (1 - self._tokens) / self.rate
                self.waited_s += wait
                await asyncio.sleep(wait)
