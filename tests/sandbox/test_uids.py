"""The node's uid leases (uids.py): disjoint across holders, freed by a holder's death,
never handed out while a process still runs under one of their uids.

Each test leases from a private directory and a grid far above every uid in use, so
pools of other processes on this machine (which lease the real grid) change nothing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from trialbox.errors import SandboxUnavailable
from trialbox.sandbox import uids

BASE = 900_000_000


@pytest.fixture()
def grid(tmp_path, monkeypatch):
    monkeypatch.setattr(uids, "NODE_BASE", BASE)
    monkeypatch.setattr(uids, "MAX_UID", BASE + 64 * uids.BLOCK)
    d = tmp_path / "leases"
    return str(d)


def test_leases_are_disjoint_and_a_closed_one_is_reused(grid):
    a = uids.lease(10, grid)
    b = uids.lease(uids.BLOCK + 1, grid)  # two blocks
    assert (a.first, a.count) == (BASE, uids.BLOCK)
    assert (b.first, b.count) == (BASE + uids.BLOCK, 2 * uids.BLOCK)
    assert a.first + a.count <= b.first
    a.close()
    with uids.lease(1, grid) as c:
        assert c.first == BASE
    b.close()
    b.close()  # twice: harmless


def test_a_killed_holders_block_is_free_again(grid):
    """SIGKILL, no clean-up: the kernel drops the flock, the next lease gets the block."""
    code = textwrap.dedent(f"""
        import sys, time
        from trialbox.sandbox import uids
        uids.NODE_BASE, uids.MAX_UID = {BASE}, {BASE + 64 * uids.BLOCK}
        lease = uids.lease(1, {grid!r})
        print(lease.first, flush=True)
        time.sleep(600)
    """)
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        first = int(holder.stdout.readline())
        assert first == BASE
        with uids.lease(1, grid) as other:  # held by a live process: the next block
            assert other.first == BASE + uids.BLOCK
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        holder.stdout.close()
    with uids.lease(1, grid) as again:
        assert again.first == BASE


def _killed_holder(grid):
    """A process that leases the first block and dies by SIGKILL, holding it."""
    code = textwrap.dedent(f"""
        import time
        from trialbox.sandbox import uids
        uids.NODE_BASE, uids.MAX_UID = {BASE}, {BASE + 64 * uids.BLOCK}
        print(uids.lease(1, {grid!r}).first, flush=True)
        time.sleep(600)
    """)
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert int(holder.stdout.readline()) == BASE
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    holder.stdout.close()


def test_a_dead_holders_block_is_skipped_while_a_process_runs_as_its_uid(grid):
    """A dead holder's sandbox not yet reaped keeps its block out of the next lease."""
    _killed_holder(grid)
    straggler = subprocess.Popen(["sleep", "600"], user=BASE + 7, group=BASE + 7)
    try:
        with uids.lease(1, grid) as lease:
            assert lease.first == BASE + uids.BLOCK
    finally:
        straggler.kill()
        straggler.wait()
    with uids.lease(1, grid) as lease:
        assert lease.first == BASE


def test_a_block_given_back_is_leased_again_without_a_scan(grid, monkeypatch):
    """Only a block whose holder died costs the /proc scan."""
    with uids.lease(1, grid):
        pass

    def scan(first, count):
        raise AssertionError("scanned a block given back cleanly")
    monkeypatch.setattr(uids, "_uids_running", scan)
    with uids.lease(1, grid) as lease:
        assert lease.first == BASE


def test_a_lease_directory_others_can_write_is_refused(grid):
    os.makedirs(grid, mode=0o700)
    os.chmod(grid, 0o777)
    with pytest.raises(SandboxUnavailable, match="writable by no one else"):
        uids.lease(1, grid)


def test_a_full_grid_is_a_clear_error(grid, monkeypatch):
    from trialbox.errors import SandboxStartError
    monkeypatch.setattr(uids, "MAX_UID", BASE + 2 * uids.BLOCK)
    with uids.lease(1, grid), uids.lease(1, grid):
        with pytest.raises(SandboxStartError, match="all leased by live pools"):
            uids.lease(1, grid)
