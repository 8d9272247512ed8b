"""Snapshots and forks of namespace-tier sessions, for real (docs/snapshots.md).

Forks are isolated from each other and from the snapshot, outlive their parent, start
from a session snapshotted mid-episode, are bounded by their own disk_mb, and leave
nothing behind (mounts, fds, processes, cgroups) when closed or killed.
"""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import Iterator

import pytest

from trialbox.errors import UsageError
from trialbox.sandbox import PoolConfig
from trialbox.sandbox.mounts import WorkspaceFull, mounts_under
from trialbox.types import ExecStatus, Limits
from tests.conftest import Runner

LIM = Limits(wall_s=30, cpu_s=30, memory_mb=256, disk_mb=32, output_bytes=1 << 16)
PY = "python3"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def snap_runner() -> Iterator[Runner]:
    r = Runner(PoolConfig(warm=2))
    yield r
    r.close()


def out(r) -> str:
    assert r.status is ExecStatus.OK, (r.status, r.message, r.stderr[-800:])
    return r.stdout.decode()


def overlays_of(runner: Runner) -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return [line for line in f if " - overlay " in line and runner.pool.id in line]


def mount_fds() -> list[int]:
    """Our fds that hold a detached mount (a frozen layer, a fork's upper): directories
    whose path reads "/" (the root of a mount in no namespace)."""
    found = []
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}") == "/" and \
                    stat.S_ISDIR(os.fstat(int(name)).st_mode) and \
                    os.fstat(int(name)).st_dev != os.stat("/").st_dev:
                found.append(int(name))
        except OSError:
            pass
    return found


def test_forks_are_isolated_from_each_other_and_from_the_snapshot(snap_runner):
    async def body():
        pool = snap_runner.pool
        async with await pool.open(LIM) as sb:
            await sb.write_file("a.txt", b"base")
            await sb.write_file("d/keep.txt", b"keep")
            out(await sb.exec([PY, "-c", "open('/tmp/t', 'w').write('tmp');"
                               "open('b.txt', 'w').write('from a run')"]))
            async with await sb.snapshot() as snap:
                forks = await snap.fork(3)
                # each fork changes, deletes and renames things of the snapshot
                for i, f in enumerate(forks):
                    out(await f.exec([PY, "-c", f"""
import os
open('a.txt', 'a').write('-{i}')
os.remove('b.txt')
os.rename('d', 'd{i}')
open('/tmp/t', 'w').write('tmp{i}')
open('own{i}', 'w').write('x')
"""]))
                for i, f in enumerate(forks):
                    assert await f.read_file("a.txt") == f"base-{i}".encode()
                    assert await f.list_files() == sorted(["a.txt", f"d{i}/keep.txt",
                                                           f"own{i}"])
                    assert out(await f.exec(["cat", "/tmp/t"])) == f"tmp{i}"
                # the parent's writes after the snapshot reach no fork
                await sb.write_file("a.txt", b"parent-after")
                out(await sb.exec([PY, "-c", "open('late', 'w').write('1')"]))
                # a fork opened now still starts from the snapshot as it was taken
                async with await pool.open(LIM, from_snapshot=snap) as fresh:
                    assert await fresh.list_files() == ["a.txt", "b.txt", "d/keep.txt"]
                    assert await fresh.read_file("a.txt") == b"base"
                    assert out(await fresh.exec(["cat", "/tmp/t", "b.txt"])) == \
                        "tmpfrom a run"
                for f in forks:
                    assert "late" not in await f.list_files()
                    await f.close()
            assert await sb.read_file("a.txt") == b"parent-after"
            assert await sb.list_files() == ["a.txt", "b.txt", "d/keep.txt", "late"]
    snap_runner.run(body())


def test_a_fork_outlives_its_parent_and_the_snapshot_and_forks_again(snap_runner):
    async def body():
        pool = snap_runner.pool
        sb = await pool.open(LIM)
        await sb.write_file("a.txt", b"1")
        await sb.write_file("gone.txt", b"g")
        [child] = await sb.fork(1)  # snapshot, fork, snapshot released
        await sb.close()
        out(await child.exec([PY, "-c", "import os; open('a.txt', 'a').write('2');"
                              "os.remove('gone.txt'); os.mkdir('sub');"
                              "open('sub/x', 'w').write('x')"]))
        grandchildren = await child.fork(2)  # a snapshot of a fork: two layers
        await child.close()
        for i, g in enumerate(grandchildren):
            assert await g.list_files() == ["a.txt", "sub/x"]  # the deletion holds
            assert out(await g.exec([PY, "-c", f"open('a.txt', 'a').write('{i}');"
                                     "print(open('a.txt').read())"])) == f"12{i}\n"
        assert len(grandchildren[0].layers) == 2
        for g in grandchildren:
            await g.close()
    snap_runner.run(body())


