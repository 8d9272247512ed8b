"""The warm pool: warm cells, growth and shrinkage, zygote death, orphan reaping."""

from __future__ import annotations

import ast
import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests.conftest import eventually
from tests.sandbox.conftest import processes_in_cgroup
from trialbox.sandbox import CellPool, NamespaceSandbox, PoolConfig
from trialbox.sandbox.mounts import mounts_under
from trialbox.types import ExecStatus, Limits

FAST = Limits(wall_s=3, memory_mb=128, disk_mb=16)


def test_pool_keeps_cells_warm_and_grows_with_demand(runner):
    pool = runner.pool

    async def body():
        assert await eventually(lambda: pool.ready_count >= pool.config.warm, 2)  # refilled
        sessions = [await NamespaceSandbox.open(pool, FAST) for _ in range(6)]
        results = await asyncio.gather(*(sb.exec(["python3", "-c", "print(7)"])
                                         for sb in sessions))
        assert all(r.status is ExecStatus.OK and r.stdout == b"7\n" for r in results)
        assert pool.target() >= 6, "six sessions at once: the pool aims for six warm cells"
        for sb in sessions:
            await sb.close()
        await eventually(lambda: pool.ready_count >= 6, 4)
        return pool.ready_count
    assert runner.run(body()) >= 6
    runner.assert_no_leaks()


def test_pool_shrinks_after_demand_falls():
    async def body():
        pool = await CellPool(PoolConfig(warm=1, max_warm=8, shrink_after_s=0.3)).start()
        try:
            sessions = [await NamespaceSandbox.open(pool, FAST) for _ in range(5)]
            await asyncio.gather(*(sb.exec(["true"]) for sb in sessions))
            for sb in sessions:
                await sb.close()
            grown = pool.target()
            await asyncio.sleep(0.5)
            sb = await NamespaceSandbox.open(pool, FAST)  # a new demand reading
            await sb.exec(["true"])
            await sb.close()
            return grown, pool.target(), pool.ready_count
        finally:
            await pool.close()
    grown, target, ready = asyncio.run(body())
    assert grown >= 5
    assert target == 1 and ready <= 2, (target, ready)


def test_taking_and_handing_back_cells_does_not_churn_the_pool():
    """A judge's pattern: four sessions at a time, each opened, run once and closed
    (its cell reset and handed back). The pool refills from a low-water mark, so a cell
    taken for a moment does not start a warm-up whose cell is then discarded: cells
    are made for the first sessions, then only recycled."""
    async def one(pool):
        async with await NamespaceSandbox.open(pool, FAST) as sb:
            await sb.exec(["true"])

    async def body():
        pool = await CellPool(PoolConfig(warm=4, max_warm=8)).start()
        try:
            await pool.settle(5)
            for _ in range(10):
                await asyncio.gather(*(one(pool) for _ in range(4)))
            await pool.settle(5)
            return pool._seq
        finally:
            await pool.close()
    made = asyncio.run(body())
    assert made <= 12, f"{made} cells made for 40 sessions of 4 at a time"


def test_settle_tops_the_pool_up_between_its_low_water_mark_and_target():
    """Refilling starts only below the low-water mark, so a pool with one cell taken
    (3 of 4 ready, the session still open) does not refill by itself; `settle()`
    (benchmarks call it between measurements) must bring it back to `warm` itself, not
    sit out its timeout with 3 ready: the count shows which, however loaded the host."""
    async def body():
        pool = await CellPool(PoolConfig(warm=4, max_warm=4)).start()
        try:
            await pool.settle(30)
            async with await NamespaceSandbox.open(pool, FAST) as sb:
                await sb.exec(["true"])  # the session holds a cell now: 3 ready
                assert pool.ready_count == 3
                await pool.settle(30)  # ample for one cell's start on a loaded host
                return pool.ready_count
        finally:
            await pool.close()
    assert asyncio.run(body()) == 4


