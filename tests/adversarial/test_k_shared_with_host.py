"""Class K of issue 28: what sandboxes share with the host and with each other, on the
real namespace tier (docs/adversary.md, section K).

Two kinds of sharing, each an attack a red team ran against main before the fix:

* per-user kernel budgets: sessions of two processes that each start a pool ran as the
  same host uid (both pools counted from one base), so one session shrank the other's
  pipes. Host uids are now leased per node (uids.py).
* the runtime's inodes: /usr, the root template and the /dev nodes were the host's (or
  the pool's) own inodes, so inotify watched other sessions' and the host's opens,
  flock passed bits between sessions, fadvise(DONTNEED) emptied the host's page cache of
  the runtime and sync() flushed every host filesystem.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

from tests.conftest import load_scaled

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# ------------------------------------------------ class 2: a host uid per session, node-wide

POOL_PROCESS = textwrap.dedent("""
    import asyncio, json, sys
    from trialbox.sandbox import run_code
    from trialbox.sandbox.pool import CellPool, PoolConfig

    async def main(grid, lease_dir, sessions, hold):
        if grid:
            from trialbox.sandbox import uids
            uids.NODE_BASE, uids.MAX_UID = grid, grid + 16 * uids.BLOCK
        config = PoolConfig(warm=1, **({"uid_lease_dir": lease_dir} if lease_dir else {}))
        pool = await CellPool(config).start()
        seen, held = [], []
        for _ in range(sessions):
            sb = await pool.open()
            held.append(sb)
            # the host uid the candidate runs as: its user namespace's map, read inside
            r = await run_code(sb, "print(open('/proc/self/uid_map').read().split()[1])")
            seen.append(int(r.stdout))
        if hold:  # a run in flight when the process is killed
            task = asyncio.ensure_future(held[0].exec(["sleep", "600"]))
            await asyncio.sleep(0.3)
        print(json.dumps(seen), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        for sb in held:
            await sb.close()
        await pool.close()

    asyncio.run(main(*json.loads(sys.argv[1])))
""")


def _pool_process(grid=0, lease_dir="", sessions=3, hold=False):
    """A separate process that starts a pool, opens `sessions` sessions and prints the
    host uids their candidates ran as; it holds them until its stdin closes."""
    p = subprocess.Popen([sys.executable, "-c", POOL_PROCESS,
                          json.dumps([grid, lease_dir, sessions, hold])],
                         cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    line = p.stdout.readline()
    assert line, f"the pool process failed (exit {p.wait()})"
    return p, json.loads(line)


def _end(p):
    if p.poll() is None:
        p.stdin.close()
        try:
            p.wait(timeout=load_scaled(30))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    p.stdout.close()


def test_two_processes_pools_never_share_a_host_uid():
    """Two processes on one node, each with a pool, sessions live in both at once: no
    host uid in common (before: both handed out 1000000, 1000001, ...)."""
    a, uids_a = _pool_process()
    try:
        b, uids_b = _pool_process()
        try:
            assert len(set(uids_a)) == len(uids_a) and len(set(uids_b)) == len(uids_b)
            assert not set(uids_a) & set(uids_b), (uids_a, uids_b)
            assert all(u >= 65_536 for u in uids_a + uids_b)
        finally:
            _end(b)
    finally:
        _end(a)


def _running_as(lo, hi):
    out = []
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/status") as f:
                uid_line = next(line for line in f if line.startswith("Uid:"))
        except (OSError, StopIteration):
            continue
        if any(lo <= int(u) < hi for u in uid_line.split()[1:]):
            out.append(int(name))
    return out


def test_a_killed_pool_process_gives_its_uids_back(tmp_path):
    """SIGKILL to a process whose pool has a run in flight: once its sandboxes are gone,
    the next pool on the node gets the same uids (a private grid, far above every uid
    in use, so other pools on this machine cannot take them first)."""
    from trialbox.sandbox.uids import BLOCK
    grid, leases = 900_000_000, str(tmp_path / "leases")
    a, uids_a = _pool_process(grid, leases, sessions=1, hold=True)
    assert grid <= uids_a[0] < grid + BLOCK
    assert _running_as(grid, grid + BLOCK), "the run in flight should run as the lease"
    a.send_signal(signal.SIGKILL)
    a.wait()
    a.stdout.close()
    a.stdin.close()
    deadline = time.monotonic() + load_scaled(30)
    while _running_as(grid, grid + BLOCK) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running_as(grid, grid + BLOCK), "the killed pool's sandboxes outlived it"
    c, uids_c = _pool_process(grid, leases, sessions=1)
    try:
        assert grid <= uids_c[0] < grid + BLOCK, (uids_a, uids_c)
    finally:
        _end(c)
