"""A node's capacity in open sessions, and the gate that makes openers past it wait.

How many sessions one machine can hold open at once is bounded by several host
resources; each bound is derived from what the host has *now* (at pool start), and the
smallest wins:

    descriptors  the supervisor's RLIMIT_NOFILE (raised to what the host allows first,
                 `raise_fd_limit`), less what is open, a reserve, the cgroup files of
                 the first PoolConfig.dense_after cells and RUNS_HEADROOM runs in
                 flight; then FDS_PER_SESSION each: a session between runs holds its
                 cell's session socket, nothing else, once the pool is dense
    memory       MemAvailable less a reserve, at PoolConfig.session_memory_mb each
    pids         kernel.pid_max (and threads-max) less what runs, 2 per session (the
                 cell's init and the candidate it forks ahead)
    namespaces   the per-user namespace limits (/proc/sys/user/max_*_namespaces), 2 per
                 session (the cell's, and a run's user namespace)
    uids         PoolConfig.uid_count (each open session holds one)

The memory bound is an estimate made at start (`session_memory_mb` each), and a
session's real cost grows with density (1.5 MiB each at 3,000 live here, ~2.5 MiB at
7,900: kernel slab and the supervisor's own objects grow faster than linearly, and at
7,883 live sessions MemAvailable was down to 2.9 GB — the 10,000 the estimate allowed
would have run the host out of memory). So past `MEMORY_CHECK_AFTER` open sessions,
`Admission.enter` also looks at MemAvailable itself (at most every `MEMORY_CHECK_S`): below
the floor (`memory_floor_bytes`: the larger of 1 GiB and 10 % of MemTotal) an opener
waits as it would past capacity, until a session closes.

`PoolConfig.capacity` overrides the derivation. Past capacity, `Admission.enter` waits in
FIFO order for a session to close, up to `PoolConfig.capacity_wait_s`, then raises
`Unavailable` naming the bound and what to change: work queues, it does not fail as
`infra` (3,000 sessions on a 20,000-descriptor limit did, before).
"""

from __future__ import annotations

import asyncio
import os
import resource
import time
from collections import deque
from dataclasses import dataclass

from trialbox.errors import Unavailable

FDS_PER_SESSION = 1
"""Descriptors an open session holds between runs on a dense pool: its cell's session
socket (which also carries the cell's status records), or none when parked."""
CELL_FILES_FDS = 10
"""A cell with its cgroup files open (9 on cgroup v1) and its socket."""
RUN_FDS = 16
"""Descriptors a run holds at most while it starts (stdin, two pipes, three workspace
trees, the cgroup files reopened); 11 while it runs."""
RUNS_HEADROOM = 256
"""Runs in flight at once the descriptor bound leaves room for (past it, a run that
cannot get its pipes ends as `infra`: keep runs in flight below it, or raise the host's
RLIMIT_NOFILE)."""
FD_RESERVE = 2048
"""Descriptors kept for everything else the process does (journal, sockets, logs)."""
PIDS_PER_SESSION = 2
PID_RESERVE = 4096
"""Pids left to the rest of the host (other users, the runs' own children)."""
MEMORY_RESERVE_FRACTION = 0.1
"""Share of MemAvailable never planned for sessions (runs' own memory, page cache)."""
NAMESPACES_PER_SESSION = 2
MEMORY_CHECK_AFTER = 256
"""Open sessions past which each opener also checks MemAvailable (below it, the start
path stays a counter)."""
MEMORY_CHECK_S = 0.25
"""How long one MemAvailable reading stands (a read of /proc/meminfo costs ~30 µs)."""
FD_TARGET = 1 << 20
"""RLIMIT_NOFILE asked for at start (capped by fs.nr_open): enough for any capacity the
other bounds allow, and free until descriptors are actually opened."""


def _read_int(path: str, default: int) -> int:
    try:
        with open(path) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return default