def test_snapshot_mid_episode_then_eight_continuations(snap_runner):
    """An episode prepares its state over two runs (a module it wrote, data a run
    computed, a file in /tmp), is snapshotted, and 8 forks each run a different
    continuation concurrently: each sees the prepared state and only its own work."""
    async def body():
        pool = snap_runner.pool
        async with await pool.open(LIM) as sb:
            await sb.write_file("lib.py", b"def f(x):\n    return 3 * x + 1\n")
            out(await sb.exec([PY, "-c", "import json, lib;"
                               "json.dump([lib.f(i) for i in range(100)],"
                               " open('table.json', 'w'))"]))
            out(await sb.exec([PY, "-c", "open('/tmp/seed', 'w').write('7')"]))
            forks = await sb.fork(8)
        try:
            prog = ("import json, lib, sys\n"
                    "k = int(sys.argv[1])\n"
                    "t = json.load(open('table.json'))\n"
                    "seed = int(open('/tmp/seed').read())\n"
                    "open('table.json', 'w').write('clobbered by %d' % k)\n"
                    "print(t[k] + seed + lib.f(k))\n")
            results = await asyncio.gather(*(
                f.exec([PY, "-c", prog, str(k)]) for k, f in enumerate(forks)))
            for k, r in enumerate(results):
                assert out(r) == f"{(3 * k + 1) * 2 + 7}\n"
            for k, f in enumerate(forks):
                assert await f.read_file("table.json") == f"clobbered by {k}".encode()
        finally:
            for f in forks:
                await f.close()
    snap_runner.run(body())


def test_disk_mb_bounds_what_a_fork_writes_not_what_it_starts_with(snap_runner):
    async def body():
        pool = snap_runner.pool
        async with await pool.open(LIM.with_(disk_mb=64)) as sb:
            out(await sb.exec([PY, "-c", "open('big', 'wb').write(b'x' * (24 << 20))"]))
            async with await sb.snapshot() as snap:
                small = LIM.with_(disk_mb=8)
                async with await snap.open(small) as f:
                    # 24 MiB to start with, in an 8 MiB fork: reading costs nothing
                    assert out(await f.exec([PY, "-c", "print(len(open('big', 'rb')"
                                             ".read()))"])) == f"{24 << 20}\n"
                    # within the limit, writes go through; past it, the run is `disk`
                    out(await f.exec([PY, "-c", "open('ok', 'wb').write(b'o' * (2 << 20))"]))
                    r = await f.exec([PY, "-c", "open('new', 'wb').write(b'y' * (12 << 20))"])
                    assert r.status is ExecStatus.DISK, (r.status, r.message)
                    with pytest.raises(WorkspaceFull):
                        await f.write_file("w.bin", b"z" * (12 << 20))
                    out(await f.exec(["rm", "new"]))
                    # changing the big file copies it up: 24 MiB written, past 8. The
                    # kernel drops a copy-up that does not fit, so the workspace is not
                    # left full: the run fails on ENOSPC (status `exit`, not `disk`)
                    r = await f.exec([PY, "-c", "open('big', 'ab').write(b'!')"])
                    assert r.status in (ExecStatus.EXIT, ExecStatus.DISK), r.status
                    assert b"No space left on device" in r.stderr, r.stderr
                    assert out(await f.exec([PY, "-c", "import os;"
                                             "print(os.path.getsize('big'))"])) == \
                        f"{24 << 20}\n"
                async with await snap.open(LIM.with_(disk_mb=40)) as roomy:
                    out(await roomy.exec([PY, "-c", "open('big', 'ab').write(b'!')"]))
                    assert len(await roomy.read_file("big", max_bytes=32 << 20)) == \
                        (24 << 20) + 1
    snap_runner.run(body())


def test_bad_input_says_what_to_change(snap_runner):
    async def body():
        pool = snap_runner.pool
        sb = await pool.open(LIM)
        snap = await sb.snapshot()
        await sb.close()
        with pytest.raises(UsageError, match="closed session.*before close"):
            await sb.snapshot()
        with pytest.raises(UsageError, match="closed session"):
            await sb.fork(2)
        for n in (0, -1, 2.0, True):
            with pytest.raises(UsageError, match="n must be an int >= 1"):
                await snap.fork(n)
        await snap.close()
        with pytest.raises(UsageError, match="snapshot .* is closed"):
            await snap.open()
        with pytest.raises(UsageError, match="snapshot .* is closed"):
            await pool.open(LIM, from_snapshot=snap)
    snap_runner.run(body())


