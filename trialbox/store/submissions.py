"""`JournalSubmissions`: the service's `SubmissionLog` (trialbox/service/state.py) kept in
a journal file, so graded `/v1/submissions` rows survive a restart of the server.

    log = JournalSubmissions("trialbox.db", keep=100_000)
    sid = log.new_id(); log.put(sid, row); log.get(sid); log.recent(20); len(log)

Same behaviour as the in-memory `Submissions`: `put` of an existing id replaces it and
makes it the newest; at most `keep` rows are kept (oldest dropped); `get` of an unknown id
is a UsageError naming it. The table lives beside the scheduler's in the same SQLite file
(created on first use); the store layer does not import the service — the protocol is
structural.
"""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from typing import Any

from trialbox.errors import UsageError
from trialbox.store.journal import JournalError, connect, dumps

SCHEMA = """CREATE TABLE IF NOT EXISTS submissions (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, sid TEXT NOT NULL UNIQUE, at REAL NOT NULL,
    row TEXT NOT NULL)"""


class JournalSubmissions:
    def __init__(self, path: str, keep: int | None = None):
        if keep is not None and keep < 1:
            raise UsageError(f"keep must be at least 1 (or None for all), got {keep}")
        self.path = path
        self.keep = keep
        self.conn = connect(path, readonly=False)
        self._exec(SCHEMA)
        self._n: int = self._exec("SELECT count(*) FROM submissions").fetchone()[0]

    def _exec(self, sql: str, args: tuple[Any, ...] = ()) -> sqlite3.Cursor:
        try:
            return self.conn.execute(sql, args)
        except sqlite3.Error as e:
            raise JournalError(f"journal {self.path!r}: submissions: {e}; the rows already "
                               "written are intact") from e

    def new_id(self) -> str:
        # Random, not a counter: ids must not repeat across restarts of the server.
        return f"sub-{uuid.uuid4().hex[:16]}"

    def put(self, sid: str, row: dict[str, Any]) -> None:
        data = dumps(row)
        self._exec("BEGIN IMMEDIATE")
        try:
            replaced = self._exec("DELETE FROM submissions WHERE sid=?", (sid,)).rowcount
            self._exec("INSERT INTO submissions (sid, at, row) VALUES (?, ?, ?)",
                       (sid, time.time(), data))
            n = self._n + 1 - replaced
            if self.keep is not None and n > self.keep:
                self._exec("DELETE FROM submissions WHERE seq IN (SELECT seq FROM "
                           "submissions ORDER BY seq LIMIT ?)", (n - self.keep,))
                n = self.keep
            self._exec("COMMIT")
            self._n = n
        except BaseException:
            if self.conn.in_transaction:
                self.conn.execute("ROLLBACK")
            raise

    def get(self, sid: str) -> dict[str, Any]:
        r = self._exec("SELECT row FROM submissions WHERE sid=?", (sid,)).fetchone()
        if r is None:
            kept = f"the last {self.keep} this server keeps" if self.keep else "this journal"
            raise UsageError(f"no submission {sid!r} (unknown, or not in {kept})")
        row: dict[str, Any] = json.loads(r[0])
        return row

    def recent(self, n: int = 50) -> list[dict[str, Any]]:
        """The newest `n` rows, newest first."""
        return [json.loads(r[0]) for r in self._exec(
            "SELECT row FROM submissions ORDER BY seq DESC LIMIT ?", (max(0, n),))]

    def __len__(self) -> int:
        return self._n

    def close(self) -> None:
        self.conn.close()
