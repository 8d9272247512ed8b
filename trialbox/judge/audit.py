"""Spot-check audit: pick graded rows for a human to review, keep the verdicts, and
estimate how often the judge's reward is wrong.

`select_for_review` (pure) picks a seeded random sample of the graded rows plus every
anomaly; `ReviewQueue` (SQLite, WAL) stores the picked rows, the reviewers' verdicts and
reports the estimated reward error rate with a 95% Wilson interval.

The rate is computed only from items picked by the random sample: anomalies (extremes,
flagged, boundary, nondeterministic, cheat) are where the judge is most likely to be
wrong, so counting them would bias the estimate upwards.

>>> rows = [{"reward": 1.0, "flags": [], "tests": [], "outcome": "passed"},
...         {"reward": 0.5, "flags": [], "tests": [], "outcome": "failed"},
...         {"reward": 0.0, "flags": ["gc"], "tests": [], "outcome": "failed"}]
>>> select_for_review(rows, fraction=0.3)
[(0, ('highest-reward',)), (1, ('sample',)), (2, ('lowest-reward', 'flagged'))]
"""

from __future__ import annotations

import json
import math
import random
import sqlite3
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any

from trialbox.errors import UsageError

REASONS = ("sample", "highest-reward", "lowest-reward", "flagged", "boundary",
           "nondeterministic", "excluded", "cheat")
"""Every reason a row is picked, in the order they are listed for a row."""

Z_95 = 1.959963984540054
"""Standard normal quantile for a two-sided 95% interval."""

_SCHEMA_VERSION = 1  # PRAGMA user_version of a review queue database


# --------------------------------------------------------------------------- selection

def _reward(row: Mapping[str, Any], i: int) -> float | None:
    r = row.get("reward")
    if r is None:
        return None
    if isinstance(r, bool) or not isinstance(r, (int, float)) or math.isnan(r):
        raise UsageError(f"row {i}: reward must be a number or null, got {r!r}")
    return float(r)


def _nondeterministic(row: Mapping[str, Any]) -> bool:
    if row.get("deterministic") is False:
        return True
    first = (row.get("outcome"), row.get("reward"))
    return any((rep.get("outcome"), rep.get("reward")) != first
               for rep in row.get("repeats") or ())


def _boundary(row: Mapping[str, Any]) -> bool:
    """Some but not all tests passed: a near miss, where a wrong test flips the reward."""
    tests = row.get("tests") or ()
    passed = sum(bool(t.get("passed")) for t in tests)
    return 0 < passed < len(tests)


def select_for_review(rows: Sequence[Mapping[str, Any]], *, fraction: float = 0.05,
                      seed: int = 0) -> list[tuple[int, tuple[str, ...]]]:
    """The rows to review, as (row index, reasons), in row order; rows are `trialbox eval`
    output rows. Reasons (in `REASONS` order):

    * `sample` — a seeded random sample of ceil(fraction·N) of the N graded rows (reward
      not null), at least one when N ≥ 1; the only rows the error rate is estimated from;
    * `highest-reward` / `lowest-reward` — every graded row with the max / min reward,
      when rewards take more than two values (with binary rewards every row would be
      an extreme, so none is);
    * `flagged` (non-empty flags), `boundary` (pass rate strictly between 0 and 1),
      `nondeterministic` (`deterministic` false, or a repeat's outcome or reward differs),
      `excluded` (reward null), `cheat` (outcome cheat).
    """
    if (isinstance(fraction, bool) or not isinstance(fraction, (int, float))
            or not 0 < fraction <= 1):
        raise UsageError(f"fraction must be in (0, 1], got {fraction!r}; e.g. 0.05 for 5%")
    rewards = [_reward(row, i) for i, row in enumerate(rows)]
    graded = [i for i, r in enumerate(rewards) if r is not None]
    k = min(len(graded), math.ceil(fraction * len(graded)))
    sample = set(random.Random(seed).sample(graded, k))
    # Extremes mean something only for graded (non-binary) rewards: with two values or
    # fewer every row is an extreme and the queue would be the whole run.
    distinct = {r for r in rewards if r is not None}
    hi = max(distinct) if len(distinct) > 2 else None
    lo = min(distinct) if len(distinct) > 2 else None

    picked: list[tuple[int, tuple[str, ...]]] = []
    for i, (row, r) in enumerate(zip(rows, rewards, strict=True)):
        hits = {
            "sample": i in sample,
            "highest-reward": r is not None and r == hi,
            "lowest-reward": r is not None and r == lo,
            "flagged": bool(row.get("flags")),
            "boundary": _boundary(row),
            "nondeterministic": _nondeterministic(row),
            "excluded": r is None,
            "cheat": row.get("outcome") == "cheat",
        }
        reasons = tuple(name for name in REASONS if hits[name])
        if reasons:
            picked.append((i, reasons))
    return picked


