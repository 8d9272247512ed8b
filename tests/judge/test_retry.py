"""Infrastructure failures are retried, and only they; an exclusion is proven by a control
first (a control that works makes the failure the candidate's: no retry)."""

import asyncio

from trialbox.judge.retry import Control, control_of, with_infra_retries
from trialbox.types import Grade, Outcome


def run(outcomes, retries):
    seq = iter(outcomes)
    calls = []

    async def attempt():
        calls.append(1)
        return Grade("T/0", next(seq))
    return asyncio.run(with_infra_retries(attempt, retries, "T/0")), len(calls)


def test_infra_is_retried_until_it_clears():
    g, n = run([Outcome.INFRA, Outcome.INFRA, Outcome.PASSED], retries=2)
    assert (g.outcome, g.attempts, n) == (Outcome.PASSED, 3, 3)


def test_persistent_infra_stays_infra_after_the_cap():
    g, n = run([Outcome.INFRA] * 5, retries=2)
    assert (g.outcome, g.attempts, n) == (Outcome.INFRA, 3, 3)
    assert g.pass_rate is None


def test_candidate_outcomes_are_never_retried():
    for outcome in (Outcome.FAILED, Outcome.TIMEOUT, Outcome.CHEAT, Outcome.ERROR):
        g, n = run([outcome, Outcome.PASSED], retries=3)
        assert (g.outcome, g.attempts, n) == (outcome, 1, 1)


# -- the control (an exclusion is proven, never assumed) ------------------------------

def run_with_control(outcomes, control_ok, retries=2):
    seq, checks = iter(outcomes), iter(control_ok)
    calls, controls = [], []

    async def attempt():
        calls.append(1)
        return Grade("T/0", next(seq), message="harness died", flags=("x",))

    async def control():
        controls.append(1)
        ok = next(checks)
        return Control(ok, "the reference solution: " + ("passed" if ok else "infra"))
    g = asyncio.run(with_infra_retries(attempt, retries, "T/0", control))
    return g, len(calls), len(controls)


def test_an_exclusion_whose_control_works_is_the_candidates_failure_with_no_retry():
    for excluded in (Outcome.INFRA, Outcome.ERROR):
        g, n, c = run_with_control([excluded, Outcome.PASSED], [True])
        assert (g.outcome, g.attempts, n, c) == (Outcome.FAILED, 1, 1, 1)
        assert g.flags == ("self_inflicted_infra", "x") and g.pass_rate == 0.0
        assert "harness died" in g.message and "the reference solution: passed" in g.message


def test_infra_whose_control_fails_too_is_retried_then_excluded():
    g, n, c = run_with_control([Outcome.INFRA, Outcome.PASSED], [False])
    assert (g.outcome, g.attempts, n, c) == (Outcome.PASSED, 2, 2, 1)
    g, n, c = run_with_control([Outcome.INFRA] * 3, [False] * 3)
    assert (g.outcome, g.attempts, n, c) == (Outcome.INFRA, 3, 3, 3) and g.pass_rate is None
    assert "the control failed too" in g.message
    # the machinery recovers for the control but not for the candidate: its doing
    g, n, c = run_with_control([Outcome.INFRA] * 3, [False, True])
    assert (g.outcome, g.attempts, n, c) == (Outcome.FAILED, 2, 2, 2)


def test_a_broken_task_whose_control_fails_too_stays_excluded_without_retry():
    g, n, c = run_with_control([Outcome.ERROR, Outcome.PASSED], [False])
    assert (g.outcome, g.attempts, n, c) == (Outcome.ERROR, 1, 1, 1) and g.pass_rate is None


def test_candidate_outcomes_never_run_the_control():
    for outcome in (Outcome.PASSED, Outcome.FAILED, Outcome.TIMEOUT, Outcome.CHEAT):
        g, n, c = run_with_control([outcome], [])
        assert (g.outcome, n, c) == (outcome, 1, 0)


def test_control_of_asks_a_reference_to_pass_and_a_trivial_program_for_a_verdict():
    def graded(outcome):
        return Grade("T/0", outcome, message="m")
    assert control_of("ref", graded(Outcome.PASSED), reference=True).ok
    for outcome in (Outcome.FAILED, Outcome.TIMEOUT, Outcome.INFRA, Outcome.ERROR):
        assert not control_of("ref", graded(outcome), reference=True).ok
    for outcome in (Outcome.PASSED, Outcome.FAILED):
        assert control_of("trivial", graded(outcome), reference=False).ok
    for outcome in (Outcome.TIMEOUT, Outcome.MEMORY, Outcome.INFRA, Outcome.ERROR):
        assert not control_of("trivial", graded(outcome), reference=False).ok
