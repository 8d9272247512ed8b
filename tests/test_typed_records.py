"""The typed records of types.py that files hold: a graded row (`GradedRow`), an eval
sample and its error variant, the trainer's loop state, a journaled task's `TaskState`.
Their JSON is the one earlier versions wrote: the literal rows and state below were
written by trialbox at 06b09ac (before these records existed), and read back unchanged."""

from __future__ import annotations

import asyncio
import json
import sqlite3

import pytest

from trialbox.judge.evaluate import Reference, _row, as_sample, error_row, read_samples
from trialbox.judge.reward import RewardSpec
from trialbox.store.journal import Journal, JournalError
from trialbox.types import (EvalSample, Grade, GradedRow, Outcome, SampleError, StepSummary,
                            TaskState, TestResult, TrainState)

# Rows `trialbox eval` wrote at 06b09ac: a binary row with a repeat and its environment,
# a weighted row, an error row of an unknown task, and one of a line that was not JSON.
OLD_ROWS = [
    '{"task_id": "T/0", "passed": false, "reward": 0.0, "outcome": "failed", "message": '
    '"t1: assertion failed", "flags": [], "tests": [{"name": "t0", "passed": true, '
    '"message": "", "ms": 0.25, "hidden": true}, {"name": "t1", "passed": false, '
    '"message": "assertion failed", "ms": 1.5, "hidden": false}], "wall_ms": 12.5, '
    '"candidate_cpu_ms": 3.0, "candidate_peak_memory_bytes": 1048576, "attempts": 2, '
    '"repeats": [{"outcome": "passed", "reward": 1.0}], "deterministic": false, '
    '"environment": "python3.11-system@sha256:a83c0370d91532c9"}',
    '{"task_id": "T/1", "passed": true, "reward": 0.8800000000000001, "style_findings": '
    '["E401 1: x"], "style": 0.0, "efficiency": 0.8, "memory": 1.0, '
    '"reference_peak_memory_bytes": 1048576, "outcome": "passed", "message": "", "flags": '
    '[], "tests": [{"name": "t0", "passed": true, "message": "", "ms": 0.25, "hidden": '
    'true}], "wall_ms": 10.0, "candidate_cpu_ms": 0.0, "candidate_peak_memory_bytes": 0, '
    '"attempts": 1, "repeats": [], "deterministic": true}',
    '{"task_id": "T/9", "passed": false, "reward": null, "outcome": "error", "message": '
    '"unknown task_id \'T/9\'", "flags": [], "tests": [], "wall_ms": 0.0}',
    '{"task_id": null, "passed": false, "reward": null, "outcome": "error", "message": '
    '"s.jsonl:3: not a JSON object (x)", "flags": [], "tests": [], "wall_ms": 0.0}',
]

TESTS = (TestResult("t0", True, "", 0.25, True),
         TestResult("t1", False, "assertion failed", 1.5, False))


@pytest.mark.parametrize("line", OLD_ROWS)
def test_an_old_rows_file_reads_back_unchanged(line: str) -> None:
    row = json.loads(line)
    v = GradedRow.from_dict(row)
    assert json.dumps(v.to_dict()) == line  # same keys, same order, same values
    assert GradedRow.from_dict(v.to_dict()) == v


def test_rows_built_now_are_the_rows_written_before() -> None:
    """The same grades give, key for key, the rows 06b09ac's evaluator wrote."""
    g = Grade("T/0", Outcome.FAILED, tests=TESTS, message="t1: assertion failed",
              wall_ms=12.5, candidate_cpu_ms=3.0, candidate_peak_memory_bytes=1 << 20,
              attempts=2)
    g2 = Grade("T/0", Outcome.PASSED, tests=TESTS[:1], wall_ms=10.0)
    from dataclasses import replace
    binary = replace(_row(EvalSample("T/0", "x"), [g, g2]),
                     environment="python3.11-system@sha256:a83c0370d91532c9")
    spec = RewardSpec(pass_rate=0.7, style=0.1, efficiency=0.1, memory=0.1, binary=False)
    weighted = _row(EvalSample("T/1", "a\nb\n"), [g2], spec, ("E401 1: x",),
                    Reference({"t0": 0.2}, 1 << 20, 1.0))
    unknown = error_row(EvalSample("T/9", "x"), "unknown task_id 'T/9'")
    not_json = error_row(SampleError("s.jsonl:3: not a JSON object (x)"),
                         "s.jsonl:3: not a JSON object (x)")
    # the same keys, and last the completion a reviewer reads (issue 30)
    assert [json.dumps(v.to_dict()) for v in (binary, weighted, unknown, not_json)] \
        == [OLD_ROWS[0][:-1] + ', "completion": "x"}',
            OLD_ROWS[1][:-1] + ', "completion": "a\\nb\\n"}', *OLD_ROWS[2:]]
    assert not binary.deterministic and binary.repeats[0].outcome is Outcome.PASSED
    assert weighted.scores is not None and weighted.scores.efficiency == 0.8
    assert not unknown.graded and unknown.outcome is Outcome.ERROR


