"""The transition table: every legal move allowed, every other move refused with an
error that names both states."""

from __future__ import annotations

import itertools

import pytest

from trialbox.errors import UsageError
from trialbox.schedule.lifecycle import (
    FINAL,
    IN_FLIGHT,
    TRANSITIONS,
    WAITING,
    IllegalTransition,
    TaskRecord,
    check,
)
from trialbox.types import TaskState as S


def test_table_covers_every_state_and_the_issue_s_path():
    assert set(TRANSITIONS) == set(S)
    path = [S.PENDING, S.QUEUED, S.GENERATING, S.EXECUTING, S.GENERATING, S.EXECUTING,
            S.GRADING, S.DONE]
    for a, b in itertools.pairwise(path):
        check("t", a, b)
    assert FINAL == {S.DONE, S.FAILED, S.TIMED_OUT, S.CANCELLED}
    assert all(s.final == (s in FINAL) for s in S)
    assert IN_FLIGHT | WAITING | FINAL == set(S)
    # preempted work goes back to QUEUED; infra failures go through RETRYING
    check("t", S.EXECUTING, S.PREEMPTED)
    check("t", S.PREEMPTED, S.QUEUED)
    check("t", S.GRADING, S.RETRYING)
    check("t", S.RETRYING, S.QUEUED)


@pytest.mark.parametrize("old,new", [(a, b) for a in S for b in S
                                     if b not in TRANSITIONS[a]])
def test_every_illegal_transition_is_refused(old, new):
    with pytest.raises(IllegalTransition) as e:
        check("task-7", old, new)
    msg = str(e.value)
    assert f"{old.name} -> {new.name}" in msg and "task-7" in msg
    assert isinstance(e.value, UsageError)
    rec = TaskRecord("task-7", 1, None, "trace", 0.0)
    rec.state = old
    with pytest.raises(IllegalTransition):
        rec.move(new)
    assert rec.state is old  # a refused move changes nothing


def test_final_states_have_no_way_out():
    for s in FINAL:
        assert TRANSITIONS[s] == frozenset()
        with pytest.raises(IllegalTransition, match="nothing \\(final\\)"):
            check("t", s, S.QUEUED)
    # nobody is preempted while grading (nearly done) or while waiting
    for s in (S.GRADING, S.QUEUED, S.PENDING, S.RETRYING):
        assert S.PREEMPTED not in TRANSITIONS[s]


def test_record_moves_along_the_table():
    rec = TaskRecord("t", 0, {"x": 1}, "tr", 1.0)
    assert rec.move(S.QUEUED) is S.PENDING and rec.state is S.QUEUED
    assert "QUEUED" in repr(rec)
