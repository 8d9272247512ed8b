"""Infrastructure failures are retried; what persists is graded INFRA (reward None)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace

from trialbox.types import Grade, Outcome


async def with_infra_retries(attempt: Callable[[], Awaitable[Grade]], retries: int,
                             task_id: str) -> Grade:
    """Run `attempt` until its outcome is not INFRA, at most `1 + retries` times; the
    grade records how many attempts it took. A candidate cannot cause INFRA (only the
    machinery can), so retrying never gives a cheat a second chance to pass."""
    grade = Grade(task_id, Outcome.INFRA)
    for n in range(1 + retries):
        grade = replace(await attempt(), attempts=n + 1)
        if grade.outcome is not Outcome.INFRA:
            break
    return grade
