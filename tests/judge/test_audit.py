"""Spot-check audit: selection on hand-made rows, the SQLite review queue round trip,
the error rate from sampled items only, with a hand-computed Wilson interval."""

import math
import sqlite3

import pytest

from trialbox.errors import UsageError
from trialbox.judge.audit import REASONS, ReviewQueue, select_for_review, wilson_interval


def row(reward=0.0, outcome="failed", flags=(), tests=None, deterministic=True,
        repeats=()):
    return {"task_id": "T/0", "passed": outcome == "passed", "reward": reward,
            "outcome": outcome, "message": "", "flags": list(flags),
            "tests": [{"name": f"t{i}", "passed": p, "message": "", "ms": 0.0,
                       "hidden": True} for i, p in enumerate(tests or [])],
            "wall_ms": 1.0, "repeats": list(repeats), "deterministic": deterministic}


def reasons_of(rows, **kw):
    return {i: set(rs) for i, rs in select_for_review(rows, **kw)}


# --------------------------------------------------------------------------- selection

def test_every_reason_exact_indices():
    rows = [
        row(0.5, tests=[True, False]),                              # 0 boundary
        row(0.5, flags=["subprocess"]),                             # 1 flagged
        row(0.5, deterministic=False),                              # 2 nondeterministic
        row(0.5, repeats=[{"outcome": "passed", "reward": 1.0}]),   # 3 repeat disagrees
        row(None, outcome="infra"),                                 # 4 excluded
        row(0.0, outcome="cheat", flags=["frame-walk"]),            # 5 cheat, lowest
        row(1.0, outcome="passed", tests=[True, True]),             # 6 highest
        row(0.5, tests=[False, False]),                             # 7 nothing
        row(0.5, repeats=[{"outcome": "failed", "reward": 0.5}]),   # 8 repeats agree
    ]
    # fraction tiny → one sampled row; find it, then check everything else exactly.
    picked = reasons_of(rows, fraction=0.01, seed=3)
    sampled = [i for i, rs in picked.items() if "sample" in rs]
    assert len(sampled) == 1 and sampled[0] != 4        # only graded rows are sampled
    for rs in picked.values():
        rs.discard("sample")
    picked = {i: rs for i, rs in picked.items() if rs}
    assert picked == {
        0: {"boundary"},
        1: {"flagged"},
        2: {"nondeterministic"},
        3: {"nondeterministic"},
        4: {"excluded"},
        5: {"cheat", "flagged", "lowest-reward"},
        6: {"highest-reward"},
    }


def test_reasons_are_listed_in_canonical_order_and_rows_in_order():
    rows = [row(0.0, outcome="cheat", flags=["x"], tests=[True, False],
                deterministic=False), row(1.0), row(0.5)]
    out = select_for_review(rows, fraction=1.0)
    assert [i for i, _ in out] == [0, 1, 2]
    assert out[0][1] == ("sample", "lowest-reward", "flagged", "boundary",
                         "nondeterministic", "cheat")
    assert all(list(rs) == [r for r in REASONS if r in rs] for _, rs in out)


def test_binary_rewards_have_no_extremes():
    """With two reward values every row would be an extreme: none is picked as one."""
    rows = [row(1.0), row(0.0), row(1.0), row(0.0)]
    picked = reasons_of(rows, fraction=0.25, seed=0)
    assert not any({"highest-reward", "lowest-reward"} & rs for rs in picked.values())
    assert sum("sample" in rs for rs in picked.values()) == 1


def test_extremes_include_all_ties():
    rows = [row(1.0), row(0.2), row(1.0), row(0.2), row(0.5)]
    picked = reasons_of(rows, fraction=0.01, seed=0)
    assert {i for i, rs in picked.items() if "highest-reward" in rs} == {0, 2}
    assert {i for i, rs in picked.items() if "lowest-reward" in rs} == {1, 3}


