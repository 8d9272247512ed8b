"""Exclusions are proven, never assumed: an attempt that would be excluded is checked
against a control on the same machinery before it is retried or excluded.

    attempt ──► a candidate outcome (passed, failed, timeout, memory, cheat): the grade
       │
       └─► excluded (INFRA: the machinery failed; ERROR: the task's tests failed)
             run the control (the task's reference solution, or a known-good trivial
             program) through the same judge, with no control of its own
             ├─ it proves the machinery works (the reference passes; the trivial
             │  program gets a plain verdict): the failure was the candidate's doing —
             │  FAILED (reward 0), flag `self_inflicted_infra`, no second try
             └─ it does not: the machinery (INFRA: retried, at most `retries` times)
                or the task (ERROR: kept) is broken — excluded, reward None

Without this a wrong answer could excuse itself: crash or hang the harness whenever it
is about to fail, and be excluded instead of scored 0 (issue 14, class A). The price:
a machine fault that clears before its control runs is scored as the candidate's
failure (docs/adversary.md, "What is not guaranteed").
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

from trialbox.types import Grade, Outcome

SELF_INFLICTED = "self_inflicted_infra"
"""The flag of an attempt that would have been excluded while its control was not."""

EXCLUDED = (Outcome.INFRA, Outcome.ERROR)


@dataclass(frozen=True)
class Control:
    """What a control run showed: `ok` when it proves the machinery and the task's tests
    work (`control_of`); `what` names the control and its result for the message."""

    ok: bool
    what: str


def control_of(name: str, grade: Grade, reference: bool) -> Control:
    """The Control for `grade`, the judgement of the control program `name`. A reference
    solution proves the machinery only by passing; a trivial program (it answers at
    once, wrongly) by a plain verdict, PASSED or FAILED — a timeout of either says the
    machine is too slow or stuck to prove anything, and cannot count against the
    candidate."""
    passed = sum(t.passed for t in grade.tests)
    result = f"{grade.outcome.value} ({passed}/{len(grade.tests)} tests passed)"
    ok = grade.outcome is Outcome.PASSED or (
        not reference and grade.outcome is Outcome.FAILED)
    if not ok:
        result += f": {grade.message[:300]}"
    return Control(ok, f"{name}: {result}")


async def with_infra_retries(attempt: Callable[[], Awaitable[Grade]], retries: int,
                             task_id: str,
                             control: Callable[[], Awaitable[Control]] | None = None
                             ) -> Grade:
    """Run `attempt`; while it would be excluded, run `control`, and decide as the module
    docstring draws it: the candidate's failure when the control gets a verdict, else a
    retry (INFRA, at most `1 + retries` attempts in all) or the exclusion (ERROR, or
    INFRA after the last retry). The grade records how many attempts it took and names
    the control and its result in its message.

    `control=None` (the attempt *is* the control program, or the caller has none):
    INFRA is retried and then excluded, ERROR kept, with no control run."""
    grade = Grade(task_id, Outcome.INFRA)
    for n in range(1 + retries):
        grade = replace(await attempt(), attempts=n + 1)
        if grade.outcome not in EXCLUDED:
            return grade
        if control is None:
            if grade.outcome is Outcome.ERROR:
                return grade
            continue
        checked = await control()
        if checked.ok:
            return replace(grade, outcome=Outcome.FAILED,
                           flags=tuple(sorted({*grade.flags, SELF_INFLICTED})),
                           message=(f"{grade.message[:3000]} — the candidate's doing: "
                                    f"the control ({checked.what}) got a verdict on the same "
                                    "machinery")[:4000])
        grade = replace(grade, message=(f"{grade.message[:3000]} — the control failed too "
                                        f"({checked.what})")[:4000])
        if grade.outcome is Outcome.ERROR:
            return grade
    return grade