def _mem_available() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def memory_floor_bytes() -> int:
    """MemAvailable below which no new session opens: 1 GiB or 10 % of MemTotal."""
    total = 0
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    total = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    return max(1 << 30, total // 10)


def raise_fd_limit(target: int = FD_TARGET) -> tuple[int, int]:
    """Raise this process's RLIMIT_NOFILE soft limit towards `target`: past the hard
    limit too where the host allows it (root with CAP_SYS_RESOURCE, up to fs.nr_open),
    else up to the hard limit. Never lowers it. Returns the (soft, hard) in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(target, _read_int("/proc/sys/fs/nr_open", 1 << 20))
    if soft >= want:
        return soft, hard
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, max(hard, want)))
    except (ValueError, OSError):
        if soft < hard:
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            except (ValueError, OSError):
                pass
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft, hard


def _open_fds() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 64


def _tasks_running() -> int:
    """Threads on the host now (each takes a pid)."""
    try:
        with open("/proc/loadavg") as f:
            return int(f.read().split()[3].split("/")[1])
    except (OSError, ValueError, IndexError):
        return 0


def _namespaces_left() -> int:
    kinds = ("net", "pid", "user", "ipc", "uts", "mnt")
    return min(_read_int(f"/proc/sys/user/max_{k}_namespaces", 1 << 20) for k in kinds)


@dataclass(frozen=True)
class Capacity:
    """How many sessions a pool allows open at once, and why."""

    sessions: int
    """The capacity: the smallest bound, or the configured value."""
    limit: str
    """What sets it: "configured", or the name of the smallest bound."""
    bounds: dict[str, int]
    """Each host bound in sessions (descriptors, memory, pids, namespaces, uids)."""
    fd_limit: int
    """The supervisor's RLIMIT_NOFILE soft limit once raised."""

    def describe(self) -> str:
        parts = ", ".join(f"{k} {v:,}" for k, v in sorted(self.bounds.items()))
        return f"{self.sessions:,} sessions ({self.limit}; host bounds: {parts})"


def derive_capacity(configured: int | None, session_memory_mb: float,
                    uid_count: int, dense_after: int = 256) -> Capacity:
    """The host's bounds on open sessions now (see the module docstring), and the
    capacity: `configured` if set, else the smallest bound (at least 1)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    fds = max(0, soft - _open_fds() - FD_RESERVE - dense_after * CELL_FILES_FDS
              - RUNS_HEADROOM * RUN_FDS) // FDS_PER_SESSION
    mem = int(_mem_available() * (1 - MEMORY_RESERVE_FRACTION)
              / (session_memory_mb * (1 << 20)))
    pid_room = min(_read_int("/proc/sys/kernel/pid_max", 32768),
                   _read_int("/proc/sys/kernel/threads-max", 1 << 22))
    pids = max(0, pid_room - _tasks_running() - PID_RESERVE) // PIDS_PER_SESSION
    bounds = {"descriptors": fds, "memory": mem, "pids": pids,
              "namespaces": _namespaces_left() // NAMESPACES_PER_SESSION,
              "uids": uid_count}
    if configured is not None:
        return Capacity(configured, "configured", bounds, soft)
    limit = min(bounds, key=lambda k: bounds[k])
    return Capacity(max(1, bounds[limit]), limit, bounds, soft)


class Admission:
    """Counts open sessions against a capacity; `enter` waits (FIFO) when it is full.

    Bound to the event loop that calls it. Uncontended, `enter` is a counter increment
    (nothing on the ~1.6 ms start path)."""

    def __init__(self, capacity: Capacity, wait_s: float,
                 memory_floor: int | None = None):
        self.capacity = capacity
        self.wait_s = wait_s
        self.memory_floor = memory_floor_bytes() if memory_floor is None else memory_floor
        """MemAvailable (bytes) below which openers wait (past MEMORY_CHECK_AFTER open)."""
        self.memory_waits = 0
        """Openers that waited because MemAvailable was below the floor."""
        self._memory_at = -1.0
        self._memory_short = False
        self.open = 0
        self.peak = 0
        self.waited = 0
        """Openers that had to wait (for `trialbox bench density` and the metrics)."""
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def waiting(self) -> int:
        return sum(1 for w in self._waiters if not w.done())

    async def enter(self, timeout: float | None = None) -> None:
        """Take a place, waiting up to `timeout` (default `wait_s`) for one to free."""
        if self._waiters and not self.waiting:
            self._waiters.clear()  # only those that gave up are left
        if self.open < self.capacity.sessions and not self._waiters:
            if not self._short_of_memory():
                self.open += 1
                self.peak = max(self.peak, self.open)
                return
            self.memory_waits += 1
        wait = self.wait_s if timeout is None else timeout
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        self.waited += 1
        t0 = time.monotonic()
        try:
            await asyncio.wait_for(asyncio.shield(fut), wait)
        except TimeoutError:
            if fut.done() and not fut.cancelled():
                return  # handed a place just as the deadline passed: keep it
            fut.cancel()
            memory = (f"; MemAvailable below the floor of {self.memory_floor >> 20:,} MiB"
                      if self._memory_short else "")
            raise Unavailable(
                f"no session place free on this node after {time.monotonic() - t0:.1f} s: "
                f"{self.open:,} open, capacity {self.capacity.describe()}{memory}; close "
                f"sessions sooner, raise PoolConfig.capacity_wait_s ({self.wait_s:g} s) "
                f"or, if the host has room, PoolConfig.capacity") from None
        except BaseException:
            if fut.done() and not fut.cancelled():
                self.leave()  # got a place, but the opener is gone: pass it on
            else:
                fut.cancel()
            raise

    def _short_of_memory(self) -> bool:
        """MemAvailable below the floor, read at most every MEMORY_CHECK_S, and only
        once MEMORY_CHECK_AFTER sessions are open (so there are sessions to wait for)."""
        if self.open < MEMORY_CHECK_AFTER:
            return False
        return self.memory_short()

    def memory_short(self) -> bool:
        """MemAvailable below the floor (read at most every MEMORY_CHECK_S). The pool
        asks it too before it starts a cell past MEMORY_CHECK_AFTER live ones: parked
        sessions hold no cell, and thousands of them running at once must wait for
        cells to come back rather than take the host's last memory."""
        now = time.monotonic()
        if now - self._memory_at >= MEMORY_CHECK_S:
            self._memory_at = now
            avail = _mem_available()  # 0: unreadable (no MemAvailable): no guard
            self._memory_short = 0 < avail < self.memory_floor
        return self._memory_short

    def leave(self) -> None:
        """A session closed: its place goes to the longest waiter, if any."""
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)  # the place passes on: `open` is unchanged
                return
        self.open -= 1