def test_sample_size_and_seed():
    rows = [row(0.5) for _ in range(100)] + [row(None, outcome="infra")] * 10
    def sampled(**kw):
        return [i for i, rs in select_for_review(rows, **kw) if "sample" in rs]
    a = sampled(fraction=0.05, seed=7)
    assert len(a) == 5 and all(i < 100 for i in a)      # ceil(0.05 · 100 graded)
    assert sampled(fraction=0.05, seed=7) == a          # reproducible
    assert sampled(fraction=0.05, seed=8) != a
    assert len(sampled(fraction=0.051)) == 6            # ceil rounds up
    assert len(sampled(fraction=1.0)) == 100
    assert len(select_for_review([row(0.5)], fraction=0.001)) == 1   # at least one


def test_no_rows_and_only_excluded_rows():
    assert select_for_review([]) == []
    assert select_for_review([row(None, outcome="error")]) == [(0, ("excluded",))]


@pytest.mark.parametrize("fraction", [0, -0.1, 1.01, math.nan, True, "0.1"])
def test_fraction_validated(fraction):
    with pytest.raises(UsageError, match="fraction"):
        select_for_review([row()], fraction=fraction)


def test_bad_reward_named():
    with pytest.raises(UsageError, match="row 1: reward"):
        select_for_review([row(), row("1")])


# --------------------------------------------------------------------------- wilson

def test_wilson_hand_computed():
    # k=1, n=10, z=1.959964 (z²=3.841459): p=0.1, d=1+z²/10=1.384146,
    # centre=(0.1+z²/20)/d=0.211013, half=z·sqrt(0.009+z²/400)/d=0.193137
    # → (0.017876, 0.404150); published tables give (0.0179, 0.4042).
    lo, hi = wilson_interval(1, 10)
    assert lo == pytest.approx(0.017876, abs=1e-6)
    assert hi == pytest.approx(0.404150, abs=1e-6)
    assert wilson_interval(0, 10)[0] == 0.0
    assert wilson_interval(10, 10)[1] == 1.0
    with pytest.raises(UsageError):
        wilson_interval(1, 0)


# --------------------------------------------------------------------------- queue

def test_queue_round_trip(tmp_path):
    rows = [row(0.5) for _ in range(20)]
    rows[3] = row(0.0, flags=["gc"])
    selections = [(i, ("sample",)) for i in range(10)]
    selections[3] = (3, ("sample", "lowest-reward", "flagged"))
    selections += [(15, ("flagged",)), (16, ("boundary",))]
    path = tmp_path / "audit.sqlite"

    with ReviewQueue(path) as q:
        assert q.add("run-1", rows, selections) == 12
        assert q.add("run-1", rows, selections) == 0            # idempotent
        assert q.add("run-2", rows, [(0, ("sample",))]) == 1     # another run
        pending = q.pending(100, run_id="run-1")
        assert [p.row_index for p in pending] == [*range(10), 15, 16]
        assert [p.row_index for p in q.pending(2)] == [0, 1]
        item = pending[3]
        assert item.row == rows[3] and item.reasons == ("sample", "lowest-reward", "flagged")
        assert item.run_id == "run-1" and item.verdict is None

        # 1 wrong out of 10 sampled; both anomalies-only items judged wrong too.
        by_index = {p.row_index: p.id for p in pending}
        first = q.record(by_index[0], correct=False, note="oops", reviewer="ana")
        assert first.replaced is None and first.verdict.note == "oops"
        for i in range(1, 10):
            q.record(by_index[i], correct=True)
        q.record(by_index[15], correct=False)
        q.record(by_index[16], correct=False)

    with ReviewQueue(path) as q:                                  # persisted
        assert q.get(by_index[0]).verdict.reviewer == "ana"
        assert q.pending(100, run_id="run-1") == []
        s = q.stats("run-1")
        assert (s.queued, s.reviewed, s.wrong) == (12, 12, 3)
        assert (s.sample_reviewed, s.sample_wrong) == (10, 1)
        assert s.error_rate == pytest.approx(0.1)                # anomalies not counted
        assert s.error_rate_ci == pytest.approx((0.017876, 0.404150), abs=1e-6)
        assert s.per_reason["sample"].reviewed == 10
        assert s.per_reason["flagged"].queued == 2 and s.per_reason["flagged"].wrong == 1
        assert s.per_reason["boundary"].wrong == 1
        assert list(s.per_reason) == ["sample", "lowest-reward", "flagged", "boundary"]

        # A second verdict replaces the first and says so.
        again = q.record(by_index[0], correct=True, note="re-read the test")
        assert again.replaced is not None and again.replaced.correct is False
        assert q.get(by_index[0]).verdict.correct is True
        s = q.stats("run-1")
        assert s.sample_wrong == 0 and s.error_rate == 0.0 and s.wrong == 2

        all_runs = q.stats()
        assert all_runs.queued == 13 and all_runs.sample_reviewed == 10
        assert q.runs() == ["run-1", "run-2"]
        assert [i.row_index for i in q.items(run_id="run-1")] == [*range(10), 15, 16]
        assert len(q.items(reviewed_only=True)) == 12 and len(q.items()) == 13
        assert [i.run_id for i in q.items(2)] == ["run-1", "run-1"]
        assert q.stats("none").error_rate is None and q.stats("none").error_rate_ci is None

    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()


