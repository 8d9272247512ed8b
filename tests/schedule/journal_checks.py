"""Invariants every finished run's journal must satisfy (used by the property, crash and
scheduler tests): nothing lost, nothing duplicated, every move legal, records agreeing."""

from __future__ import annotations

import sqlite3

from trialbox.schedule.lifecycle import FINAL, TRANSITIONS
from trialbox.types import TaskState


def check_journal(path: str, run_id: str, expected: set[str] | None = None,
                  all_final: bool = True) -> dict[str, tuple[str, float | None]]:
    """Assert the invariants; return {task_id: (final state, reward)}. A task's state is
    its last transition; its result row must agree with it."""
    c = sqlite3.connect(path)
    try:
        tasks = {tid for (tid,) in c.execute(
            "SELECT task_id FROM tasks WHERE run_id=?", (run_id,))}
        if expected is not None:
            assert set(tasks) == expected, (set(tasks) ^ expected)
        results: dict[str, tuple[str, float | None, int]] = {}
        for tid, state, reward, attempt in c.execute(
                "SELECT task_id, state, reward, attempt FROM results WHERE run_id=?",
                (run_id,)):
            assert tid not in results, f"two results for {tid}"
            results[tid] = (state, reward, attempt)
        moves: dict[str, list[tuple[str, str, int]]] = {}
        for tid, old, new, attempt in c.execute(
                "SELECT task_id, old, new, attempt FROM transitions WHERE run_id=? "
                "ORDER BY seq", (run_id,)):
            moves.setdefault(tid, []).append((old, new, attempt))
        for tid in tasks:
            seq = moves.get(tid, [])
            assert seq and seq[0][:2] == ("", "pending"), (tid, seq[:1])
            cur = TaskState.PENDING
            finals = 0
            for old, new, _ in seq[1:]:
                assert old == cur.value, f"{tid}: journal says {old} -> {new} from {cur}"
                nxt = TaskState(new)
                assert nxt in TRANSITIONS[cur], f"{tid}: illegal {cur} -> {nxt}"
                cur = nxt
                finals += nxt in FINAL
            attempt = seq[-1][2]
            assert finals == (1 if cur in FINAL else 0), f"{tid}: {finals} final moves"
            if cur in FINAL:
                rstate, reward, rattempt = results[tid]
                assert rstate == cur.value and rattempt == attempt, (tid, results[tid], cur)
                assert (reward is not None) == (cur is TaskState.DONE), (tid, reward, cur)
            else:
                assert not all_final, f"{tid} is still {cur}"
                assert tid not in results, f"{tid} has a result but is {cur}"
        assert set(results) <= set(tasks)
        return {tid: (r[0], r[1]) for tid, r in results.items()}
    finally:
        c.close()
