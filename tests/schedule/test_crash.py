"""kill -9 for real: a run of 400 tasks in a subprocess is killed with SIGKILL at random
moments, several times, and restarted. Every task ends in a final state exactly once,
the journal agrees with the results, no job ever started before its move was journaled,
and no turn was recorded twice."""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import time

from tests.schedule.crash_worker import reward_of
from tests.schedule.journal_checks import check_journal

N = 400
KILLS = 4
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def start(db: str, effects: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "tests.schedule.crash_worker", db,
                             str(N), effects], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_kill_9_mid_run_several_times_then_finish(tmp_path):
    db, effects = str(tmp_path / "journal.db"), str(tmp_path / "effects.log")
    rng = random.Random(int(time.time()))
    killed_mid_run = 0
    for _ in range(KILLS):
        proc = start(db, effects)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("READY"), (line, proc.stderr.read() if proc.stderr else "")
        time.sleep(rng.uniform(0.05, 0.5))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            killed_mid_run += 1
        proc.wait()
        proc.stdout.close()
        assert proc.stderr is not None
        proc.stderr.close()
    assert killed_mid_run >= 2, "the run finished before it could be killed"
    proc = start(db, effects)
    out, err = proc.communicate(timeout=90)
    assert proc.returncode == 0 and "FINISHED" in out, err[-2000:]

    finals = check_journal(db, "crash", {f"t{i}" for i in range(N)})
    assert finals == {f"t{i}": ("done", reward_of(f"t{i}")) for i in range(N)}
    c = sqlite3.connect(db)
    crashes = c.execute("SELECT count(*) FROM transitions WHERE cause='crash'").fetchone()[0]
    assert crashes > 0, "no task was in flight at a kill"
    # journaled before it took effect: every job start has its GENERATING row
    generating = set(c.execute("SELECT task_id, attempt FROM transitions "
                               "WHERE new='generating'").fetchall())
    starts = set()
    with open(effects) as f:
        for line in f:
            parts = line.split()
            if len(parts) == 3 and parts[0] == "start" and parts[2].isdigit():
                starts.add((parts[1], int(parts[2])))
    assert starts and starts <= generating, sorted(starts - generating)[:5]
    # turns: exactly two per task, none duplicated (resumed tasks continued, not redid)
    per_task = c.execute("SELECT count(*), count(DISTINCT task_id) FROM turns").fetchone()
    assert per_task == (2 * N, N)
    assert c.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