def test_zygote_death_is_infra_then_recovers(runner):
    """Killing the fork server mid-session is the machinery failing: the run in flight
    reports `infra` (never a candidate status), and the next run gets a new cell from a
    restarted zygote, with the session's files intact."""
    pool = runner.pool

    async def body():
        async with await NamespaceSandbox.open(pool, FAST) as sb:
            await sb.write_file("keep.txt", b"kept")
            first = await sb.exec(["sleep", "0.01"])
            assert first.status is ExecStatus.OK
            task = asyncio.ensure_future(sb.exec(["sleep", "2"]))
            await asyncio.sleep(0.3)
            os.kill(pool.zygote.proc.pid, signal.SIGKILL)
            during = await task
            after = await sb.exec(["cat", "keep.txt"])
            return during, after
    during, after = runner.run(body())
    assert during.status is ExecStatus.INFRA, during
    assert after.status is ExecStatus.OK and after.stdout == b"kept", after
    assert pool.zygote_restarts >= 1
    runner.assert_no_leaks()


ORPHAN_MAKER = textwrap.dedent("""
    import asyncio, sys
    from trialbox.sandbox import CellPool, PoolConfig, NamespaceSandbox
    from trialbox.types import Limits
    async def main():
        pool = await CellPool(PoolConfig(warm=2)).start()
        sb = await NamespaceSandbox.open(pool, Limits(wall_s=60, disk_mb=8))
        await sb.write_file("f", b"x")
        print(pool.id, flush=True)
        await sb.exec(["sleep", "60"])
    asyncio.run(main())
""")


def test_orphans_of_a_killed_pool_are_reaped(tmp_path):
    """kill -9 the process that owns a pool mid-run: its processes die with it, and the
    next pool's start removes the cgroups and mounts it left."""
    script = tmp_path / "orphan.py"
    script.write_text(ORPHAN_MAKER)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    pool_id = proc.stdout.readline().strip()
    assert pool_id, "the orphan maker did not start"
    time.sleep(0.3)
    proc.kill()
    proc.wait()
    state = os.path.join(PoolConfig().state_dir, pool_id)
    assert os.path.isdir(state) and mounts_under(state), "the dead pool should leave state"

    async def body():
        pool = await CellPool(PoolConfig(warm=0)).start()
        await pool.close()
        return pool.reaped
    reaped = asyncio.run(body())
    assert reaped["mounts"] >= 1 and reaped["cgroups"] >= 1, reaped
    assert not os.path.exists(state)
    assert not mounts_under(state)
    for ctrl in ("memory", "pids", "cpu", "cpuacct"):
        assert not os.path.exists(f"/sys/fs/cgroup/{ctrl}/trialbox/{pool_id}")
    # the killed pool's sandboxes died with it (parent-death signals down the chain)
    alive = processes_in_cgroup(pool_id)
    assert not alive, alive


@pytest.mark.parametrize("native", ["on", "off"])
def test_a_reset_keeps_a_network_namespace_only_when_it_holds_nothing(native: str) -> None:
    """Creating a network namespace costs ~3 ms of kernel CPU, so a reset keeps the old
    one when no TCP socket (TIME_WAIT included) is left in it, and makes a new one
    otherwise; the IPC namespace is always new."""
    probe = "import os; print(os.readlink('/proc/self/ns/net'), os.readlink('/proc/self/ns/ipc'))"
    tcp = ("import socket; a = socket.socket(); a.bind(('127.0.0.1', 4243)); a.listen();"
           "c = socket.create_connection(('127.0.0.1', 4243)); s, _ = a.accept();"
           "s.close(); c.close(); a.close()")

    async def session(pool, *codes):
        async with await NamespaceSandbox.open(pool, FAST) as sb:
            out = [await sb.exec(["python3", "-c", code]) for code in codes]
            assert all(r.status is ExecStatus.OK for r in out), out
            return [r.stdout.decode().split() for r in out], sb.cell

    async def body():
        pool = await CellPool(PoolConfig(warm=1, max_warm=1, native=native)).start()
        try:
            (a,), cell = await session(pool, probe)
            (b,), cell_b = await session(pool, probe)            # no TCP in between
            (c, _), cell_c = await session(pool, probe, tcp)     # leaves TIME_WAIT
            (d, _), cell_d = await session(pool, probe, tcp)     # a new one, loopback up
            assert cell is cell_b is cell_c is cell_d, "expected one recycled cell"
            return a, b, c, d
        finally:
            await pool.close()
    a, b, c, d = asyncio.run(body())
    assert b[0] == a[0] and b[1] != a[1], (a, b)   # same net ns, new IPC ns
    assert c[0] == b[0]
    assert d[0] != c[0] and d[1] != c[1], (c, d)   # TCP state left: both new


