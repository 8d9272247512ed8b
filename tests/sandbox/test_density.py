"""A node's capacity: many live sessions at few descriptors each, and openers past the
capacity waiting in a queue (then a clear error at their deadline), never failing as
`infra`. The full-size run (10,000 sessions) is `trialbox bench density` (make bench)."""

from __future__ import annotations

import asyncio
import os
import resource

import pytest

from trialbox.bench.density import run_density
from trialbox.errors import Unavailable, UsageError
from trialbox.sandbox import CellPool, NamespaceSandbox, PoolConfig
from trialbox.sandbox.capacity import (
    MEMORY_CHECK_AFTER,
    Admission,
    derive_capacity,
    raise_fd_limit,
)
from trialbox.types import ExecStatus, Limits

FAST = Limits(wall_s=10, memory_mb=64, disk_mb=8)


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_300_live_sessions_each_run_and_hold_one_descriptor():
    """300 sessions open at once, each ran a command and holds its cell; past
    `dense_after` a cell between runs keeps only its session socket, and a second
    command in every one of them still runs (its cgroup files reopened)."""
    async def body():
        pool = await CellPool(PoolConfig(warm=2, dense_after=16)).start()
        try:
            fd0 = _fds()
            sessions = []
            for k in range(0, 300, 30):
                batch = await asyncio.gather(*(NamespaceSandbox.open(pool, FAST)
                                               for _ in range(30)))
                sessions += batch
                rs = await asyncio.gather(*(sb.exec(["python3", "-c", f"print({k + i})"])
                                            for i, sb in enumerate(batch)))
                assert [(r.status, r.stdout) for r in rs] == \
                    [(ExecStatus.OK, f"{k + i}\n".encode()) for i in range(30)]
            assert all(not sb.parked for sb in sessions)  # each holds its cell
            held = _fds() - fd0
            # 16 cells may keep their 10; every other live session holds 1 (11 before)
            assert held <= 300 + 16 * 10 + 20, f"{held} descriptors for 300 live sessions"
            rs = await asyncio.gather(*(sb.exec(["python3", "-c", "print('again')"])
                                        for sb in sessions))
            assert all(r.status is ExecStatus.OK and r.stdout == b"again\n" for r in rs)
            assert all(r.cpu_ms > 0 for r in rs), "measures read from reopened cgroup files"
            for sb in sessions:
                await sb.close()
        finally:
            await pool.close()
    asyncio.run(body())


def test_openers_past_capacity_wait_then_get_in():
    async def body():
        pool = await CellPool(PoolConfig(warm=1, capacity=2, capacity_wait_s=30)).start()
        try:
            assert pool.capacity == 2
            a = await NamespaceSandbox.open(pool, FAST)
            b = await NamespaceSandbox.open(pool, FAST)
            third = asyncio.ensure_future(NamespaceSandbox.open(pool, FAST))
            fourth = asyncio.ensure_future(NamespaceSandbox.open(pool, FAST))
            await asyncio.sleep(0.5)
            assert not third.done() and not fourth.done(), "past capacity: waiting"
            assert pool.admission is not None and pool.admission.waiting == 2
            await a.close()
            c = await asyncio.wait_for(third, 5)  # the first waiter, first
            assert not fourth.done()
            r = await c.exec(["python3", "-c", "print(3)"])
            assert (r.status, r.stdout) == (ExecStatus.OK, b"3\n")
            await b.close()
            d = await asyncio.wait_for(fourth, 5)
            await c.close()
            await d.close()
            assert pool.admission.open == 0
        finally:
            await pool.close()
    asyncio.run(body())


def test_capacity_deadline_is_a_clear_error_and_nothing_half_made():
    async def body():
        pool = await CellPool(PoolConfig(warm=1, capacity=1, capacity_wait_s=0.3)).start()
        try:
            a = await NamespaceSandbox.open(pool, FAST)
            dirs = sorted(os.listdir(pool.sessions_dir))
            with pytest.raises(Unavailable) as e:
                await NamespaceSandbox.open(pool, FAST)
            msg = str(e.value)
            assert "capacity_wait_s" in msg and "PoolConfig.capacity" in msg, msg
            assert sorted(os.listdir(pool.sessions_dir)) == dirs, "no workspace made"
            assert len(pool._uids_in_use) == 1, "no uid taken"
            assert pool.admission is not None and pool.admission.open == 1
            await a.close()
            b = await asyncio.wait_for(NamespaceSandbox.open(pool, FAST), 2)  # a place
            r = await b.exec(["true"])
            assert r.status is ExecStatus.OK
            await b.close()
        finally:
            await pool.close()
    asyncio.run(body())


def test_cancelled_waiter_passes_its_place_on():
    async def body():
        pool = await CellPool(PoolConfig(warm=1, capacity=1, capacity_wait_s=30)).start()
        try:
            a = await NamespaceSandbox.open(pool, FAST)
            gone = asyncio.ensure_future(NamespaceSandbox.open(pool, FAST))
            nxt = asyncio.ensure_future(NamespaceSandbox.open(pool, FAST))
            await asyncio.sleep(0.2)
            gone.cancel()
            await asyncio.sleep(0)
            await a.close()
            b = await asyncio.wait_for(nxt, 5)
            await b.close()
            assert pool.admission is not None and pool.admission.open == 0
        finally:
            await pool.close()
    asyncio.run(body())


