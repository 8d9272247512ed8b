"""Class C: correct code is never graded failed or as a cheat.

Exceptions a correct solution raises cross the proxy as the built-in type they are (or
derive from), so a test's `except ValueError:` matches; a crash, a timeout or a forged
type is not an exception a test can expect. Sentinel objects a correct solution uses
inside itself are not cheats: no object crosses the boundary, so the always-equal shape
is only ever notable — one returned fails its test. docs/adversary.md, section C.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.judge.conftest import JudgeRunner
from trialbox.judge.evaluate import reward_of
from trialbox.judge.function import JudgeConfig, judge_function
from trialbox.types import Grade, Limits, Outcome, Task, TaskKind, TestCase


@pytest.fixture(scope="module")
def runner() -> Iterator[JudgeRunner]:
    """A judge pool (tests/judge/conftest.py: the shipped configuration)."""
    r = JudgeRunner()
    yield r
    r.close()


CONFIG = JudgeConfig(candidate_limits=Limits(wall_s=20, cpu_s=10, memory_mb=256, disk_mb=16),
                     harness_limits=Limits(wall_s=20, cpu_s=10, memory_mb=256, disk_mb=16),
                     call_timeout_s=2, load_timeout_s=3)


def judge(runner, task: Task, completion: str) -> Grade:
    return runner.run(judge_function(task, completion, runner.pool, CONFIG), timeout=300)


def task(*tests: str, prompt: str = "def parse(s):\n", entry: str = "parse") -> Task:
    return Task("adv-c/" + entry, TaskKind.FUNCTION, prompt, entry_point=entry,
                hidden_tests=tuple(TestCase(f"test_{i}", code) for i, code in
                                   enumerate(tests)))


# -- exceptions cross as themselves ----------------------------------------------------

RAISES = task(
    "try:\n    candidate('x')\nexcept ValueError as e:\n    assert str(e) == 'not a number: x'\n"
    "else:\n    raise AssertionError('no ValueError')",
    "try:\n    candidate('')\nexcept LookupError as e:\n    assert e.args == ('empty',)\n"
    "else:\n    raise AssertionError('no KeyError')",
    "try:\n    candidate('z')\nexcept (TypeError, ZeroDivisionError):\n    pass\n"
    "else:\n    raise AssertionError('no ZeroDivisionError')",
    "try:\n    candidate('w')\nexcept ValueError:\n    pass\n"
    "else:\n    raise AssertionError('the subclass is a ValueError')",
    "try:\n    candidate('x')\nexcept Exception as e:\n    assert type(e) is ValueError\n",
    "assert candidate('12') == 12")

CORRECT = """    if s == "":
        raise KeyError("empty")
    if s == "z":
        return 1 // 0
    if s == "w":
        raise Bad("a subclass of ValueError")
    if not s.isdigit():
        raise ValueError("not a number: " + s)
    return int(s)


class Bad(ValueError):
    pass
"""


def test_builtin_exceptions_cross_the_proxy_as_themselves(runner):
    """A correct solution raising ValueError, KeyError (caught as LookupError),
    ZeroDivisionError and its own ValueError subclass passes tests that expect them,
    with message and args intact. Before: every one arrived as the harness's own
    CandidateError, and the test failed."""
    g = judge(runner, RAISES, CORRECT)
    assert g.outcome is Outcome.PASSED, (g.outcome, g.message, g.tests)


def test_the_wrong_exception_or_none_still_fails(runner):
    """The expected type, not any: a solution raising TypeError fails the ValueError
    test, one raising nothing fails it too."""
    wrong = CORRECT.replace('raise ValueError("not a number: " + s)', "raise TypeError(s)")
    g = judge(runner, RAISES, wrong)
    assert g.outcome is Outcome.FAILED and not g.tests[0].passed, (g.outcome, g.tests)
    assert "the candidate raised TypeError" in g.tests[0].message, g.tests[0].message
    g = judge(runner, RAISES, "    return 0\n")
    assert g.outcome is Outcome.FAILED and not any(t.passed for t in g.tests[:4])


EXPECTS_ANY = task("try:\n    candidate('x')\nexcept Exception:\n    pass\n"
                   "else:\n    raise AssertionError('it should raise')")


@pytest.mark.parametrize("how", [
    "import os\n    os._exit(0)\n",                      # the process ends
    "import time\n    time.sleep(10)\n",                   # no answer in time
    "return object()\n",                                 # not plain data
    "raise SystemExit(1)\n",                             # not an Exception
    "raise KeyboardInterrupt\n",
])
def test_a_crash_or_a_timeout_is_not_the_exception_a_test_expects(runner, how):
    """`except Exception:` in a test catches exceptions the candidate raised, not a
    candidate that died, hung, returned an object or raised a BaseException. Before:
    the harness's CandidateError was an Exception, so any of these passed."""
    g = judge(runner, EXPECTS_ANY, "    " + how)
    assert g.outcome is not Outcome.PASSED and reward_of(g) == 0.0, (g.outcome, g.message)


