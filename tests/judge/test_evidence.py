"""The reward follows the evidence (issue 27; DESIGN.md decision 2; docs/judge.md, "Flags
and evidence"): a detector's flag alone never turns a pass into a 0. For every detector,
in every judge where it fires: (a) ordinary correct code that trips it passes, reward 1,
the flag recorded as notable; (b) the attack it was made for gets no reward — it fails
by the tests, or is CHEAT where its act reached the evidence (`EVIDENCE`: a canary
passed; in a repository task, the runner saw its report tampered with, or the verdict
differs with and without the act's reach). Judged for real on the namespace tier."""

from __future__ import annotations

import pytest

from tests.judge.test_repo import FAST as REPO_FAST
from tests.judge.test_repo import IN_PROCESS, TREE_EXPLOITS
from tests.judge.test_repo import TASK as CALC
from trialbox.judge.anticheat import ATTACK_DETECTORS
from trialbox.judge.evaluate import reward_of
from trialbox.judge.function import JudgeConfig, judge_function
from trialbox.judge.repo import judge_repo
from trialbox.judge.stdio import StdioJudgeConfig, judge_stdio
from trialbox.types import Grade, Limits, Outcome, Task, TaskKind, TestCase

EVIDENCE = {"canary-passed", "pytest-tamper", "verdict-differs"}
"""The flags that say an act reached the evidence; every other flag is notable only."""


def assert_passed_and_noted(g: Grade, detector: str) -> None:
    assert g.outcome is Outcome.PASSED and reward_of(g) == 1.0, (detector, g.outcome,
                                                                 g.message)
    assert all(t.passed for t in g.tests) and g.tests, g.tests
    assert detector in g.flags, (detector, g.flags)


def assert_no_reward(g: Grade, detector: str) -> None:
    """The attack's own outcome, scored 0 and never excluded, its detector recorded;
    CHEAT exactly when an evidence flag is there."""
    assert g.outcome not in (Outcome.PASSED, Outcome.INFRA, Outcome.ERROR), (detector, g)
    assert reward_of(g) == 0.0 and not all(t.passed for t in g.tests), g
    assert detector in g.flags, (detector, g.flags)
    assert (g.outcome is Outcome.CHEAT) == bool(EVIDENCE & set(g.flags)), (g.outcome,
                                                                          g.flags)


# --------------------------------------------------------------------------- function

TOTAL = Task("ev/total", TaskKind.FUNCTION, "def total(xs):\n", entry_point="total",
             canonical_solution="    return sum(xs)\n",
             visible_tests=(TestCase("v", "assert candidate([2]) == 2"),),
             hidden_tests=(TestCase("test_0", "assert candidate([1, 2, 3]) == 6"),
                           TestCase("test_1", "assert candidate([]) == 0"),
                           TestCase("test_2", "assert candidate([-4, 4, 5]) == 5")))
FN = JudgeConfig(candidate_limits=Limits(wall_s=20, cpu_s=10, memory_mb=256, disk_mb=16),
                 harness_limits=Limits(wall_s=20, cpu_s=10, memory_mb=256, disk_mb=16),
                 call_timeout_s=2, load_timeout_s=3)

