"""JournalSubmissions behaves like the service's in-memory Submissions log (same calls,
same answers) and keeps its rows across a restart."""

from __future__ import annotations

import pytest

from trialbox.errors import UsageError
from trialbox.service.state import Submissions
from trialbox.store.journal import Journal
from trialbox.store.records import Records
from trialbox.store.submissions import JournalSubmissions


def test_same_answers_as_the_in_memory_log(tmp_path):
    durable = JournalSubmissions(str(tmp_path / "j.db"), keep=3)
    memory = Submissions(keep=3)
    for log in (durable, memory):
        ids = [log.new_id() for _ in range(5)]
        assert len(set(ids)) == 5
        for i, sid in enumerate(["a", "b", "c", "d"]):
            log.put(sid, {"sid": sid, "i": i, "nested": {"ok": True}})
        log.put("b", {"sid": "b", "i": 9, "nested": {"ok": False}})  # replaced, newest
    for log in (durable, memory):
        assert len(log) == 3
        assert [r["sid"] for r in log.recent()] == ["b", "d", "c"]
        assert [r["sid"] for r in log.recent(2)] == ["b", "d"]
        assert log.get("b")["i"] == 9
        with pytest.raises(UsageError, match="no submission 'a'"):
            log.get("a")  # dropped: older than the last 3


def test_rows_survive_a_restart_and_share_the_journal_file(tmp_path):
    path = str(tmp_path / "j.db")
    log = JournalSubmissions(path)
    log.put("s1", {"outcome": "passed", "reward": 1.0})
    log.close()
    again = JournalSubmissions(path)
    assert len(again) == 1 and again.get("s1") == {"outcome": "passed", "reward": 1.0}
    assert again.new_id() != again.new_id()
    again.close()
    Journal(path).close()  # still a valid journal for the scheduler
    with Records(path) as r:
        assert r.runs() == []
    with pytest.raises(UsageError, match="keep"):
        JournalSubmissions(path, keep=0)
