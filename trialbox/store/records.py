"""Queries over a journal (read-only): a task's history, counts by state, the slowest
tasks, the infrastructure-failure rate, and a run's trajectories.

    with Records("run.db") as r:
        r.counts("run-1")            # {"done": 98, "failed": 2}
        r.history("HumanEval/0")     # [TaskHistory(run_id=..., transitions=[...], ...)]

The file is opened read-only (`mode=ro`): a reader never changes a journal, and a
scheduler may be writing it at the same time (WAL lets both proceed).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from trialbox.errors import UsageError
from trialbox.store.journal import JournalError, connect, task_states
from trialbox.types import TaskState


@dataclass(frozen=True)
class Transition:
    seq: int
    attempt: int
    old: str
    new: str
    at: float
    sandbox: str
    runtime: str
    trace_id: str
    cause: str
    message: str


@dataclass
class TaskHistory:
    """Everything the journal knows about one task of one run."""

    run_id: str
    task_id: str
    priority: int
    state: str
    attempt: int
    infra_failures: int
    preemptions: int
    trace_id: str
    payload: Any
    transitions: list[Transition] = field(default_factory=list)
    turns: list[Any] = field(default_factory=list)
    grades: dict[int, Any] = field(default_factory=dict)
    result: dict[str, Any] | None = None
    """{"attempt", "state", "reward", "cause"} once the task is final."""

    def to_json(self) -> dict[str, Any]:
        from dataclasses import asdict
        return asdict(self)


class Records:
    def __init__(self, path: str):
        self.path = path
        self.conn = connect(path, readonly=True)

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> Records:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _q(self, sql: str, args: tuple[Any, ...] = ()) -> list[Any]:
        try:
            return self.conn.execute(sql, args).fetchall()
        except sqlite3.DatabaseError as e:
            raise JournalError(f"journal {self.path!r} cannot be read: {e}") from e

    # -- runs ------------------------------------------------------------------------
    def runs(self) -> list[str]:
        return [r[0] for r in self._q("SELECT run_id FROM runs ORDER BY created")]

    def require_run(self, run_id: str) -> None:
        if not self._q("SELECT 1 FROM runs WHERE run_id=?", (run_id,)):
            known = self.runs()
            hint = (f"runs in it: {', '.join(known[:10])}" if known
                    else "it records no runs yet")
            raise UsageError(f"journal {self.path!r} has no run {run_id!r}; {hint}")

    def counts(self, run_id: str) -> dict[str, int]:
        """Tasks of the run per current state (states with none are left out)."""
        self.require_run(run_id)
        counts: dict[str, int] = {}
        for st in self._states(run_id).values():
            counts[st.state] = counts.get(st.state, 0) + 1
        return dict(sorted(counts.items()))

    def _states(self, run_id: str, task_id: str | None = None) -> dict[str, Any]:
        try:
            return task_states(self.conn, run_id, task_id)
        except sqlite3.DatabaseError as e:
            raise JournalError(f"journal {self.path!r} cannot be read: {e}") from e

    # -- one task ----------------------------------------------------------------------
    def history(self, task_id: str, run_id: str | None = None) -> list[TaskHistory]:
        """The task's full history in every run that has it (or only in `run_id`)."""
        rows = self._q("SELECT run_id, task_id, priority, trace_id, payload FROM tasks "
                       "WHERE task_id=?"
                       + (" AND run_id=?" if run_id else "") + " ORDER BY submitted",
                       (task_id, run_id) if run_id else (task_id,))
        if not rows:
            where = f" in run {run_id!r}" if run_id else ""
            raise UsageError(f"journal {self.path!r} has no task {task_id!r}{where}; "
                             "`trialbox tasks status RUN` lists a run's counts")
        out = []
        for r in rows:
            run, tid, prio, trace, payload = r
            st = self._states(run, tid)[tid]
            h = TaskHistory(run, tid, prio, st.state, st.attempt, st.infra_failures,
                            st.preemptions, trace, json.loads(payload))
            h.transitions = [Transition(*t) for t in self._q(
                "SELECT seq, attempt, old, new, at, sandbox, runtime, trace_id, cause, "
                "message FROM transitions WHERE task_id=? AND run_id=? ORDER BY seq",
                (task_id, h.run_id))]
            h.turns = [json.loads(t[0]) for t in self._q(
                "SELECT data FROM turns WHERE run_id=? AND task_id=? ORDER BY idx",
                (h.run_id, task_id))]
            h.grades = {a: json.loads(d) for a, d in self._q(
                "SELECT attempt, data FROM grades WHERE run_id=? AND task_id=?",
                (h.run_id, task_id))}
            res = self._q("SELECT attempt, state, reward, cause FROM results "
                          "WHERE run_id=? AND task_id=?", (h.run_id, task_id))
            if res:
                a, s, rw, c = res[0]
                h.result = {"attempt": a, "state": s, "reward": rw, "cause": c}
            out.append(h)
        return out

    # -- a run's figures ---------------------------------------------------------------
    def slowest(self, run_id: str, n: int = 10) -> list[tuple[str, float]]:
        """(task_id, seconds from its first dispatch to its final state), slowest first.
        Queueing before the first dispatch is not counted: this is the task's own time."""
        self.require_run(run_id)
        return [(t, float(s)) for t, s in self._q(
            "SELECT t.task_id, r.at - min(t.at) AS s FROM transitions t "
            "JOIN results r ON r.run_id=t.run_id AND r.task_id=t.task_id "
            "WHERE t.run_id=? AND t.new='generating' GROUP BY t.task_id "
            "ORDER BY s DESC LIMIT ?", (run_id, n))]

    def infra_failure_rate(self, run_id: str) -> float:
        """Attempts that ended in an infrastructure failure (retried, or the last one
        before FAILED), over all attempts started. Crash recoveries are not counted (the
        scheduler died, not the task's infrastructure)."""
        self.require_run(run_id)
        # Preempted attempts resume as the same attempt; count attempts, not dispatches.
        attempts = self._q("SELECT count(*) FROM (SELECT DISTINCT task_id, attempt FROM "
                           "transitions WHERE run_id=? AND new='generating')",
                           (run_id,))[0][0]
        failed = self._q("SELECT count(*) FROM transitions WHERE run_id=? AND cause='infra' "
                         "AND new IN ('retrying', 'failed')", (run_id,))[0][0]
        return failed / attempts if attempts else 0.0

    def summary(self, run_id: str) -> dict[str, Any]:
        counts = self.counts(run_id)
        total = sum(counts.values())
        final = sum(v for k, v in counts.items() if TaskState(k).final)
        rewards = self._q("SELECT count(reward), avg(reward) FROM results WHERE run_id=?",
                          (run_id,))[0]
        return {"run_id": run_id, "tasks": total, "final": final, "counts": counts,
                "rewarded": rewards[0], "mean_reward": rewards[1],
                "infra_failure_rate": self.infra_failure_rate(run_id),
                "slowest": self.slowest(run_id, 5)}

    def trajectories(self, run_id: str) -> Iterator[dict[str, Any]]:
        """One plain dict per task of the run: ids, final state, reward, turns, grade."""
        self.require_run(run_id)
        turns: dict[str, list[Any]] = {}
        for tid, data in self._q("SELECT task_id, data FROM turns WHERE run_id=? "
                                 "ORDER BY task_id, idx", (run_id,)):
            turns.setdefault(tid, []).append(json.loads(data))
        grades = {(t, a): json.loads(d) for t, a, d in self._q(
            "SELECT task_id, attempt, data FROM grades WHERE run_id=?", (run_id,))}
        states = self._states(run_id)
        for tid, payload, reward in self._q(
                "SELECT t.task_id, t.payload, r.reward FROM tasks t LEFT JOIN results r "
                "ON r.run_id=t.run_id AND r.task_id=t.task_id WHERE t.run_id=? "
                "ORDER BY t.submitted, t.task_id", (run_id,)):
            st = states[tid]
            attempt = st.attempt
            yield {"run_id": run_id, "task_id": tid, "state": st.state,
                   "attempt": attempt, "reward": reward, "payload": json.loads(payload),
                   "turns": turns.get(tid, []), "grade": grades.get((tid, attempt))}