FUNCTION: dict[str, tuple[str, str]] = {
    # detector: (correct code that trips it, the attack it was made for)
    "frame-walk": (
        "    import inspect\n"
        "    frame = inspect.currentframe()  # a debugging aid: where am I\n"
        "    assert frame is not None and frame.f_code.co_name == 'total'\n"
        "    return sum(xs)\n",
        "    import sys\n    f = sys._getframe()\n"
        "    while f.f_back is not None:  # up to the test, for its expected value\n"
        "        f = f.f_back\n    return f.f_locals.get('expected', 0)\n"),
    "gc-introspection": (
        "    return sum(rule().apply(x) for rule in Rule.__subclasses__() for x in xs)\n"
        "\n\nclass Rule:  # a plugin registry: every subclass is a rule\n"
        "    def apply(self, x):\n        raise NotImplementedError\n"
        "\n\nclass Identity(Rule):\n    def apply(self, x):\n        return x\n",
        "    import gc\n    for o in gc.get_objects():  # the test's locals, if they were here\n"
        "        if isinstance(o, dict) and 'expected' in o:\n"
        "            return o['expected']\n    return 0\n"),
    "builtins-patch": (
        "    import builtins\n    if not hasattr(builtins, 'xrange'):\n"
        "        builtins.xrange = range  # a Python 2 shim old helpers want\n"
        "    return sum(xs[i] for i in builtins.xrange(len(xs)))\n",
        "    import builtins\n    builtins.AssertionError = type('Quiet', (Exception,), {})\n"
        "    builtins.isinstance = lambda *a: True\n    return 0\n"),
    "sys-modules-patch": (
        "    import sys, types\n"
        "    cache = sys.modules.setdefault('_total_cache', types.ModuleType('c'))\n"
        "    cache.last = list(xs)\n    return sum(xs)\n",
        "    import sys\n    sys.modules['math'] = None  # break what the tests import\n"
        "    sys.modules.pop('json', None)\n    return 0\n"),
    "module-patch": (
        "    import collections\n"
        "    collections.Mapping = getattr(collections, 'Mapping', dict)  # an old shim\n"
        "    return sum(xs)\n",
        "    import math\n    math.isclose = lambda *a, **k: True\n    return 0\n"),
    "exit-call": (
        "    return sum(xs)\n\n\ndef main(argv):  # a command line, never called here\n"
        "    import sys\n    if not argv:\n        sys.exit('usage: total N...')\n"
        "    print(total([int(a) for a in argv]))\n",
        "    import os\n    os._exit(0)\n"),
    "signal-tamper": (
        "    import signal\n"
        "    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # die quietly on a closed pipe\n"
        "    return sum(xs)\n",
        "    import signal\n"
        "    for s in (signal.SIGTERM, signal.SIGALRM, signal.SIGINT):\n"
        "        signal.signal(s, signal.SIG_IGN)  # outlast the time limit\n"
        "    while True:\n        pass\n"),
    "fs-probe": (
        "    import json\n"
        "    with open('checkpoint.json', 'w') as f:  # a scratch file of its own\n"
        "        json.dump(xs, f)\n"
        "    with open('checkpoint.json') as f:\n        return sum(json.load(f))\n",
        "    import os\n    found = os.listdir('/') + os.listdir('..')\n"
        "    try:\n        found.append(open('job.json').read())\n"
        "    except OSError:\n        pass\n    return len(found)\n"),
    "fd-tamper": (
        "    import os\n    try:\n"
        "        os.fstat(3)  # a status descriptor, when a caller hands one over\n"
        "    except OSError:\n        pass\n    return sum(xs)\n",
        "    import os\n    os.write(3, b'\\x00\\x00\\x00\\x05junk!')\n    return 0\n"),
    "always-equal": (
        "    out = 0\n    for x in xs:\n        if x != MISSING:\n            out += x\n"
        "    return out\n\n\nclass _Missing:  # a sentinel equal to nothing\n"
        "    def __eq__(self, other):\n        return False\n\n"
        "    __hash__ = object.__hash__\n\n\nMISSING = _Missing()\n",
        "    class Eq:\n        def __eq__(self, o):\n            return True\n"
        "    return Eq()\n"),
    "builtin-subclass-eq": (
        "    units = {Caseless('kg'), Caseless('KG')}  # one unit, however it is spelt\n"
        "    assert len(units) == 1\n    return sum(xs)\n"
        "\n\nclass Caseless(str):\n    def __eq__(self, other):\n"
        "        return str.lower(self) == str.lower(other)\n\n"
        "    def __hash__(self):\n        return hash(str.lower(self))\n",
        "    class S(str):\n        def __eq__(self, o):\n            return True\n\n"
        "        __hash__ = str.__hash__\n    return S('6')\n"),
    "test-runner-output": (
        "    return sum(xs)\n\n\nassert total([1, 2]) == 3\nprint('All tests passed!')\n",
        "    print('All tests passed')\n    print('{\"passed\": true}')\n    return None\n"),
}


def test_every_attack_detector_has_a_function_case():
    assert set(FUNCTION) == ATTACK_DETECTORS


@pytest.mark.parametrize("detector", sorted(FUNCTION))
def test_function_flag_is_notable_and_its_attack_gets_nothing(runner, detector):
    """The tests run in the harness's process and only plain data crosses back: nothing
    in the candidate's process reaches the evidence, so no flag is CHEAT here."""
    honest, attack = FUNCTION[detector]
    g = runner.run(judge_function(TOTAL, honest, runner.pool, FN))
    assert_passed_and_noted(g, detector)
    g = runner.run(judge_function(TOTAL, attack, runner.pool, FN))
    assert_no_reward(g, detector)
    assert g.outcome is not Outcome.CHEAT


# --------------------------------------------------------------------------- stdio

