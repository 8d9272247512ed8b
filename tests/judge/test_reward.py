"""Rewards: hand-computed values for each branch, spec validation, real ruff findings."""

import math
import sys

import pytest

from trialbox.errors import InfraError, UsageError
from trialbox.judge.reward import (
    RUFF_FAILED,
    RewardSpec,
    efficiency_score,
    memory_score,
    reward,
    style_findings,
    style_score,
)
from trialbox.types import Grade, Outcome, TestResult

WEIGHTED = RewardSpec(pass_rate=2, all_passed=1, style=0.5, efficiency=0.5, binary=False)


def grade(outcome: Outcome, passed: int, total: int) -> Grade:
    tests = tuple(TestResult(f"t{i}", i < passed) for i in range(total))
    return Grade("T/0", outcome, tests)


# --------------------------------------------------------------------------- reward

def test_binary_default():
    spec = RewardSpec()
    assert reward(grade(Outcome.PASSED, 4, 4), spec) == 1.0
    assert reward(grade(Outcome.FAILED, 3, 4), spec) == 0.0
    assert reward(grade(Outcome.TIMEOUT, 0, 4), spec) == 0.0
    assert reward(grade(Outcome.MEMORY, 0, 4), spec) == 0.0
    # style and efficiency do not enter a binary reward
    assert reward(grade(Outcome.FAILED, 3, 4), spec, style=1.0, efficiency=1.0) == 0.0


def test_weighted_all_components():
    # FLOOR = (2 + 1) / 4 = 0.75; not a pass: 0.75 * (2*0.75 + 1*0 + 0.5*0.8) / 3.5
    assert reward(grade(Outcome.FAILED, 3, 4), WEIGHTED, style=0.8,
                  efficiency=0.2) == pytest.approx(0.75 * 1.9 / 3.5)
    # a pass: (2*1 + 1*1 + 0.5*0.8 + 0.5*0.2) / 4
    assert reward(grade(Outcome.PASSED, 4, 4), WEIGHTED, style=0.8,
                  efficiency=0.2) == pytest.approx(3.5 / 4)
    assert reward(grade(Outcome.PASSED, 4, 4), WEIGHTED, style=1.0,
                  efficiency=1.0) == pytest.approx(1.0)
    # the least a pass scores is FLOOR; the most a failure scores is below it
    assert reward(grade(Outcome.PASSED, 4, 4), WEIGHTED, style=0.0,
                  efficiency=0.0) == pytest.approx(0.75)
    assert reward(grade(Outcome.FAILED, 0, 4), WEIGHTED, style=0.0,
                  efficiency=0.0) == 0.0
    # no tests at all: pass rate 0; no efficiency given: 0.75 * (2*0 + 1*0 + 0.5*1) / 3.5
    assert reward(Grade("T/0", Outcome.FAILED), WEIGHTED,
                  style=1.0) == pytest.approx(0.75 * 0.5 / 3.5)


def test_weighted_missing_components_are_dropped_not_zeroed():
    g = grade(Outcome.PASSED, 4, 4)
    # efficiency None: (2 + 1 + 0.4) / 3.5
    assert reward(g, WEIGHTED, style=0.8) == pytest.approx(3.4 / 3.5)
    # both None: (2 + 1) / 3
    assert reward(g, WEIGHTED) == pytest.approx(1.0)
    # a zero weight ignores a given value
    spec = RewardSpec(pass_rate=1, efficiency=1, binary=False)
    assert reward(g, spec, style=0.0, efficiency=0.5) == pytest.approx((1 + 0.5) / 2)
    # pass rate alone, weighted: the fraction of tests (FLOOR is 1)
    assert reward(grade(Outcome.FAILED, 3, 4), RewardSpec(binary=False)) == \
        pytest.approx(0.75)


def test_a_weighted_spec_must_weigh_the_tests():
    for only in ({"style": 1}, {"memory": 1}, {"efficiency": 1}):
        with pytest.raises(UsageError, match="must weigh the tests"):
            RewardSpec(pass_rate=0, binary=False, **only)