def test_nothing_is_left_after_close_or_after_a_killed_session(snap_runner):
    async def body():
        pool = snap_runner.pool
        sb = await pool.open(LIM)
        out(await sb.exec([PY, "-c", "open('a', 'w').write('a')"]))
        snap = await sb.snapshot()
        forks = await snap.fork(3)
        out(await forks[0].exec(["cat", "a"]))
        assert len(set(mount_fds()) - before) == 5  # a layer, the parent's and 3 forks' uppers
        assert overlays_of(snap_runner)  # the forks and the parent stand on overlays
        # kill one fork's whole cell in the middle of a run
        victim = forks[1]
        run = asyncio.ensure_future(victim.exec([PY, "-c", "import time; time.sleep(300)"]))
        for _ in range(3000):  # until the program runs (a kill before would be retried)
            if victim._current is not None and victim._current.started:
                break
            await asyncio.sleep(0.01)
        assert victim.cell is not None and not run.done()
        pool.cgroups.kill_all(victim.cell.rel)  # every process of the cell, its init too
        r = await asyncio.wait_for(run, 10)
        assert r.status is not ExecStatus.OK
        await victim.close()
        await sb.close()
        for f in forks:
            await f.close()
        await snap.close()
    # Detached mounts this process held before (the repository judge's cached snapshots
    # of the task trees, on a judge pool of an earlier test module) are not this test's.
    before = set(mount_fds())
    snap_runner.run(body())
    snap_runner.assert_no_leaks()
    assert not overlays_of(snap_runner)
    assert not mounts_under(snap_runner.pool.sessions_dir)
    # every frozen layer and fork upper was a detached mount held by an fd: all closed
    assert not set(mount_fds()) - before


def test_the_namespace_tier_has_the_optional_capability(snap_runner):
    from trialbox.sandbox.base import Sandbox, SessionSnapshot, Snapshottable

    async def body():
        async with await snap_runner.pool.open(LIM) as sb:
            assert isinstance(sb, Sandbox) and isinstance(sb, Snapshottable)
            async with await sb.snapshot() as snap:
                assert isinstance(snap, SessionSnapshot) and snap.tier == sb.tier
    snap_runner.run(body())


KILLED_SUPERVISOR = r"""
import asyncio, os, sys
from trialbox.sandbox import CellPool, PoolConfig
from trialbox.types import Limits

async def main():
    pool = await CellPool(PoolConfig(warm=1, native="off", state_dir=sys.argv[1])).start()
    sb = await pool.open(Limits(wall_s=5, disk_mb=16))
    await sb.write_file("a", b"a")
    forks = await sb.fork(2)
    r = await forks[0].exec(["cat", "a"])
    assert r.stdout == b"a", r
    print(pool.id, flush=True)
    os.kill(os.getpid(), 9)

asyncio.run(main())
"""


def test_a_killed_supervisor_leaves_nothing_a_new_pool_does_not_reap(tmp_path):
    """Layers and uppers are fds: the kernel frees them with the process. The sessions'
    overlays are session mounts under the pool's state dir, reaped by the next pool."""
    import subprocess
    import sys

    state = str(tmp_path / "state")
    proc = subprocess.run([sys.executable, "-c", KILLED_SUPERVISOR, state],
                          capture_output=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=REPO))
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    dead = proc.stdout.decode().strip()
    left = mounts_under(os.path.join(state, dead))
    assert len(left) >= 3, left  # the parent's and the two forks' overlays, at least
    runner = Runner(PoolConfig(warm=1, native="off", state_dir=state))
    try:
        assert runner.pool.reaped["mounts"] >= 3, runner.pool.reaped
        assert not mounts_under(os.path.join(state, dead))
        assert not os.path.exists(os.path.join(state, dead))
    finally:
        runner.close()


def test_open_sandbox_from_a_snapshot(snap_runner):
    from trialbox.sandbox import open_sandbox

    async def body():
        pool = snap_runner.pool
        async with await pool.open(LIM) as sb:
            await sb.write_file("a", b"prepared")
            async with await sb.snapshot() as snap:
                async with await open_sandbox(from_snapshot=snap, limits=LIM) as f:
                    assert await f.read_file("a") == b"prepared"
                with pytest.raises(UsageError, match="tier='namespace'"):
                    await open_sandbox("gvisor", from_snapshot=snap)
    snap_runner.run(body())
