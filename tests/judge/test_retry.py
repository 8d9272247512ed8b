"""Infrastructure failures are retried, and only they."""

import asyncio

from trialbox.judge.retry import with_infra_retries
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
