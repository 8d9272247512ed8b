"""The scheduler's journal: runs, tasks, transitions, turns, grades and results in SQLite
(WAL mode), written *before* what they record takes effect.

Write path (the scheduler's): `stage_*` methods add rows to the current batch and return
the batch's commit future; the batch is committed as one transaction once per event-loop
tick (the flush is scheduled with `call_soon` by the first row of a batch, so every task
that moves in the same tick shares one commit). A caller that awaits the future knows its
rows are in the database file's write-ahead log before it acts on them. If the commit
fails (disk full, I/O error) the whole batch is rolled back, every waiter gets the same
`JournalError`, and the rows already committed stay intact.

Durability: with `durable=False` (default, `synchronous=NORMAL`) a committed batch
survives the death of the process (kill -9: the WAL is in the OS page cache) but the last
batches may be lost if the *machine* loses power; `durable=True` (`synchronous=FULL`)
fsyncs every commit and survives that too, at the cost of one fsync per tick.

Read path: `load_run()` for recovery; everything else is in `records.py`.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import enum
import json
import os
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from trialbox.errors import InfraError, UsageError
from trialbox.types import TaskState

SCHEMA_VERSION = 1
APP_ID = 0x7472626A  # "trbj": marks a SQLite file as a trialbox journal

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY, created REAL NOT NULL, config TEXT NOT NULL DEFAULT '{}');
CREATE TABLE IF NOT EXISTS tasks (
    run_id TEXT NOT NULL, task_id TEXT NOT NULL, priority INTEGER NOT NULL,
    submitted REAL NOT NULL, trace_id TEXT NOT NULL, payload TEXT NOT NULL,
    PRIMARY KEY (run_id, task_id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS transitions (
    seq INTEGER PRIMARY KEY, run_id TEXT NOT NULL, task_id TEXT NOT NULL,
    attempt INTEGER NOT NULL, old TEXT NOT NULL, new TEXT NOT NULL, at REAL NOT NULL,
    sandbox TEXT NOT NULL, runtime TEXT NOT NULL, trace_id TEXT NOT NULL,
    cause TEXT NOT NULL, message TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS turns (
    run_id TEXT NOT NULL, task_id TEXT NOT NULL, idx INTEGER NOT NULL,
    attempt INTEGER NOT NULL, at REAL NOT NULL, data TEXT NOT NULL,
    PRIMARY KEY (run_id, task_id, idx)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS grades (
    run_id TEXT NOT NULL, task_id TEXT NOT NULL, attempt INTEGER NOT NULL,
    at REAL NOT NULL, data TEXT NOT NULL,
    PRIMARY KEY (run_id, task_id, attempt)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS results (
    run_id TEXT NOT NULL, task_id TEXT NOT NULL, attempt INTEGER NOT NULL,
    state TEXT NOT NULL, reward REAL, at REAL NOT NULL, cause TEXT NOT NULL,
    PRIMARY KEY (run_id, task_id)) WITHOUT ROWID;
"""
# `transitions` is append-only with no secondary index, and a task's current state is not
# stored anywhere else: it is its last transition. Each commit then writes only the tail
# pages of one b-tree, which is what makes a journal write cost a few microseconds per
# transition (an UPDATE of a per-task row plus two indexes cost ~30 µs: random pages).
# Reads (recovery, `trialbox tasks`) scan a run's transitions instead; see task_states().
#
# `results` holds exactly one row per task: its final state and reward (NULL when the
# task is excluded: infra, timeout, cancel). Its primary key makes a second final
# outcome for a task impossible at the database level, not only in our code.

TABLES = ("runs", "tasks", "transitions", "turns", "grades", "results")


class JournalError(InfraError):
    """The journal cannot be written or read (disk full, I/O error, corrupt file). The
    message names the file and says what to do; rows already committed are intact."""


def to_jsonable(obj: Any) -> Any:
    """Plain JSON data from a dataclass (e.g. `Turn`, `Grade`, `ExecResult`), enum,
    bytes (UTF-8 text, or `{"b64": ...}`), tuple, dict or scalar."""
    if hasattr(obj, "to_json") and callable(obj.to_json):
        return to_jsonable(obj.to_json())
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, (bytes, bytearray)):
        try:
            return bytes(obj).decode("utf-8")
        except UnicodeDecodeError:
            return {"b64": base64.b64encode(obj).decode()}
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    raise UsageError(f"cannot record a {type(obj).__name__} as JSON; give a dict, a "
                     "dataclass or plain values")


def dumps(obj: Any) -> str:
    return json.dumps(to_jsonable(obj), separators=(",", ":"), allow_nan=False)