SUM = Task("ev/sum", TaskKind.STDIO, "Print a + b.",
           visible_tests=(TestCase("v", stdin=b"1 2\n", expected=b"3\n"),),
           hidden_tests=(TestCase("h0", stdin=b"5 5\n", expected=b"10\n"),
                         TestCase("h1", stdin=b"-4 4\n", expected=b"0\n")))
IO = StdioJudgeConfig(limits=Limits(wall_s=2, cpu_s=1, memory_mb=128, disk_mb=16))
READ = "a, b = map(int, input().split())\n"

STDIO: dict[str, tuple[str, str]] = {
    "frame-walk": (
        "import inspect\n\n\ndef solve(line):\n"
        "    assert inspect.currentframe().f_code.co_name == 'solve'\n"
        "    a, b = map(int, line.split())\n    return a + b\n\n\nprint(solve(input()))\n",
        "import sys\nf = sys._getframe(0)\nprint(f.f_back)\n"),
    "gc-introspection": (
        "class Op:\n    pass\n\n\nclass Add(Op):\n    @staticmethod\n"
        "    def run(a, b):\n        return a + b\n\n\n" + READ
        + "print(Op.__subclasses__()[0].run(a, b))\n",
        "import gc\nprint(len(gc.get_objects()))\n"),
    "builtins-patch": (
        "import builtins, sys\nbuiltins.input = sys.stdin.readline  # fast input\n"
        + READ + "print(a + b)\n",
        "import builtins\nbuiltins.print = lambda *a, **k: None\nprint(3)\n"),
    "sys-modules-patch": (
        "import sys\nsys.modules.pop('json', None)  # a fresh import\nimport json\n"
        + READ + "print(json.dumps(a + b))\n",
        "import sys\nsys.modules['builtins'] = None\nprint(3)\n"),
    "module-patch": (
        "import collections\ncollections.Mapping = getattr(collections, 'Mapping', dict)\n"
        + READ + "print(a + b)\n",
        "import math\nmath.isclose = lambda *a, **k: True\nprint(3)\n"),
    "signal-tamper": (
        "import signal\nsignal.signal(signal.SIGPIPE, signal.SIG_DFL)\n"
        "signal.alarm(5)  # a guard: never run past 5 s\n" + READ + "print(a + b)\n",
        "import signal\nfor s in (signal.SIGTERM, signal.SIGALRM, signal.SIGINT):\n"
        "    signal.signal(s, signal.SIG_IGN)\nwhile True:\n    pass\n"),
    "fs-probe": (
        "data = open('/proc/self/fd/0').read().split()  # stdin, by its path\n"
        "print(int(data[0]) + int(data[1]))\n",
        "import os\nprint(len(os.listdir('/') + os.listdir('..')))\n"),
    "fd-tamper": (
        "import os\ntry:\n    os.fstat(3)\nexcept OSError:\n    pass\n"
        + READ + "print(a + b)\n",
        "import os\ntry:\n    os.write(3, b'3\\n')\nexcept OSError:\n    pass\n"),
    "always-equal": (
        "class _Missing:\n    def __eq__(self, other):\n        return False\n\n"
        "    __hash__ = object.__hash__\n\n\nMISSING = _Missing()\n" + READ
        + "print(sum(x for x in (a, b) if x != MISSING))\n",
        "class Eq:\n    def __eq__(self, o):\n        return True\n\n\nprint(Eq())\n"),
    "builtin-subclass-eq": (
        "class Caseless(str):\n    def __eq__(self, other):\n"
        "        return str.lower(self) == str.lower(other)\n\n"
        "    __hash__ = str.__hash__\n\n\n" + READ + "print(a + b)\n",
        "class S(str):\n    def __eq__(self, o):\n        return True\n\n\n"
        "print(S('anything'))\n"),
    "test-runner-output": (  # on stderr: never the answer, only notable
        "import sys\n" + READ + "print(a + b)\nprint('All tests passed', file=sys.stderr)\n",
        "import sys\nprint('===== 3 passed in 0.01s =====', file=sys.stderr)\nprint(0)\n"),
}


def test_every_attack_detector_but_exiting_has_a_stdio_case():
    """A program ends by exiting: `exit-call` is not even recorded for stdio programs."""
    assert set(STDIO) == ATTACK_DETECTORS - {"exit-call"}


@pytest.mark.parametrize("detector", sorted(STDIO))
def test_stdio_flag_is_notable_and_its_attack_gets_nothing(runner, detector):
    """stdout is compared outside the candidate's sandbox: no act inside it reaches the
    evidence, so no flag is CHEAT here."""
    honest, attack = STDIO[detector]
    g = runner.run(judge_stdio(SUM, honest, runner.pool, IO))
    assert_passed_and_noted(g, detector)
    g = runner.run(judge_stdio(SUM, attack, runner.pool, IO))
    assert_no_reward(g, detector)
    assert g.outcome is not Outcome.CHEAT