@pytest.mark.parametrize("native", ["on", "off"])
def test_a_recycled_cell_carries_nothing_to_the_next_session(native: str) -> None:
    """A session that closes cleanly hands its cell back, reset: the next session on the
    same cell finds no process, no file, no SysV IPC object and no socket of the last."""
    leave_behind = textwrap.dedent("""
        import ctypes, os, socket, subprocess
        libc = ctypes.CDLL(None, use_errno=True)
        shm = libc.shmget(0x7B, 4096, 0o1666)          # IPC_CREAT | 0666
        assert shm >= 0, os.strerror(ctypes.get_errno())
        a = socket.socket(); a.bind(("127.0.0.1", 4242)); a.listen()
        c = socket.create_connection(("127.0.0.1", 4242)); s, _ = a.accept()
        s.close(); c.close(); a.close()                 # leaves TIME_WAIT behind
        u = socket.socket(socket.AF_UNIX); u.bind("\\0trialbox-abstract"); u.listen()
        subprocess.Popen(["sleep", "60"], start_new_session=True)
        open("/workspace/left", "w").write("x"); open("/tmp/left", "w").write("x")
        print(shm)
    """)
    probe = textwrap.dedent("""
        import ctypes, os, socket
        libc = ctypes.CDLL(None, use_errno=True)
        print("shm", libc.shmget(0x7B, 4096, 0o666))    # -1: no such segment
        a = socket.socket(); a.bind(("127.0.0.1", 4242)); print("bind ok")
        u = socket.socket(socket.AF_UNIX); u.bind("\\0trialbox-abstract"); print("abs ok")
        print("procs", sorted(p for p in os.listdir("/proc") if p.isdigit()))
        print("files", os.listdir("/workspace"), os.listdir("/tmp"))
    """)

    async def body():
        pool = await CellPool(PoolConfig(warm=1, max_warm=1, native=native)).start()
        try:
            async with await NamespaceSandbox.open(pool, FAST) as a:
                r1 = await a.exec(["python3", "-c", leave_behind])
                first_cell = a.cell
            async with await NamespaceSandbox.open(pool, FAST) as b:
                r2 = await b.exec(["python3", "-c", probe])
                same = b.cell is first_cell
            return r1, r2, same, first_cell.uses
        finally:
            await pool.close()
    r1, r2, same, uses = asyncio.run(body())
    assert r1.status is ExecStatus.OK, r1
    assert same and uses >= 1, "the second session should have reused the reset cell"
    assert r2.status is ExecStatus.OK, r2
    lines = r2.stdout.decode().splitlines()
    assert lines[0] == "shm -1" and lines[1:3] == ["bind ok", "abs ok"], lines
    procs = ast.literal_eval(lines[3].split(" ", 1)[1])
    assert len(procs) <= 2, f"only the probe itself (and its pid) may be seen: {procs}"
    assert lines[4] == "files [] []", lines



def test_the_pool_is_the_namespace_tiers_sandbox_provider(runner):
    """DESIGN.md decision 8: upper layers ask a provider; the pool is the namespace one."""
    from trialbox.sandbox.base import SandboxProvider

    pool = runner.pool
    assert isinstance(pool, SandboxProvider) and pool.tier == "namespace"

    async def body():
        async with await pool.open(Limits(wall_s=5)) as sb:
            r = await sb.exec(["python3", "-c", "print(6 * 7)"])
            return sb.tier, sb.limits.wall_s, r
    tier, wall_s, r = runner.run(body())
    assert (tier, wall_s, r.stdout) == ("namespace", 5, b"42\n")
    assert r.runtime == pool.runtime.id