MEMORY = ":memory:"
"""The path of a journal that lives in this process only (`trialbox eval` without
--db): the same scheduler and records, nothing left on disk."""


def connect(path: str, *, readonly: bool) -> sqlite3.Connection:
    """Open `path` as a trialbox journal, checking that it is one. A missing file is
    created only when writing; a foreign or corrupt file is refused with a JournalError.
    `MEMORY` opens a new, private in-memory journal."""
    if path == MEMORY and not readonly:
        conn = sqlite3.connect(MEMORY, isolation_level=None, check_same_thread=False)
        conn.executescript(SCHEMA)
        conn.execute(f"PRAGMA application_id={APP_ID}")
        conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        return conn
    if readonly:
        if not os.path.exists(path):
            raise UsageError(f"no journal at {path!r}; pass the journal file of a run "
                             "(--db PATH)")
        uri = f"file:{os.path.abspath(path)}?mode=ro"
    else:
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(parent):
            raise UsageError(f"cannot create the journal {path!r}: directory {parent!r} "
                             "does not exist")
        uri = f"file:{os.path.abspath(path)}"
    try:
        existed = os.path.exists(path) and os.path.getsize(path) > 0
        conn = sqlite3.connect(uri, uri=True, isolation_level=None,
                               check_same_thread=False)
        app_id = conn.execute("PRAGMA application_id").fetchone()[0]
        if existed or readonly:
            names = {r[0] for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type='table'")}
            if app_id != APP_ID or not set(TABLES) <= names:
                conn.close()
                raise JournalError(f"{path!r} is a SQLite file but not a trialbox journal "
                                   "(or one missing its tables); pass the right file, or "
                                   "move this one aside to start a new journal")
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                conn.close()
                raise JournalError(f"journal {path!r} has schema version {version}, newer "
                                   f"than this trialbox understands ({SCHEMA_VERSION}); "
                                   "upgrade trialbox")
            check = conn.execute("PRAGMA quick_check").fetchone()[0]
            if check != "ok":
                conn.close()
                raise JournalError(f"journal {path!r} is corrupt ({check}); keep a copy, "
                                   "then recover what sqlite3 '.recover' can or start anew")
        if not readonly:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA busy_timeout=5000")
            if not existed:
                conn.executescript(SCHEMA)
                conn.execute(f"PRAGMA application_id={APP_ID}")
                conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        return conn
    except sqlite3.DatabaseError as e:
        raise JournalError(f"journal {path!r} cannot be opened: {e} (corrupt, truncated or "
                           "not a database); move it aside or pass the right file") from e


@dataclass
class CurrentState:
    """A task's state, derived from its transitions."""

    state: str = "pending"
    attempt: int = 1
    infra_failures: int = 0
    preemptions: int = 0
    first_at: float = 0.0
    last_at: float = 0.0


def task_states(conn: sqlite3.Connection, run_id: str,
                task_id: str | None = None) -> dict[str, CurrentState]:
    """{task_id: its current state} from one scan of the run's transitions in order."""
    out: dict[str, CurrentState] = {}
    sql = ("SELECT task_id, attempt, new, at, cause FROM transitions WHERE run_id=?"
           + (" AND task_id=?" if task_id is not None else "") + " ORDER BY seq")
    args = (run_id, task_id) if task_id is not None else (run_id,)
    for tid, attempt, new, at, cause in conn.execute(sql, args):
        st = out.get(tid)
        if st is None:
            st = out[tid] = CurrentState(first_at=at)
        st.state, st.attempt, st.last_at = new, attempt, at
        if cause == "infra" and new in ("retrying", "failed"):
            st.infra_failures += 1
        elif new == "preempted":
            st.preemptions += 1
    return out


@dataclass
class StoredTask:
    """A task as the journal last recorded it (for recovery)."""

    task_id: str
    priority: int
    state: TaskState
    attempt: int
    infra_failures: int
    preemptions: int
    submitted: float
    trace_id: str
    payload: Any
    turns: int


class Journal:
    """The write side. One per process; use from one event loop (its thread)."""

    def __init__(self, path: str, *, durable: bool = False):
        self.path = path
        self.conn = connect(path, readonly=False)
        self.conn.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
        self._transitions: list[tuple[Any, ...]] = []
        self._turns: list[tuple[Any, ...]] = []
        self._grades: list[tuple[Any, ...]] = []
        self._results: list[tuple[Any, ...]] = []
        self._waiters: list[asyncio.Future[None]] = []
        self.broken: JournalError | None = None
        """Set at the first failed commit; every later write raises it."""
        self.commits = 0
        self.rows = 0

    # -- immediate writes (submission) -------------------------------------------------
    def add_run(self, run_id: str, config: dict[str, Any] | None = None) -> None:
        """Record a run (idempotent: an existing run keeps its first config)."""
        self._write(lambda c: c.execute(
            "INSERT OR IGNORE INTO runs VALUES (?, ?, ?)",
            (run_id, time.time(), dumps(config or {}))))

    def add_tasks(self, run_id: str, rows: Sequence[tuple[str, int, str, Any]],
                  at: float) -> set[str]:
        """Record new tasks as PENDING: rows of (task_id, priority, trace_id, payload).
        Idempotent: tasks the run already has are left as they are; returns the ids
        that were new."""
        ids = [r[0] for r in rows]
        known: set[str] = set()
        for i in range(0, len(ids), 500):
            chunk = ids[i:i + 500]
            marks = ",".join("?" * len(chunk))
            known.update(r[0] for r in self.conn.execute(
                f"SELECT task_id FROM tasks WHERE run_id=? AND task_id IN ({marks})",
                (run_id, *chunk)))
        new = [(run_id, tid, prio, at, trace, dumps(payload))
               for tid, prio, trace, payload in rows if tid not in known]
        born = [(run_id, r[1], 1, "", "pending", at, "", "", r[4], "submit", "")
                for r in new]

        def body(c: sqlite3.Connection) -> None:
            c.executemany("INSERT INTO tasks VALUES (?,?,?,?,?,?)", new)
            c.executemany("INSERT INTO transitions (run_id, task_id, attempt, old, new, at, "
                          "sandbox, runtime, trace_id, cause, message) "
                          "VALUES (?,?,?,?,?,?,?,?,?,?,?)", born)
        self._write(body)
        return {r[1] for r in new}

    # -- staged writes (group commit) --------------------------------------------------
    def stage_transition(self, run_id: str, task_id: str, attempt: int, old: str, new: str,
                         at: float, *, sandbox: str = "", runtime: str = "",
                         trace_id: str = "", cause: str = "",
                         message: str = "") -> asyncio.Future[None]:
        self._transitions.append((run_id, task_id, attempt, old, new, at, sandbox, runtime,
                                  trace_id, cause, message))
        return self._pending()

    def stage_turn(self, run_id: str, task_id: str, idx: int, attempt: int,
                   data: Any) -> asyncio.Future[None]:
        self._turns.append((run_id, task_id, idx, attempt, time.time(), dumps(data)))
        return self._pending()

    def stage_grade(self, run_id: str, task_id: str, attempt: int,
                    data: Any) -> asyncio.Future[None]:
        self._grades.append((run_id, task_id, attempt, time.time(), dumps(data)))
        return self._pending()

    def stage_result(self, run_id: str, task_id: str, attempt: int, state: str,
                     reward: float | None, cause: str) -> asyncio.Future[None]:
        """A task's one final outcome. Staged together with its final transition, so the
        two commit (or fail) as one."""
        self._results.append((run_id, task_id, attempt, state, reward, time.time(), cause))
        return self._pending()

    def _pending(self) -> asyncio.Future[None]:
        # One future per waiter, not one per batch: cancelling a waiter (a preempted job)
        # cancels the future it awaits, and must not cancel its batch-mates' waits.
        if self.broken is not None:
            raise self.broken
        loop = asyncio.get_running_loop()
        if not self._waiters:
            loop.call_soon(self.flush)
        fut: asyncio.Future[None] = loop.create_future()
        self._waiters.append(fut)
        return fut

    def flush(self) -> None:
        """Commit the staged rows as one transaction and resolve the batch's futures."""
        waiters, self._waiters = self._waiters, []
        batch = (self._transitions, self._turns, self._grades, self._results)
        self._transitions, self._turns = [], []
        self._grades, self._results = [], []
        err: JournalError | None = self.broken
        if err is None and any(batch):
            try:
                self._commit(*batch)
            except JournalError as e:
                err = e
        for fut in waiters:
            if fut.done():  # its waiter was cancelled; the rows are committed all the same
                continue
            if err is None:
                fut.set_result(None)
            else:
                fut.set_exception(err)
                fut.exception()  # retrieved here too: not every future is awaited

    def _commit(self, transitions: list[tuple[Any, ...]], turns: list[tuple[Any, ...]],
                grades: list[tuple[Any, ...]], results: list[tuple[Any, ...]]) -> None:
        def body(c: sqlite3.Connection) -> None:
            if transitions:
                c.executemany("INSERT INTO transitions (run_id, task_id, attempt, old, "
                              "new, at, sandbox, runtime, trace_id, cause, message) "
                              "VALUES (?,?,?,?,?,?,?,?,?,?,?)", transitions)
            if turns:
                c.executemany("INSERT INTO turns VALUES (?,?,?,?,?,?)", turns)
            if grades:
                c.executemany("INSERT OR REPLACE INTO grades VALUES (?,?,?,?,?)", grades)
            if results:
                # A plain INSERT: a second final outcome for a task violates the primary
                # key and rolls the whole batch back rather than being silently dropped.
                c.executemany("INSERT INTO results VALUES (?,?,?,?,?,?,?)", results)
        self._write(body)
        self.commits += 1
        self.rows += len(transitions) + len(turns) + len(grades) + len(results)

    def _write(self, body: Any) -> None:
        if self.broken is not None:
            raise self.broken
        try:
            self.conn.execute("BEGIN IMMEDIATE")
            try:
                body(self.conn)
                self.conn.execute("COMMIT")
            except BaseException:
                if self.conn.in_transaction:
                    self.conn.execute("ROLLBACK")
                raise
        except sqlite3.IntegrityError as e:
            # A second final outcome for a task, or a task recorded twice: a bug upstream.
            # Stop here rather than let memory and journal disagree.
            self.broken = JournalError(
                f"journal {self.path!r}: a write broke an invariant ({e}); the batch was "
                "rolled back, the records already committed are intact")
            raise self.broken from e
        except sqlite3.Error as e:
            self.broken = JournalError(
                f"journal {self.path!r}: write failed ({e}); the batch was rolled back and "
                "the records already committed are intact. Free disk space or fix the "
                "file system, then start again: the run resumes from the journal")
            raise self.broken from e

    def flush_now(self) -> None:
        """Commit whatever is staged, outside the loop's tick (shutdown, tests)."""
        if (self._waiters or self._transitions or self._turns or self._results
                or self._grades):
            self.flush()

    # -- recovery ----------------------------------------------------------------------
    def load_run(self, run_id: str) -> list[StoredTask]:
        """Every task of `run_id` as last journaled, in submission order."""
        turns = dict(self.conn.execute(
            "SELECT task_id, count(*) FROM turns WHERE run_id=? GROUP BY task_id",
            (run_id,)).fetchall())
        states = task_states(self.conn, run_id)
        out = []
        for tid, prio, submitted, trace, payload in self.conn.execute(
                "SELECT task_id, priority, submitted, trace_id, payload FROM tasks "
                "WHERE run_id=? ORDER BY submitted, task_id", (run_id,)):
            st = states.get(tid)
            if st is None:
                raise JournalError(f"journal {self.path!r}: task {tid!r} of run {run_id!r} "
                                   "has no transitions (the file was edited or is damaged)")
            try:
                state = TaskState(st.state)
            except ValueError:
                raise JournalError(f"journal {self.path!r}: task {tid!r} of run {run_id!r} "
                                   f"is in an unknown state {st.state!r} (written by "
                                   "another trialbox version, or edited)") from None
            out.append(StoredTask(tid, prio, state, st.attempt, st.infra_failures,
                                  st.preemptions, submitted, trace, json.loads(payload),
                                  turns.get(tid, 0)))
        return out

    def run_config(self, run_id: str) -> dict[str, Any] | None:
        """The config a run was recorded with (`add_run`), or None: no such run."""
        row = self.conn.execute("SELECT config FROM runs WHERE run_id=?",
                                (run_id,)).fetchone()
        return None if row is None else dict(json.loads(row[0]))

    def grades_of(self, run_id: str,
                  task_id: str | None = None) -> dict[tuple[str, int], Any]:
        """{(task_id, attempt): grade data} of a run (or of one of its tasks)."""
        sql = "SELECT task_id, attempt, data FROM grades WHERE run_id=?"
        args: tuple[str, ...] = (run_id,)
        if task_id is not None:
            sql, args = sql + " AND task_id=?", (run_id, task_id)
        return {(tid, attempt): json.loads(data)
                for tid, attempt, data in self.conn.execute(sql, args)}

    def results_of(self, run_id: str) -> dict[str, tuple[str, int, float | None, str]]:
        """{task_id: (final state, attempt, reward, cause)} of a run's final tasks."""
        return {tid: (state, attempt, reward, cause) for tid, state, attempt, reward, cause
                in self.conn.execute("SELECT task_id, state, attempt, reward, cause FROM "
                                     "results WHERE run_id=?", (run_id,))}

    def turns_of(self, run_id: str, task_id: str) -> list[Any]:
        return [json.loads(r[0]) for r in self.conn.execute(
            "SELECT data FROM turns WHERE run_id=? AND task_id=? ORDER BY idx",
            (run_id, task_id))]

    def close(self) -> None:
        try:
            self.flush_now()
        finally:
            self.conn.close()

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

