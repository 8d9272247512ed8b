"""The agent loop's text functions (code extraction: tests/judge/test_answer.py):
clipping, the feedback report (which must never carry a hidden test), and the record
types' validation."""

from __future__ import annotations

import json

import pytest

from trialbox.errors import UsageError
from trialbox.rollout.text import clip, default_prompt, feedback_report
from trialbox.rollout.policy import Generation, ScriptedPolicy, stop_at
from trialbox.types import (
    ExecResult,
    ExecStatus,
    Grade,
    Outcome,
    Task,
    TaskKind,
    TestCase,
    TestResult,
    Trajectory,
    Turn,
)

TASK = Task("t", TaskKind.FUNCTION, "def f(x):\n", entry_point="f",
            visible_tests=(TestCase("v1", "assert candidate(1) == 2"),
                           TestCase("v2", "assert candidate(2) == 3")),
            hidden_tests=(TestCase("secret_h", "assert candidate(999) == 1000"),))


def test_clip_keeps_head_and_tail():
    text = "Traceback ...\n" + "x" * 5000 + "\nZeroDivisionError: division by zero"
    out = clip(text, 300)
    assert len(out) <= 340 and out.startswith("Traceback")
    assert out.endswith("ZeroDivisionError: division by zero") and "characters cut" in out
    assert clip("short", 300) == "short"


def grade(*results: TestResult, outcome=Outcome.FAILED, flags=()) -> Grade:
    return Grade("t", outcome, tests=results, flags=flags,
                 message="secret_h: assertion failed 999")


def test_feedback_shows_visible_failures_only():
    g = grade(TestResult("secret_h", False, "assertion failed: 999 != 1000", hidden=True),
              TestResult("v1", False, "assertion failed", hidden=False),
              TestResult("v2", True, hidden=False))
    fb = feedback_report(TASK, "def f(x): return x", None, g, 2000)
    assert "Visible tests failed: 1 of 2" in fb and "assert candidate(1) == 2" in fb
    assert "999" not in fb and "secret" not in fb and "1000" not in fb
    # All visible pass, hidden fail: said without a word about them.
    g = grade(TestResult("secret_h", False, "assertion failed: 999", hidden=True),
              TestResult("v1", True, hidden=False), TestResult("v2", True, hidden=False))
    fb = feedback_report(TASK, "def f(x): return x + 1", None, g, 2000)
    assert "cannot see" in fb and "999" not in fb and "secret" not in fb
    g = grade(TestResult("secret_h", False, "no answer within 5.0 s", hidden=True),
              TestResult("v1", True, hidden=False), outcome=Outcome.TIMEOUT)
    assert "ran out of time" in feedback_report(TASK, "x", None, g, 2000)


def test_feedback_for_crashes_cheats_and_no_code():
    run = ExecResult(ExecStatus.EXIT, exit_code=1,
                     stderr=b"Traceback...\nNameError: name 'y' is not defined\n")
    load = "the solution failed to load: NameError: name 'y' is not defined"
    g = grade(TestResult("secret_h", False, load, hidden=True),
              TestResult("v1", False, load, hidden=False),
              TestResult("v2", False, load, hidden=False))
    fb = feedback_report(TASK, "y", run, g, 2000)
    assert fb.startswith("Running your code: exit (exit 1)") and "NameError" in fb
    assert "Visible tests failed: 2 of 2." in fb
    # Judge only (no run): one line for a message every visible test shares.
    fb = feedback_report(TASK, "y", None, g, 2000)
    assert fb.count("NameError") == 1 and "all of them" in fb
    g = grade(TestResult("v1", True, hidden=False), outcome=Outcome.CHEAT,
              flags=("frame-walk",))
    assert "frame-walk" in feedback_report(TASK, "x", None, g, 2000)
    assert "No code found" in feedback_report(TASK, None, None, None, 2000)
    assert len(feedback_report(TASK, "y", ExecResult(ExecStatus.EXIT, exit_code=1,
                                                       stderr=b"e" * 10000), g, 500)) <= 540


def test_default_prompt_shows_visible_tests_only():
    p = default_prompt(TASK)
    assert "assert candidate(1) == 2" in p and "999" not in p and "```python" in p
    stdio = Task("s", TaskKind.STDIO, "Sum.", visible_tests=(TestCase("v", stdin=b"1 2",
                                                                      expected=b"3"),),
                 hidden_tests=(TestCase("h", stdin=b"777 1", expected=b"778"),))
    p = default_prompt(stdio)
    assert "1 2" in p and "777" not in p and "778" not in p


def test_stop_at_and_generation_checks():
    assert stop_at("abc", ["c"]) == 3 and stop_at("abc", ["x"]) is None
    assert stop_at("ab|cd|", ["|"], start=3) == 6  # only new text is searched
    with pytest.raises(UsageError, match="log-probs"):
        Generation("a", (1, 2), (-1.0,))
    with pytest.raises(UsageError, match="finish_reason"):
        Generation("a", (1,), (-1.0,), "done")
    with pytest.raises(UsageError, match="not a str"):
        ScriptedPolicy("just one text")


def test_trajectory_validation_and_record():
    t = Turn("hi", (104, 105), (-0.5, -0.25), feedback_text="!", feedback_ids=(33,),
             outcome=Outcome.FAILED, exec_status=ExecStatus.EXIT)
    ok = dict(task_id="t", episode_id="t/0", prompt_ids=(1, 2), turns=(t,),
              token_ids=(1, 2, 104, 105, 33), loss_mask=(0, 0, 1, 1, 0),
              old_logprobs=(0.0, 0.0, -0.5, -0.25, 0.0), reward=0.0)
    tr = Trajectory(**ok)
    rec = json.loads(json.dumps(tr.to_json()))
    assert rec["turns"][0]["outcome"] == "failed" and rec["n_model_tokens"] == 2
    with pytest.raises(UsageError, match="same length"):
        Trajectory(**{**ok, "loss_mask": (0, 0, 1, 1)})
    with pytest.raises(UsageError, match="in order"):
        Trajectory(**{**ok, "token_ids": (1, 2, 105, 104, 33)})
    with pytest.raises(UsageError, match="loss_mask must be 1 exactly"):
        Trajectory(**{**ok, "loss_mask": (0, 0, 1, 1, 1)})
    with pytest.raises(UsageError, match="reward"):
        Trajectory(**{**ok, "reward": float("nan")})
    with pytest.raises(UsageError, match="one log-prob per token"):
        Turn("hi", (1, 2), (-0.5,))
