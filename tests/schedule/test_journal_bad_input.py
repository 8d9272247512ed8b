"""Bad input to the journal: a missing, foreign, corrupt or truncated file, unknown run
and task ids, and a disk that fills up while the scheduler writes. Each gives a clear
error; the records already there stay intact."""

from __future__ import annotations

import asyncio
import os
import resource
import shutil
import signal
import sqlite3
import subprocess
import sys

import pytest

from tests.schedule.journal_checks import check_journal
from trialbox.errors import UsageError
from trialbox.sandbox.fake import FakeSandbox
from trialbox.schedule.quotas import Capacity
from trialbox.schedule.scheduler import Scheduler, SchedulerConfig, TaskContext, TaskSpec
from trialbox.store.journal import Journal, JournalError
from trialbox.store.records import Records

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


async def _job(ctx: TaskContext) -> float | None:
    await ctx.record_turn({"turn": 0})
    return 0.5


async def _opener(limits):
    return FakeSandbox(limits=limits)


def make_journal(path: str, run: str = "before", n: int = 5) -> None:
    async def body():
        with Journal(path) as j:
            cfg = SchedulerConfig(capacity=Capacity(64, 1 << 20, 1 << 20))
            async with Scheduler(j, run, _job, cfg, opener=_opener) as s:
                await s.submit([TaskSpec(f"{run}-{i}") for i in range(n)])
                await s.drain()
    asyncio.run(body())


def test_missing_journal_is_a_usage_error_and_is_not_created(tmp_path):
    path = str(tmp_path / "nope.db")
    with pytest.raises(UsageError, match="no journal at"):
        Records(path)
    assert not os.path.exists(path)
    with pytest.raises(UsageError, match="does not exist"):
        Journal(str(tmp_path / "no-such-dir" / "j.db"))


def test_garbage_foreign_and_truncated_files_are_refused_untouched(tmp_path):
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not a database\n" * 100)
    foreign = str(tmp_path / "foreign.db")
    c = sqlite3.connect(foreign)
    c.execute("CREATE TABLE mine (x)")
    c.execute("INSERT INTO mine VALUES (42)")
    c.commit()
    c.close()
    good = str(tmp_path / "good.db")
    make_journal(good)
    truncated = tmp_path / "truncated.db"
    data = open(good, "rb").read()
    truncated.write_bytes(data[: len(data) // 2])
    for path, what in ((str(garbage), "cannot be opened"),
                       (foreign, "not a trialbox journal"),
                       (str(truncated), "corrupt|cannot be opened|not a trialbox")):
        before = open(path, "rb").read()
        for opener in (Journal, Records):
            with pytest.raises(JournalError, match=what):
                opener(path)
        assert open(path, "rb").read() == before, f"{path} was changed"
    c = sqlite3.connect(foreign)
    assert c.execute("SELECT x FROM mine").fetchall() == [(42,)]


def test_unknown_run_and_task_ids(tmp_path):
    path = str(tmp_path / "j.db")
    make_journal(path)
    with Records(path) as r:
        with pytest.raises(UsageError, match="no run 'ghost'; runs in it: before"):
            r.counts("ghost")
        with pytest.raises(UsageError, match="no task 'ghost'"):
            r.history("ghost")
        with pytest.raises(UsageError, match="in run 'other'"):
            r.history("before-1", run_id="other")
        assert r.counts("before") == {"done": 5}


def _limit_file_size(limit: int):
    def pre() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of death
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return pre


def test_full_disk_while_journaling_stops_cleanly_and_keeps_records(tmp_path):
    path = str(tmp_path / "j.db")
    make_journal(path)  # a finished run that must survive
    with sqlite3.connect(path) as c:
        c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    snapshot = str(tmp_path / "before-copy.db")
    shutil.copyfile(path, snapshot)
    limit = os.path.getsize(path) + 256 * 1024
    proc = subprocess.run([sys.executable, "-m", "tests.schedule.fulldisk_worker", path],
                          cwd=ROOT, capture_output=True, text=True, timeout=120,
                          preexec_fn=_limit_file_size(limit))
    assert proc.returncode == 3, (proc.stdout, proc.stderr[-2000:])
    assert "write failed" in proc.stdout and "records already committed are intact" \
        in proc.stdout and "Free disk space" in proc.stdout, proc.stdout
    # the earlier run is exactly as it was; the interrupted one is consistent so far
    with Records(path) as r:
        assert r.counts("before") == {"done": 5}
        assert [h.result for h in r.history("before-0")] == [
            {"attempt": 1, "state": "done", "reward": 0.5, "cause": ""}]
        assert r.counts("big")  # the big run got partly recorded
    check_journal(path, "before", {f"before-{i}" for i in range(5)})
    check_journal(path, "big", all_final=False)
    c = sqlite3.connect(path)
    assert c.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    old = sqlite3.connect(snapshot)
    q = "SELECT * FROM transitions WHERE run_id='before' ORDER BY seq"
    assert c.execute(q).fetchall() == old.execute(q).fetchall()