@pytest.mark.parametrize("spec", [
    WEIGHTED,
    RewardSpec(binary=False),
    RewardSpec(pass_rate=1, efficiency=9, memory=9, style=9, binary=False),
    RewardSpec(pass_rate=0, all_passed=1, style=5, binary=False),
    RewardSpec(pass_rate=0.7, style=0.1, efficiency=0.1, memory=0.1, binary=False),
])
def test_every_pass_scores_above_every_answer_that_does_not_pass(spec):
    """The reward orders correctness first: the worst pass (slow, heavy, ugly) beats the
    best non-pass (12 of 13 tests, perfect style; or every test passed but the run did
    not end cleanly) — before, a failure was exempt from efficiency and memory and a
    12-of-13 wrong answer outranked a slower correct one."""
    comps = [None, 0.0, 0.3, 1.0]
    passes = [reward(grade(Outcome.PASSED, 13, 13), spec, style=s, efficiency=e, memory=m)
              for s in comps for e in comps for m in comps]
    fails = [reward(grade(o, p, 13), spec, style=s, efficiency=e, memory=m)
             for o in (Outcome.FAILED, Outcome.TIMEOUT, Outcome.MEMORY)
             for p in (0, 6, 12, 13) for s in comps for e in comps for m in comps]
    assert min(passes) > max(fails), (min(passes), max(fails))  # type: ignore[operator]
    # and partial credit (weighted pass_rate) still ranks failures among themselves
    assert spec.pass_rate == 0 or reward(grade(Outcome.FAILED, 12, 13), spec) > \
        reward(grade(Outcome.FAILED, 1, 13), spec)  # type: ignore[operator]


@pytest.mark.parametrize("bad", [{"style": 1.5}, {"efficiency": -0.1},
                                 {"style": math.nan}])
def test_component_values_out_of_range(bad):
    with pytest.raises(UsageError, match=next(iter(bad))):
        reward(grade(Outcome.PASSED, 1, 1), WEIGHTED, **bad)


@pytest.mark.parametrize("spec", [RewardSpec(), WEIGHTED])
def test_cheat_scores_zero_even_when_every_test_passed(spec):
    g = Grade("T/0", Outcome.CHEAT, (TestResult("a", True), TestResult("b", True)),
              flags=("frame_walk",))
    assert g.pass_rate == 1.0
    assert reward(g, spec, style=1.0, efficiency=1.0) == 0.0


@pytest.mark.parametrize("outcome", [Outcome.INFRA, Outcome.ERROR])
@pytest.mark.parametrize("spec", [RewardSpec(), WEIGHTED])
def test_excluded_outcomes_are_none_never_zero(outcome, spec):
    g = Grade("T/0", outcome, (TestResult("a", True),), attempts=3)
    r = reward(g, spec, style=1.0, efficiency=1.0)
    assert r is None and r != 0.0
    assert reward(Grade("T/0", outcome), spec) is None


# --------------------------------------------------------------------------- spec

@pytest.mark.parametrize(("kwargs", "field"), [
    ({"pass_rate": -1.0}, "pass_rate"),
    ({"all_passed": math.inf, "binary": False}, "all_passed"),
    ({"style": math.nan, "binary": False}, "style"),
    ({"efficiency": "1", "binary": False}, "efficiency"),
    ({"style": 0.5}, "style"),               # binary=True with another weight
    ({"all_passed": 1.0}, "all_passed"),
    ({"pass_rate": 0.0}, "pass_rate"),       # every weight 0
    ({"pass_rate": 0.0, "binary": False}, "pass_rate"),
])
def test_spec_validation_names_the_field(kwargs, field):
    with pytest.raises(UsageError, match=field):
        RewardSpec(**kwargs)


def test_binary_error_says_what_to_change():
    with pytest.raises(UsageError, match="binary=False"):
        RewardSpec(efficiency=1.0)


def test_spec_is_frozen():
    with pytest.raises(AttributeError):
        RewardSpec().binary = False  # type: ignore[misc]


# --------------------------------------------------------------------------- style

def test_ruff_finds_unused_import_and_long_line():
    src = "import os\n\nx = '" + "a" * 100 + "'\n"
    findings = style_findings(src)
    assert findings == ("F401 1: `os` imported but unused",
                        "E501 3: Line too long (106 > 88)")
    assert style_score(findings, len(src.splitlines())) == 0.0  # 2 findings in 3 lines


def test_clean_code_has_no_findings():
    src = "def add(a, b):\n    return a + b\n"
    assert style_findings(src) == ()
    assert style_score(style_findings(src), 2) == 1.0


def test_syntax_errors_and_odd_bytes_are_findings_not_failures():
    assert style_findings("def f(:\n")[0].startswith("invalid-syntax 1:")
    # a lone surrogate (as surrogateescape decoding leaves for invalid UTF-8) would make
    # ruff refuse the whole stream; it must still be checked
    assert style_findings("x = '\udcff'\n") == ()
    assert style_findings("") == ()


def test_ruff_is_never_run_on_the_source_as_code(tmp_path):
    marker = tmp_path / "ran"
    style_findings(f"open({str(marker)!r}, 'w').write('x')\n")
    assert not marker.exists()