def test_derived_capacity_names_its_bounds():
    cap = derive_capacity(None, 1.5, 65_536)
    assert set(cap.bounds) == {"descriptors", "memory", "pids", "namespaces", "uids"}
    assert cap.limit in cap.bounds and cap.sessions == max(1, cap.bounds[cap.limit])
    assert cap.sessions == min(cap.bounds.values()) or cap.sessions == 1
    assert derive_capacity(7, 1.5, 65_536).sessions == 7
    more_memory = derive_capacity(None, 0.5, 65_536).bounds["memory"]
    assert more_memory > cap.bounds["memory"]
    with pytest.raises(UsageError, match="capacity"):
        PoolConfig(capacity=0)


def test_fd_limit_raised_where_allowed_never_lowered():
    before = resource.getrlimit(resource.RLIMIT_NOFILE)
    soft, hard = raise_fd_limit()
    assert soft >= before[0] and hard >= before[1]
    assert soft == hard or soft >= 1 << 20 or soft == int(
        open("/proc/sys/fs/nr_open").read()), "soft raised to the hard limit at least"


def test_density_bench_small():
    """`trialbox bench density` at 200 sessions: none fails, past capacity they wait."""
    out = asyncio.run(run_density(200, concurrency=32, extra=8))
    assert out["ok"], out
    assert out["live"] == 200 and out["failed"] == 0
    assert out["queue"]["waiting_after_0.5s"] == 8 and out["queue"]["started_while_full"] == 0
    assert out["memory_per_session_mib"]["pss_kernel"] > 0
    assert out["second_command"] == {"ran": 200, "failed": 0, "errors": [],
                                     "s": out["second_command"]["s"]}


def test_density_bench_parked_sessions_keep_their_files_and_run_again():
    """--park: each session hands its cell back after its command (what it costs while
    the model thinks), keeps its workspace, and runs again on a fresh cell: the second
    command reads the file the first wrote, in every one of them."""
    out = asyncio.run(run_density(300, concurrency=32, extra=0, park=True))
    assert out["ok"], out
    assert out["second_command"]["ran"] == 300 and out["second_command"]["failed"] == 0
    # a parked session holds no cell: far less than a held one (~1.5 MiB)
    assert out["memory_per_session_mib"]["pss_kernel"] < 0.5, out


def test_openers_wait_when_memory_runs_short_before_the_estimated_capacity():
    """The memory bound is an estimate made at start; past MEMORY_CHECK_AFTER open
    sessions an opener also checks MemAvailable, and below the floor it waits (then gets
    the place a closing session frees) instead of taking the host's last memory. (At
    7,883 live sessions MemAvailable was down to 2.9 GB here, with 10,000 allowed.)"""
    async def body(floor: int) -> tuple[Admission, BaseException | None, bool]:
        cap = derive_capacity(1_000_000, 1.5, 1_000_000)  # far above what is opened
        adm = Admission(cap, wait_s=5, memory_floor=floor)
        for _ in range(MEMORY_CHECK_AFTER):
            await adm.enter()  # below the check: a counter, whatever the memory
        try:
            await adm.enter(timeout=0.2)
            refused = None
        except Unavailable as e:
            refused = e
        waiter = asyncio.ensure_future(adm.enter())
        await asyncio.sleep(0.05)
        adm.leave()  # a session closes: its place (and memory) goes to the waiter
        await asyncio.wait_for(waiter, 2)
        return adm, refused, waiter.done()
    adm, refused, got_in = asyncio.run(body(1 << 62))  # floor above any MemAvailable
    assert isinstance(refused, Unavailable) and "MemAvailable below the floor" in str(refused)
    assert got_in and adm.open == MEMORY_CHECK_AFTER and adm.memory_waits == 2
    adm, refused, got_in = asyncio.run(body(1))  # memory to spare: no wait at all
    assert refused is None and adm.memory_waits == 0 and adm.open == MEMORY_CHECK_AFTER + 1


def test_cells_wait_for_memory_when_parked_sessions_run_at_once():
    """Parked sessions hold no cell, so thousands can be open; if they all run at once,
    each run needs a cell. Past `memory_check_after` live cells with MemAvailable under
    the floor, a run waits for a cell to come back (a session parks) instead of starting
    one more — and after `capacity_wait_s` gets `Unavailable` naming memory, never a
    silent infra result."""
    async def body() -> None:
        pool = await CellPool(PoolConfig(warm=0, capacity=20, capacity_wait_s=2)).start()
        try:
            pool.memory_check_after = 2
            a, b = [await NamespaceSandbox.open(pool, FAST) for _ in range(2)]
            for sb in (a, b):  # each holds a cell: two live
                assert (await sb.exec(["true"])).status is ExecStatus.OK
            assert pool.admission is not None
            pool.admission.memory_floor = 1 << 60  # every reading is "short"
            pool.admission._memory_at = -1.0
            await pool.settle()  # cells already warming when memory ran short finish...
            held = []
            while pool._ready:  # ...and are taken: from here on, a run needs a new one
                held.append(await NamespaceSandbox.open(pool, FAST))
                assert (await held[-1].exec(["true"])).status is ExecStatus.OK
            c = await NamespaceSandbox.open(pool, FAST)
            run_c = asyncio.ensure_future(c.exec(["echo", "c"]))
            await asyncio.sleep(0.5)
            assert not run_c.done()  # no third cell started into short memory
            assert pool.cell_memory_waits == 1
            await a.park()  # a's cell comes back: c runs on it
            r = await asyncio.wait_for(run_c, 10)
            assert r.status is ExecStatus.OK and r.stdout == b"c\n"
            d = await NamespaceSandbox.open(pool, FAST)  # nothing comes back for d
            with pytest.raises(Unavailable, match="no memory for another cell"):
                await d.exec(["true"])
            for sb in (a, b, c, d, *held):
                await sb.close()
        finally:
            await pool.close()
    asyncio.run(body())