# --------------------------------------------------------------------------- records

@dataclass(frozen=True)
class Verdict:
    """A reviewer's judgement of one graded row's reward."""

    correct: bool
    """True when the reward the judge gave is right."""
    note: str
    reviewer: str
    recorded_at: str
    """ISO-8601 UTC time the verdict was stored."""


@dataclass(frozen=True)
class ReviewItem:
    """One queued row."""

    id: int
    run_id: str
    row_index: int
    """Index of the row in the run's output file."""
    row: dict[str, Any]
    """The output row as the judge wrote it (JSON data, not a core record)."""
    reasons: tuple[str, ...]
    verdict: Verdict | None


@dataclass(frozen=True)
class Recorded:
    """What `ReviewQueue.record` did."""

    verdict: Verdict
    replaced: Verdict | None
    """The earlier verdict this one replaced, or None if it was the first."""


@dataclass(frozen=True)
class ReasonCounts:
    queued: int
    reviewed: int
    wrong: int


@dataclass(frozen=True)
class AuditStats:
    """Review progress and the estimated reward error rate."""

    queued: int
    reviewed: int
    wrong: int
    """Reviewed items whose reward was judged wrong (any reason)."""
    sample_reviewed: int
    sample_wrong: int
    error_rate: float | None
    """sample_wrong / sample_reviewed; None until a sampled item is reviewed."""
    error_rate_ci: tuple[float, float] | None
    """95% Wilson score interval for the error rate."""
    per_reason: Mapping[str, ReasonCounts]


def wilson_interval(k: int, n: int, z: float = Z_95) -> tuple[float, float]:
    """Wilson score interval for k successes in n trials (n ≥ 1).

    >>> tuple(round(x, 4) for x in wilson_interval(1, 10))
    (0.0179, 0.4042)
    """
    if n < 1 or not 0 <= k <= n:
        raise UsageError(f"wilson_interval needs 0 <= k <= n and n >= 1, got k={k}, n={n}")
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # At k = 0 (k = n) the bound is exactly 0 (1); rounding would leave it a hair off.
    lo = 0.0 if k == 0 else max(0.0, centre - half)
    hi = 1.0 if k == n else min(1.0, centre + half)
    return lo, hi


# --------------------------------------------------------------------------- queue

