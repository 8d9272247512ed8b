"""kill -9 a scheduler whose episodes are running real programs in namespace sandboxes,
then restart it: the dead process's sandboxes are reaped (its processes die with it; the
next pool's start removes its cgroups and mounts), the tasks that were in flight are
retried in new sessions from their journaled turns, and every task ends once."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time

from tests.sandbox.conftest import processes_in_cgroup
from tests.schedule.journal_checks import check_journal
from trialbox.sandbox import PoolConfig
from trialbox.sandbox.cgroups import CgroupDriver
from trialbox.sandbox.mounts import mounts_under

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
N = 6


def start(db: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "tests.schedule.crash_worker_real", db,
                             str(N)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_kill_9_with_real_sandboxes_reaps_and_resumes(tmp_path):
    db = str(tmp_path / "journal.db")
    proc = start(db)
    assert proc.stdout is not None and proc.stderr is not None
    line = proc.stdout.readline().split()
    assert line and line[0] == "READY", proc.stderr.read()
    dead_pool = line[1]
    # wait until some episode is mid-way (a turn journaled), then kill
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with sqlite3.connect(db) as c:
            if c.execute("SELECT count(*) FROM turns").fetchone()[0] >= 2:
                break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    proc.stderr.close()

    proc = start(db)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and "FINISHED" in out, err[-3000:]

    assert check_journal(db, "real-crash") == {f"e{i}": ("done", 1.0) for i in range(N)}
    c = sqlite3.connect(db)
    assert c.execute("SELECT count(*) FROM transitions WHERE cause='crash'").fetchone()[0] > 0
    assert c.execute("SELECT count(*) FROM turns").fetchone()[0] == 2 * N
    state = os.path.join(PoolConfig().state_dir, dead_pool)
    assert not os.path.exists(state) and not mounts_under(state)
    cgroup_dirs = CgroupDriver.detect().dirs(f"trialbox/{dead_pool}")
    assert cgroup_dirs and not any(os.path.exists(d) for d in cgroup_dirs)
    assert not processes_in_cgroup(dead_pool)