def test_select_then_queue(tmp_path):
    rows = [row(1.0, outcome="passed"), row(0.0, flags=["gc"]), row(None, outcome="infra")]
    with ReviewQueue(tmp_path / "q.db") as q:
        assert q.add("r", rows, select_for_review(rows)) == 2  # binary: no extremes
        assert q.stats().per_reason["excluded"].queued == 1


def test_unknown_item_and_bad_input(tmp_path):
    with ReviewQueue(tmp_path / "q.db") as q:
        with pytest.raises(UsageError, match="no review item 42"):
            q.get(42)
        with pytest.raises(UsageError, match="no review item 42"):
            q.record(42, correct=True)
        with pytest.raises(UsageError, match="outside"):
            q.add("r", [row()], [(1, ("sample",))])
        with pytest.raises(UsageError, match="reasons"):
            q.add("r", [row()], [(0, ("because",))])
        with pytest.raises(UsageError, match="limit"):
            q.pending(0)
        assert q.stats().queued == 0                              # nothing half-added


def test_not_a_database(tmp_path):
    path = tmp_path / "junk.db"
    path.write_bytes(b"this is not an sqlite file at all\n" * 200)
    with pytest.raises(UsageError, match=str(path)):
        ReviewQueue(path)


def test_corrupt_database(tmp_path):
    path = tmp_path / "q.db"
    with ReviewQueue(path) as q:
        q.add("r", [row()] * 50, [(i, ("sample",)) for i in range(50)])
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    data = bytearray(path.read_bytes())
    data[4096:8192] = b"\xff" * 4096                              # smash page 2
    path.write_bytes(bytes(data))
    with pytest.raises(UsageError, match=str(path)):
        ReviewQueue(path)


def test_other_sqlite_database_refused(tmp_path):
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE t (x)")
    conn.close()
    with pytest.raises(UsageError, match="not a trialbox review queue"):
        ReviewQueue(path)


def test_audit_cli_end_to_end(tmp_path):
    import json
    import subprocess
    import sys

    rows = [row(1.0, outcome="passed"), row(0.0, flags=["gc"]), row(None, outcome="infra")]
    graded = tmp_path / "graded.jsonl"
    graded.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    db = str(tmp_path / "review.db")

    def cli(*args):
        p = subprocess.run([sys.executable, "-m", "trialbox.cli", "audit", *args],
                           capture_output=True, text=True, timeout=60)
        return p.returncode, p.stdout, p.stderr

    rc, out, err = cli("queue", "--db", db, "--rows", str(graded), "--run-id", "r1",
                       "--fraction", "1.0")
    assert rc == 0, err
    assert json.loads(out) == {"selected": 3, "added": 3}
    rc, out, err = cli("verdict", "--db", db, "1", "wrong", "--note", "looks right to me")
    assert rc == 0, err
    rc, out, err = cli("stats", "--db", db)
    stats = json.loads(out)
    assert rc == 0 and stats["reviewed"] == 1 and stats["wrong"] == 1
    (tmp_path / "junk.db").write_text("not a database")
    rc, out, err = cli("stats", "--db", str(tmp_path / "junk.db"))
    assert rc == 2 and "junk.db" in err