FORGED = """    import _trialbox_stub as s
    global call
    call += 1
    s.send([call, "raised", %s])
    import time
    time.sleep(10)


call = 0
"""


@pytest.mark.parametrize("value", [
    "['SystemExit', [0]]", "['CandidateError', ['x']]", "['__import__', ['os']]",
    "['ValueErrorX', []]", "['UnicodeDecodeError', ['x']]", "'ValueError: forged text'",
    "['ValueError', 'not a list']", "[7, []]"])
def test_forged_exception_types_are_not_trusted(runner, value):
    """What the candidate's process sends as "raised" is only ever a built-in Exception
    class's name and plain args; anything else (a BaseException, a class of the judge,
    a function, an unknown name, args the class refuses, text) is a failed call that no
    `except Exception:` catches."""
    g = judge(runner, EXPECTS_ANY, FORGED % value)
    assert g.outcome is Outcome.FAILED and reward_of(g) == 0.0, (g.outcome, g.message)


# -- sentinels inside a correct solution -----------------------------------------------

SENTINELS = task(
    "assert candidate([3, 1, 2]) == 3", "assert candidate([]) is None",
    "assert candidate([-5, -7]) == -5",
    prompt="def biggest(xs):\n", entry="biggest")

SENTINEL_SOLUTION = """    best = NEG_INF
    for x in xs:
        if best < x:
            best = x
    return None if best == MISSING or best is NEG_INF else best


class _NegInf:
    def __lt__(self, other):
        return True

    def __gt__(self, other):
        return False


class _Missing:
    def __eq__(self, other):
        return False

    __hash__ = object.__hash__


NEG_INF, MISSING = _NegInf(), _Missing()
"""


def test_sentinels_inside_a_correct_solution_are_not_a_cheat(runner):
    """A -inf whose __lt__ is always True and a MISSING never equal to anything, used
    inside a correct solution: passed, not cheat. The shape is still reported (flag),
    the grade is not changed by it. Before: graded CHEAT (always-equal), reward 0."""
    g = judge(runner, SENTINELS, SENTINEL_SOLUTION)
    assert g.outcome is Outcome.PASSED and reward_of(g) == 1.0, (g.outcome, g.message)
    assert "always-equal" in g.flags


def test_an_always_equal_object_returned_still_fails(runner):
    """The exploit the shape was flagged for: returning such an object. It cannot cross
    the codec, so the test it was meant to fool fails: FAILED by the evidence, reward 0,
    the shape recorded (notable). No act reached the evidence, so it is not CHEAT
    (issue 27; before, trying made the attempt a cheat)."""
    exploit = ("    return Eq()\n\n\nclass Eq:\n    def __eq__(self, other):\n"
               "        return True\n")
    g = judge(runner, SENTINELS, exploit)
    assert g.outcome is Outcome.FAILED and reward_of(g) == 0.0, (g.outcome, g.message)
    assert not any(t.passed for t in g.tests), g.tests
    assert "always-equal" in g.flags, g.flags
    sub = ("    return S('x')\n\n\nclass S(str):\n    def __eq__(self, other):\n"
           "        return True\n\n    __hash__ = str.__hash__\n")
    g = judge(runner, SENTINELS, sub)
    assert g.outcome is Outcome.FAILED and reward_of(g) == 0.0, (g.outcome, g.message)
    assert not any(t.passed for t in g.tests) and "builtin-subclass-eq" in g.flags, g
