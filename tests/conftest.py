"""Shared fixtures. One event loop and one real sandbox pool serve the whole session
(a pool is bound to the loop it started on); `runner.run(coro)` drives a coroutine."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

import pytest

from trialbox.sandbox import CellPool, PoolConfig

T = TypeVar("T")


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
        lo = self.pool.config.uid_base
        hi = lo + self.pool.config.uid_count
        found = []
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/status") as f:
                    for line in f:
                        if line.startswith("Uid:"):
                            if any(lo <= int(u) < hi for u in line.split()[1:]):
                                # only this pool's (another test run may share the uids)
                                with open(f"/proc/{name}/cgroup") as g:
                                    if self.pool.id in g.read():
                                        found.append(int(name))
                            break
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
        cgroup janitor works in the background)."""
        deadline = time.monotonic() + timeout
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
