"""Shared fixtures. One event loop and one real sandbox pool serve the whole session
(a pool is bound to the loop it started on); `runner.run(coro)` drives a coroutine.
`load_scaled` is the one home of the suite's wall-time allowances."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

import pytest

from trialbox.sandbox import CellPool, PoolConfig
from trialbox.sandbox.uids import pids_running_as

T = TypeVar("T")

TIME_SCALE = float(os.environ.get("TRIALBOX_TEST_TIME_SCALE", "1"))
"""How many times slower than a normal host this kernel runs programs: 10 in the UML
guest of test_cgroup_v2.py (its syscalls cost ~70x), 1 elsewhere. Scales the time limits
the suites set and the CPU-time bounds they assert."""


def load_scaled(seconds: float) -> float:
    """`seconds` stretched by how slow this machine is now: x TIME_SCALE, and x the run
    queue per core (1-minute load average / cores) when that is above 1.

    For the few wall-time bounds a test must keep (that something ends at all, or ends
    at its limit and not later), which no status or CPU time can show. Everything else
    is asserted from what load cannot change: statuses and their messages, CPU time
    from the cgroup, ordering, bytes. A loaded machine gives a program about
    cores/load of a core, so its wall time grows by load/cores: in CI, at load 8 on 2
    cores, a program needed 4.4 s of wall time to use 1 s of CPU. E.g. `load_scaled(2)`
    is 2.0 on an idle host, 8.0 at load 8 on 2 cores, 20.0 in the idle UML guest.
    """
    per_core = os.getloadavg()[0] / len(os.sched_getaffinity(0))
    return seconds * TIME_SCALE * max(1.0, per_core)


async def eventually(holds: Callable[[], bool], seconds: float, every: float = 0.02) -> bool:
    """Poll `holds()` until it is true or `load_scaled(seconds)` have passed; its last
    value. For waits on background work (a refill, a flush, an answer arriving late):
    they end as soon as it holds, and a loaded host gets them longer."""
    deadline = time.monotonic() + load_scaled(seconds)
    while not holds():
        if time.monotonic() >= deadline:
            return holds()
        await asyncio.sleep(every)
    return True


class Runner:
    def __init__(self, config: PoolConfig | None = None) -> None:
        self.loop = asyncio.new_event_loop()
        self.pool: CellPool = self.run(CellPool(config or PoolConfig(warm=2)).start())

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 120) -> T:
        return self.loop.run_until_complete(asyncio.wait_for(coro, timeout))

    def close(self) -> None:
        self.run(self.pool.close())
        self.loop.close()

    # -- leak checks ------------------------------------------------------------
    def sandbox_processes(self) -> list[int]:
        """Host pids of this pool running as a sandbox uid (a candidate or its children).

        Candidates cannot leave their cell's cgroup, so membership identifies them."""
        assert self.pool.uids is not None
        found = []
        for pid in pids_running_as(self.pool.uids.first, self.pool.uids.count):
            try:  # only this pool's (another test run may share the uids)
                with open(f"/proc/{pid}/cgroup") as g:
                    if self.pool.id in g.read():
                        found.append(pid)
            except OSError:
                pass
        return found

    def stray_cgroups(self) -> list[str]:
        """Cell cgroups of this pool that belong to no live cell."""
        live = set(self.pool._live)
        out = []
        for top in self.pool.cgroups.dirs(f"trialbox/{self.pool.id}"):
            if os.path.isdir(top):
                out += [os.path.join(top, c) for c in os.listdir(top)
                        if os.path.isdir(os.path.join(top, c)) and c not in live]
        return out

    def session_mounts(self) -> list[str]:
        from trialbox.sandbox.mounts import mounts_under
        return mounts_under(self.pool.sessions_dir)

    def assert_no_leaks(self, timeout: float = 5.0) -> None:
        """No sandbox process alive, no stray cgroup, no session mount left (polls: the
        cgroup janitor works in the background; `timeout` is load-scaled)."""
        deadline = time.monotonic() + load_scaled(timeout)
        while True:
            procs, cgs, mnts = (self.sandbox_processes(), self.stray_cgroups(),
                                self.session_mounts())
            if not (procs or cgs or mnts) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert not procs, f"sandbox processes still alive: {procs}"
        assert not cgs, f"cgroups left behind: {cgs} " + "; ".join(
            f"{c}: procs {open(os.path.join(c, 'cgroup.procs')).read().split()}"
            for c in cgs[:1] if os.path.exists(c))
        assert not mnts, f"session mounts left behind: {mnts}"


@pytest.fixture(scope="session")
def runner() -> Iterator[Runner]:
    r = Runner()
    yield r
    r.close()



@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`make test` runs the suite on two pytest-xdist workers: most of its time is spent
    waiting (sandboxes starting, Ray, subprocesses), so two workers on two cores take
    ~0.6 of one's time. Each module goes whole to one worker, so its module- and
    session-scoped fixtures are built once, and tests/cluster is one unit, so its Ray
    clusters never run two at a time (tests/cluster/conftest.py orders them).

    (A scheduler rather than xdist_group marks: xdist's loadgroup renames
    `item._nodeid`, which pytest 9 no longer reads, so the marks group nothing.)"""
    from xdist.scheduler import LoadScopeScheduling

    class ByModule(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "tests/cluster" if path.startswith("tests/cluster/") else path

    return ByModule(config, log)