class ReviewQueue:
    """Rows awaiting review and the verdicts given, in an SQLite file (WAL mode).

    >>> with ReviewQueue(path) as q:                                   # doctest: +SKIP
    ...     q.add("run-1", rows, select_for_review(rows))
    ...     item = q.pending(1)[0]
    ...     q.record(item.id, correct=False, note="test 3 is wrong", reviewer="ana")
    ...     q.stats("run-1").error_rate
    """

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        try:
            self._conn = sqlite3.connect(self.path)
        except sqlite3.Error as e:
            raise UsageError(f"cannot open review queue {self.path}: {e}") from e
        try:
            self._setup()
        except BaseException:
            self._conn.close()
            raise

    def _setup(self) -> None:
        try:
            check = self._conn.execute("PRAGMA quick_check").fetchone()
            if check is None or check[0] != "ok":
                raise UsageError(f"review queue {self.path} is corrupt "
                                 f"(integrity check: {check[0] if check else 'no answer'})")
            version = self._conn.execute("PRAGMA user_version").fetchone()[0]
            tables = self._conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
            if tables and version != _SCHEMA_VERSION:
                raise UsageError(f"{self.path} is an SQLite database but not a trialbox "
                                 f"review queue (user_version {version}); use another path")
            self._conn.execute("PRAGMA journal_mode=WAL")
            with self._conn:
                self._conn.executescript(f"""
                    CREATE TABLE IF NOT EXISTS items (
                        id INTEGER PRIMARY KEY,
                        run_id TEXT NOT NULL,
                        row_index INTEGER NOT NULL,
                        row_json TEXT NOT NULL,
                        reasons TEXT NOT NULL,
                        correct INTEGER,
                        note TEXT,
                        reviewer TEXT,
                        recorded_at TEXT,
                        UNIQUE (run_id, row_index)
                    );
                    PRAGMA user_version = {_SCHEMA_VERSION};
                """)
        except sqlite3.DatabaseError as e:
            raise UsageError(f"{self.path} is not a usable review queue "
                             f"(corrupt or not an SQLite database): {e}") from e

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> ReviewQueue:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # -- writing

    def add(self, run_id: str, rows: Sequence[Mapping[str, Any]],
            selections: Sequence[tuple[int, Sequence[str]]]) -> int:
        """Queue the selected rows of one run; returns how many were new. Adding the same
        (run_id, row index) again changes nothing."""
        if not run_id:
            raise UsageError("run_id must be a non-empty string")
        records = []
        for index, reasons in selections:
            if not 0 <= index < len(rows):
                raise UsageError(f"selection index {index} is outside the {len(rows)} rows")
            unknown = set(reasons) - set(REASONS)
            if unknown or not reasons:
                raise UsageError(f"row {index}: reasons must be a non-empty subset of "
                                 f"{REASONS}, got {tuple(reasons)!r}")
            try:
                row_json = json.dumps(dict(rows[index]), allow_nan=False)
            except (TypeError, ValueError) as e:
                raise UsageError(f"row {index} is not JSON data: {e}") from e
            records.append((run_id, index, row_json, json.dumps(list(reasons))))
        with self._conn:
            before = self._conn.total_changes
            self._conn.executemany(
                "INSERT OR IGNORE INTO items (run_id, row_index, row_json, reasons) "
                "VALUES (?, ?, ?, ?)", records)
            return self._conn.total_changes - before

    def record(self, item_id: int, correct: bool, note: str = "",
               reviewer: str = "") -> Recorded:
        """Store a verdict on an item; a later verdict replaces an earlier one."""
        previous = self.get(item_id).verdict
        verdict = Verdict(bool(correct), note, reviewer,
                          datetime.now(UTC).isoformat(timespec="seconds"))
        with self._conn:
            self._conn.execute(
                "UPDATE items SET correct = ?, note = ?, reviewer = ?, recorded_at = ? "
                "WHERE id = ?",
                (int(verdict.correct), note, reviewer, verdict.recorded_at, item_id))
        return Recorded(verdict, previous)

    # -- reading

    _COLUMNS = "id, run_id, row_index, row_json, reasons, correct, note, reviewer, recorded_at"

    @staticmethod
    def _item(r: tuple[Any, ...]) -> ReviewItem:
        verdict = None if r[5] is None else Verdict(bool(r[5]), r[6], r[7], r[8])
        return ReviewItem(r[0], r[1], r[2], json.loads(r[3]), tuple(json.loads(r[4])),
                          verdict)

    def get(self, item_id: int) -> ReviewItem:
        row = self._conn.execute(f"SELECT {self._COLUMNS} FROM items WHERE id = ?",
                                 (item_id,)).fetchone()
        if row is None:
            raise UsageError(f"no review item {item_id!r} in {self.path}")
        return self._item(row)

    def pending(self, limit: int = 20, *, run_id: str | None = None) -> list[ReviewItem]:
        """Items without a verdict, oldest first."""
        if limit < 1:
            raise UsageError(f"limit must be at least 1, got {limit}")
        rows = self._conn.execute(
            f"SELECT {self._COLUMNS} FROM items WHERE correct IS NULL "
            "AND (? IS NULL OR run_id = ?) ORDER BY id LIMIT ?",
            (run_id, run_id, limit)).fetchall()
        return [self._item(r) for r in rows]

    def items(self, limit: int = 100, *, run_id: str | None = None,
              reviewed_only: bool = False) -> list[ReviewItem]:
        """Every item (of one run, or all; only those with a verdict if asked), oldest
        first."""
        if limit < 1:
            raise UsageError(f"limit must be at least 1, got {limit}")
        rows = self._conn.execute(
            f"SELECT {self._COLUMNS} FROM items WHERE (? IS NULL OR run_id = ?) "
            "AND (? = 0 OR correct IS NOT NULL) ORDER BY id LIMIT ?",
            (run_id, run_id, int(reviewed_only), limit)).fetchall()
        return [self._item(r) for r in rows]

    def runs(self) -> list[str]:
        """The run ids with items in the queue, sorted."""
        return [r[0] for r in self._conn.execute(
            "SELECT DISTINCT run_id FROM items ORDER BY 1")]

    def stats(self, run_id: str | None = None) -> AuditStats:
        """Counts (of one run, or all) and the error rate from sampled items only."""
        rows = self._conn.execute(
            "SELECT reasons, correct FROM items WHERE (? IS NULL OR run_id = ?)",
            (run_id, run_id)).fetchall()
        per: dict[str, list[int]] = {}
        reviewed = wrong = s_reviewed = s_wrong = 0
        for reasons_json, correct in rows:
            reasons = json.loads(reasons_json)
            done, bad = correct is not None, correct == 0
            reviewed += done
            wrong += bad
            if "sample" in reasons:
                s_reviewed += done
                s_wrong += bad
            for reason in reasons:
                c = per.setdefault(reason, [0, 0, 0])
                c[0] += 1
                c[1] += done
                c[2] += bad
        return AuditStats(
            queued=len(rows), reviewed=reviewed, wrong=wrong,
            sample_reviewed=s_reviewed, sample_wrong=s_wrong,
            error_rate=s_wrong / s_reviewed if s_reviewed else None,
            error_rate_ci=wilson_interval(s_wrong, s_reviewed) if s_reviewed else None,
            per_reason={name: ReasonCounts(*per[name]) for name in REASONS if name in per})