def test_missing_ruff_names_the_fix(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    with pytest.raises(UsageError, match="pip install ruff"):
        style_findings("x = 1\n")


def fake_ruff(tmp_path, monkeypatch, script):
    exe = tmp_path / "ruff"
    exe.write_text("#!/bin/sh\n" + script)
    exe.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))


def test_ruff_failing_on_one_source_is_the_sources_finding(tmp_path, monkeypatch):
    # the candidate's source crashes (or hangs) ruff, trivial code does not: a finding
    # that scores style 0.0, never an infrastructure error
    fake_ruff(tmp_path, monkeypatch,
              'src=$(cat); case "$src" in *BOOM*) echo panic >&2; exit 2;; '
              '*HANG*) exec sleep 5;; esac; echo "[]"\n')
    (finding,) = style_findings("BOOM = 1\n")
    assert finding.startswith(f"{RUFF_FAILED} 0: ruff exited 2: panic")
    assert style_score((finding,), 10_000) == 0.0
    monkeypatch.setattr("trialbox.judge.reward.RUFF_TIMEOUT_S", 0.2)
    (finding,) = style_findings("HANG = 1\n")
    assert finding.startswith(f"{RUFF_FAILED} 0: ruff did not finish")


def test_ruff_failing_on_everything_is_infra(tmp_path, monkeypatch):
    fake_ruff(tmp_path, monkeypatch, "echo broken >&2; exit 2\n")
    with pytest.raises(InfraError, match="trivial code"):
        style_findings("x = 1\n")


def test_style_score_values():
    assert style_score((), 0) == 1.0
    assert style_score(("E1 1: m",), 20) == pytest.approx(0.5)
    assert style_score(("E1 1: m",), 100) == pytest.approx(0.9)
    assert style_score(("E1 1: m",) * 5, 10) == 0.0          # clamped
    assert style_score((f"{RUFF_FAILED} 0: timeout",), 10_000) == 0.0


# --------------------------------------------------------------------------- efficiency

def test_efficiency_edge_cases():
    assert efficiency_score(10.0, None) is None
    assert efficiency_score(5.0, 10.0) == 1.0       # faster
    assert efficiency_score(10.0, 10.0) == 1.0      # as fast
    assert efficiency_score(20.0, 10.0) == 0.5      # twice as slow
    assert efficiency_score(40.0, 10.0) == 0.25
    assert efficiency_score(0.0, 0.0) == 1.0
    assert efficiency_score(1.0, 0.0) == 0.0        # reference too fast to measure
    assert efficiency_score(math.inf, 10.0) == 0.0
    for a, b in [(-1.0, 10.0), (math.nan, 10.0)]:
        with pytest.raises(UsageError, match="candidate_ms"):
            efficiency_score(a, b)
    for a, b in [(1.0, -1.0), (1.0, math.inf), (1.0, math.nan)]:
        with pytest.raises(UsageError, match="reference_ms"):
            efficiency_score(a, b)


# --------------------------------------------------------------------------- memory

def test_memory_score_edge_cases():
    MiB = 1 << 20
    assert memory_score(10 * MiB, None) is None
    assert memory_score(8 * MiB, 16 * MiB) == 1.0    # less than the reference
    assert memory_score(16 * MiB, 16 * MiB) == 1.0
    assert memory_score(32 * MiB, 16 * MiB) == 0.5   # twice the reference's peak
    assert memory_score(1, 0) == 0.0
    for a, b in [(-1, 10), (1.5, 10), (True, 10)]:
        with pytest.raises(UsageError, match="candidate_bytes"):
            memory_score(a, b)
    with pytest.raises(UsageError, match="reference_bytes"):
        memory_score(1, -1)


def test_weighted_reward_with_memory():
    spec = RewardSpec(pass_rate=0.7, style=0.1, efficiency=0.1, memory=0.1, binary=False)
    g = grade(Outcome.PASSED, 4, 4)
    assert reward(g, spec, style=1.0, efficiency=1.0, memory=0.5) == pytest.approx(0.95)
    # no memory measured: dropped from the mean, not scored 0
    assert reward(g, spec, style=1.0, efficiency=1.0) == pytest.approx(1.0)
    assert reward(grade(Outcome.CHEAT, 4, 4), spec, memory=1.0) == 0.0
    assert reward(grade(Outcome.INFRA, 0, 4), spec, memory=1.0) is None
    with pytest.raises(UsageError, match="memory"):
        reward(g, spec, memory=1.5)
    with pytest.raises(UsageError, match="memory"):
        RewardSpec(memory=-1, binary=False)