def test_a_row_carries_the_answer_a_reviewer_reads() -> None:
    """Issue 30: /review shows the code it asks a person to judge — the completion, or a
    repository answer's files overlay, as the sample gave them."""
    g = Grade("T/0", Outcome.PASSED, tests=TESTS[:1], wall_ms=1.0)
    text = _row(EvalSample("T/0", "    return 1\n"), [g])
    repo = _row(EvalSample("R/0", None, {"p.py": "y = 1\n", "old.py": None}), [g])
    assert text.to_dict()["completion"] == "    return 1\n" and "files" not in text.to_dict()
    assert repo.to_dict()["files"] == {"p.py": "y = 1\n", "old.py": None}
    assert "completion" not in repo.to_dict()
    for row in (text, repo):
        assert GradedRow.from_dict(json.loads(json.dumps(row.to_dict()))) == row


def test_samples_and_their_error_variant(tmp_path) -> None:
    f = tmp_path / "s.jsonl"
    f.write_text('{"task_id": "a", "completion": "x"}\nnot json\n[1]\n{"completion": "x"}\n'
                 '{"task_id": "r", "files": {"p.py": "y", "old.py": null}}\n'
                 '{"task_id": "b"}\n{"task_id": "c", "completion": "x", "language": "c"}\n')
    rows = read_samples(str(f))
    assert rows[0] == EvalSample("a", "x")
    assert isinstance(rows[1], SampleError) and rows[1].message.startswith(f"{f}:2: not a "
                                                                           "JSON object")
    assert rows[2] == SampleError(f"{f}:3: a sample must be a JSON object with task_id "
                                  "and completion")
    assert rows[3] == SampleError(f"{f}:4: missing or non-string task_id")
    assert rows[4] == EvalSample("r", None, {"p.py": "y", "old.py": None})
    assert rows[4].answer == {"p.py": "y", "old.py": None}  # type: ignore[union-attr]
    assert isinstance(rows[5], SampleError) and "completion" in rows[5].message
    assert rows[6] == EvalSample("c", "x", language="c")
    for s in rows:
        if isinstance(s, EvalSample):
            assert EvalSample.parse(s.to_dict()) == s
    # what `evaluate` was given before, dicts and messages, means the same now
    assert as_sample({"task_id": "a", "completion": "x"}) == rows[0]
    assert as_sample("why") == SampleError("why")
    assert as_sample({"task_id": "f", "completion": 5}) == EvalSample("f", None)


# checkpoint/state.json as the trainer wrote it at 06b09ac (a run with an evaluation set)
OLD_STATE = ('{"step": 2, "pass_before": 0.25, "bad_in_a_row": 1, "history": [{"step": 1, '
             '"reward": 0.5, "pass_rate": 0.5, "pass_turn1": 0.25}, {"step": 2, "reward": '
             '0.75, "pass_rate": 0.75, "pass_turn1": 0.5}], "eval_before": {"pass1": 0.25, '
             '"n": 4}}')


def test_the_trainer_state_reads_an_old_checkpoint_and_round_trips() -> None:
    s = TrainState.from_dict(json.loads(OLD_STATE))
    assert s.step == 2 and s.bad_in_a_row == 1 and s.pass_before == 0.25
    assert s.history[1] == StepSummary(2, 0.75, 0.75, 0.5)
    assert json.dumps(s.to_dict()) == OLD_STATE
    fresh = TrainState()  # no evaluation set: no eval_before key, as before
    assert fresh.to_dict() == {"step": 0, "pass_before": None, "bad_in_a_row": 0,
                               "history": []}
    assert TrainState.from_dict(fresh.to_dict()) == fresh


def test_a_journaled_task_state_is_a_task_state(tmp_path) -> None:
    path = str(tmp_path / "j.db")

    async def body() -> None:
        with Journal(path) as j:
            j.add_run("r")
            j.add_tasks("r", [("t1", 0, "", {}), ("t2", 0, "", {})], at=1.0)
            await j.stage_transition("r", "t2", 1, "pending", "queued", 2.0)
            loaded = j.load_run("r")
            assert [(t.task_id, t.state) for t in loaded] == [
                ("t1", TaskState.PENDING), ("t2", TaskState.QUEUED)]
    asyncio.run(body())
    with sqlite3.connect(path) as c:  # a state this version does not know
        c.execute("UPDATE transitions SET new='limbo' WHERE task_id='t2' AND new='queued'")
    with Journal(path) as j, pytest.raises(JournalError, match="unknown state 'limbo'"):
        j.load_run("r")