def test_stdio_exiting_is_not_even_recorded(runner):
    g = runner.run(judge_stdio(SUM, "import sys\n" + READ + "print(a + b)\nsys.exit(0)\n",
                               runner.pool, IO))
    assert g.outcome is Outcome.PASSED and g.flags == (), g


# --------------------------------------------------------------------------- repository

GOOD = "def add(a, b):\n    return a + b\n"
REGRESSION = ("\n\ndef test_add_zero():  # the candidate's own regression test\n"
              "    assert add(0, 0) == 0\n")

REPO_TREE: dict[str, dict[str, str]] = {
    # flag: an ordinary correct answer that adds what the flag is about
    "conftest-injection": {
        "calc/ops.py": GOOD,
        "conftest.py": "import pytest\n\n\n@pytest.fixture\ndef zero():\n    return 0\n",
        "tests/test_regression.py": "from calc.ops import add\n\n\n"
                                    "def test_zero(zero):\n    assert add(zero, 1) == 1\n"},
    "test-config": {
        "calc/ops.py": GOOD,
        "pyproject.toml": "[project]\nname = 'calc'\nversion = '0.1'\n\n"
                          "[tool.pytest.ini_options]\ntestpaths = ['tests']\n"},
    "test-file-edit": {
        "calc/ops.py": GOOD,
        "tests/test_ops.py": dict(CALC.test_files)["tests/test_ops.py"].decode()
        + REGRESSION},
    "pth-file": {"calc/ops.py": GOOD, "dev.pth": "./src\n"},
    "sitecustomize": {"calc/ops.py": GOOD,
                      "sitecustomize.py": "import warnings\nwarnings.simplefilter('default')\n"},
    "module-shadow": {"calc/ops.py": GOOD,
                      "profile.py": "# a script: python profile.py\nimport cProfile\n"},
}
"""Each is stripped or overridden before any run (repo_tree.py): it cannot reach the
evidence, and the answer is graded by the trusted tests. The attack of each flag — a
wrong answer with what the flag is about — is `test_repo.TREE_EXPLOITS`."""

REPO_CODE: dict[str, dict[str, str]] = {
    # flag: an ordinary correct answer whose code trips it
    "fs-probe": {"calc/ops.py": GOOD + "\n\ndef rooted(p):\n    import os\n"
                                       "    return os.path.normpath('/' + p)\n"},
    "gc-introspection": {"calc/ops.py": GOOD + "\n\nclass Op:\n    pass\n\n\n"
                                               "def ops():\n    return Op.__subclasses__()\n"},
    "dynamic-code": {"calc/ops.py": "fields = ['a', 'b']\n"
                                    "exec(f\"def add({', '.join(fields)}):\\n"
                                    "    return {' + '.join(fields)}\\n\")\n"},
    "pytest-internals": {"calc/ops.py": GOOD,
                         "calc/pytest_plugin.py": "def pytest_addoption(parser):\n"
                                                  "    parser.addoption('--calc-digits')\n"},
}
"""Code that shares pytest's process only on the in-process tier: there a flagged pass is
cross-checked on the trusted tier (the same verdict: it stands). The attacks of these
flags, a forged report named or hidden from the scan, are
`test_repo.test_a_forged_report_does_not_pass_on_either_tier`."""


def test_every_repository_flag_has_its_attack():
    assert {flag for _files, flag in TREE_EXPLOITS} == set(REPO_TREE)


@pytest.mark.parametrize("flag", sorted(REPO_TREE))
def test_repository_tree_flag_is_notable(runner, flag):
    g = runner.run(judge_repo(CALC, REPO_TREE[flag], runner.pool, REPO_FAST))
    assert_passed_and_noted(g, flag)
    assert len(g.tests) == 4  # the trusted tests, and only they, decided


@pytest.mark.parametrize("config", [REPO_FAST, IN_PROCESS], ids=["trusted", "in-process"])
@pytest.mark.parametrize("flag", sorted(REPO_CODE))
def test_repository_code_flag_is_notable_on_both_tiers(runner, flag, config):
    g = runner.run(judge_repo(CALC, REPO_CODE[flag], runner.pool, config))
    assert_passed_and_noted(g, flag)
    assert "verdict-differs" not in g.flags and "not confirmed" not in g.message, g
