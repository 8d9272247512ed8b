"""Repository tasks on the trusted tier grade ordinary test suites as one process would
(issue 27, class 1): `capsys` / `capfd`, `caplog`, `pytest.warns` and
`deprecated_call`, warnings turned into errors, `asyncio.run` / `await` / `gather` of the
candidate's coroutines, a test's subclass of the candidate's class, `isinstance` with
its classes. Every case is graded on both tiers — the in-process tier is the ordinary
harness (pytest importing the code) — and must agree: a correct package passes both, a
wrong one fails both, test by test."""

from __future__ import annotations

from dataclasses import replace

import pytest

from trialbox.judge.repo import RepoJudgeConfig, judge_repo
from trialbox.types import Limits, Outcome, Task, TaskKind

FAST = RepoJudgeConfig(limits=Limits(wall_s=20, cpu_s=20, memory_mb=512, disk_mb=32))
IN_PROCESS = replace(FAST, tier="in-process")

TESTS = b'''import asyncio
import logging
import warnings

import pytest

import notes
from notes import core


def test_capsys(capsys):
    assert core.greet("bo") == 2
    out, err = capsys.readouterr()
    assert out == "hello bo\\n" and err == "careful, bo\\n"


def test_capfd(capfd):
    core.greet("al")
    assert capfd.readouterr().out == "hello al\\n"


def test_caplog_at_info(caplog):
    caplog.set_level(logging.INFO)
    assert core.save(3) == 3
    assert caplog.messages == ["saving 3"]
    record = caplog.records[0]
    assert record.levelname == "INFO" and record.name == "notes.core"


def test_caplog_default_level_drops_info(caplog):
    core.save(-1)
    assert caplog.messages == ["negative: -1"]
    assert "negative: -1" in caplog.text


def test_caplog_at_level_on_one_logger(caplog):
    with caplog.at_level(logging.DEBUG, logger="notes.core"):
        core.save(2)
    core.save(4)
    assert caplog.messages == ["checking 2", "saving 2"]


def test_logged_exception_keeps_its_traceback(caplog):
    core.broken()
    assert "ZeroDivisionError" in caplog.text


def test_warns():
    with pytest.warns(core.NotesWarning, match="careful"):
        assert core.risky() == 2
    with pytest.deprecated_call():
        assert core.old() == 1
    with pytest.warns(UserWarning):  # the candidate's class is a UserWarning
        core.risky()


@pytest.mark.filterwarnings("error::DeprecationWarning")
def test_a_warning_made_an_error():
    with pytest.raises(DeprecationWarning):
        core.old()


def test_warning_is_recorded():
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        core.old()
    assert [str(w.message) for w in seen] == ["old() is deprecated"]


def test_asyncio_run():
    assert asyncio.run(core.fetch(21)) == 42


def test_await_and_gather():
    async def both():
        one = await core.fetch(1)
        rest = await asyncio.gather(core.fetch(2), core.fetch(3))
        return [one, *rest]
    assert asyncio.run(both()) == [2, 4, 6]


def test_subclass_adds_methods():
    class Loud(core.Counter):
        def __init__(self, start):
            super().__init__(start)
            self.shouts = []

        def twice_and_shout(self):
            self.shouts.append("!")
            return self.twice() + len(self.shouts)

    c = Loud(10)
    assert c.twice_and_shout() == 13 and c.n == 12 and super(Loud, c).hit() == 13
    assert isinstance(c, core.Counter) and issubclass(Loud, core.Counter)
    assert len(c) == 13


def test_isinstance_with_the_candidates_classes():
    assert isinstance(core.Counter(0), core.Counter)
    assert isinstance(core.make(), core.Counter) and not isinstance(3, core.Counter)
    assert not isinstance(object(), core.Counter)
'''

CORE = '''import asyncio
import logging
import sys
import warnings

log = logging.getLogger(__name__)
print("notes.core imported")  # output at import: it rides on the import's answer
warnings.warn("notes.core is experimental", FutureWarning)


class NotesWarning(UserWarning):
    pass


def greet(name):
    print("hello", name)
    print("careful, " + name, file=sys.stderr)
    return len(name)


def save(x):
    log.debug("checking %s", x)
    if x < 0:
        log.warning("negative: %d", x)
    else:
        log.info("saving %s", x)
    return x


def broken():
    try:
        1 / 0
    except ZeroDivisionError:
        log.exception("could not divide")


def old():
    warnings.warn("old() is deprecated", DeprecationWarning, stacklevel=2)
    return 1


def risky():
    warnings.warn("careful now", NotesWarning)
    return 2


async def fetch(x):
    await asyncio.sleep(0)
    return x * 2


class Counter:
    def __init__(self, start=0):
        self.n = start

    def hit(self):
        self.n += 1
        return self.n

    def twice(self):
        self.hit()
        return self.hit()

    def __len__(self):
        return self.n


def make():
    return Counter(5)
'''

TASK = Task("notes", TaskKind.REPO, prompt="Implement notes.core.",
            files=(("notes/__init__.py", b""), ("notes/core.py", b"")),
            test_files=(("tests/test_notes.py", TESTS),), test_command=("pytest",))

# Each wrong answer breaks what one family of tests checks; both tiers must fail exactly
# those tests.
WRONG = {
    "prints-nothing": (CORE.replace('    print("hello", name)\n', ""),
                       {"test_capsys", "test_capfd"}),
    "logs-at-debug": (CORE.replace('log.info("saving %s", x)', 'log.debug("saving %s", x)'),
                      {"test_caplog_at_info"}),
    "no-warning": (CORE.replace('    warnings.warn("careful now", NotesWarning)\n', ""),
                   {"test_warns"}),
    "coroutine-off-by-one": (CORE.replace("return x * 2", "return x * 2 + (x == 3)"),
                             {"test_await_and_gather"}),
    "counter-off-by-one": (CORE.replace("        self.hit()\n        return self.hit()",
                                        "        return self.hit()"),
                           {"test_subclass_adds_methods"}),
}


def _failed(g) -> set[str]:
    return {t.name.rpartition("::")[2] for t in g.tests if not t.passed}


@pytest.mark.parametrize("config", [FAST, IN_PROCESS], ids=["trusted", "in-process"])
def test_a_correct_package_passes_every_ordinary_test(runner, config):
    g = runner.run(judge_repo(TASK, {"notes/core.py": CORE}, runner.pool, config))
    assert g.outcome is Outcome.PASSED, (g.message, [t for t in g.tests if not t.passed])
    assert len(g.tests) == 13 and g.flags == ()


@pytest.mark.parametrize("wrong", sorted(WRONG))
def test_a_wrong_package_fails_the_same_tests_on_both_tiers(runner, wrong):
    code, expected = WRONG[wrong]
    trusted = runner.run(judge_repo(TASK, {"notes/core.py": code}, runner.pool, FAST))
    in_process = runner.run(judge_repo(TASK, {"notes/core.py": code}, runner.pool,
                                       IN_PROCESS))
    assert trusted.outcome is Outcome.FAILED and in_process.outcome is Outcome.FAILED
    assert _failed(in_process) == expected, in_process.tests
    assert _failed(trusted) == expected, trusted.tests


# What crosses back besides the answer is data the tests' process replays, never an
# answer: a candidate that writes its own events into the stub cannot raise, return or
# pass anything through them.
FORGE_TESTS = (b"import pytest\nfrom p.core import parse\n\n\n"
               b"def test_bad_input_raises():\n    with pytest.raises(ValueError):\n"
               b"        parse('x')\n\n\n"
               b"def test_good_input():\n    assert parse('12') == 12\n")
FORGE_TASK = Task("parse", TaskKind.REPO, prompt="Implement p.core.parse.",
                  files=(("p/__init__.py", b""), ("p/core.py", b"")),
                  test_files=(("tests/test_p.py", FORGE_TESTS),), test_command=("pytest",))
FORGERIES = {
    # a "warning" whose class is ValueError: as if parse had raised it
    "warning-that-is-an-exception": '["warn", "ValueError", None, "no", __file__, 1]',
    # a record of the wrong shape, then one naming a class that is no Warning
    "malformed-record": '["log", "x", "not a level"]',
    "unknown-event": '["raise", "ValueError", "no"]',
}


@pytest.mark.parametrize("event", sorted(FORGERIES))
def test_forged_events_never_pass_a_test(runner, event):
    code = ("import sys\n\n\ndef parse(text):\n    if not text.isdigit():\n"
            "        stub = sys.modules['_trialbox_repo_stub']\n"
            f"        stub._events.append({FORGERIES[event]})\n"
            "        return None\n    return int(text)\n")
    g = runner.run(judge_repo(FORGE_TASK, {"p/core.py": code}, runner.pool, FAST))
    assert g.outcome is Outcome.FAILED, (g.message, g.tests)
    assert _failed(g) == {"test_bad_input_raises"}, g.tests


# Callbacks: the test's own objects handed to the candidate's code stay in the tests'
# process; the candidate calls them, iterates them, indexes them, reads a test class's
# attributes — and can reach nothing else there.
HOF_TESTS = b'''import itertools
from collections import defaultdict
from unittest import mock

from h import core


class Strict(defaultdict):  # a test's own class, with its own ==
    def __eq__(self, other):
        return isinstance(other, defaultdict) and dict.__eq__(self, other)


class Box:
    def __init__(self):
        self.items = {}

    def update(self, other):
        self.items.update(other)

    def __getitem__(self, k):
        return self.items[k]

    def __setitem__(self, k, v):
        self.items[k] = v


def inc(x):
    return x + 1


def test_functions_lambdas_and_builtins():
    assert core.apply(inc, [1, 2]) == [2, 3]
    assert core.apply(lambda x: x * 10, (1,)) == [10]
    assert core.apply(str.upper, ["a"]) == ["A"] and core.apply(len, ["ab"]) == [2]


def test_a_mock_records_its_calls():
    m = mock.Mock(return_value=7)
    assert core.apply(m, [1, 2]) == [7, 7]
    m.assert_has_calls([mock.call(1), mock.call(2)])


def test_an_endless_iterator_is_read_lazily():
    assert core.take(3, itertools.count(5)) == [5, 6, 7]
    gen = (x * x for x in range(10))
    assert core.take(2, gen) == [0, 1] and next(gen) == 4


def test_the_tests_objects_keep_their_class_and_identity():
    made = core.fill(lambda: Strict(int), {"a": 1})
    assert type(made) is Strict and made == Strict(int, {"a": 1})
    box = Box()
    assert core.fill(lambda: box, {"k": 2}) is box and box.items == {"k": 2}
    core.put(box, "j", 3)
    assert box["j"] == 3


def test_a_callback_may_call_the_candidate_again():
    assert core.apply(lambda x: core.apply(inc, [x])[0], [1, 2]) == [2, 3]
'''
HOF_GOOD = '''def apply(f, xs):
    return [f(x) for x in xs]


def take(n, it):
    out = []
    for x in it:
        out.append(x)
        if len(out) == n:
            break
    return out


def fill(factory, items):
    d = factory()
    d.update(items)
    return d


def put(d, k, v):
    d[k] = v
'''
HOF_TASK = Task("hof", TaskKind.REPO, prompt="Implement h.core.",
                files=(("h/__init__.py", b""), ("h/core.py", b"")),
                test_files=(("tests/test_h.py", HOF_TESTS),), test_command=("pytest",))


@pytest.mark.parametrize("config", [FAST, IN_PROCESS], ids=["trusted", "in-process"])
def test_the_tests_functions_and_objects_reach_the_candidates_code(runner, config):
    g = runner.run(judge_repo(HOF_TASK, {"h/core.py": HOF_GOOD}, runner.pool, config))
    assert g.outcome is Outcome.PASSED, (g.message, [t for t in g.tests if not t.passed])
    assert len(g.tests) == 5


# Each tries to get from a handle it was given to the rest of the tests' process (the
# runner's globals, its channel); every one ends as its own failure, never a pass.
ESCAPES = {
    "dunder-through-getattr": "f.__globals__['__builtins__']",
    "forged-getattr-request": "stub._callback(stub.object.__getattribute__(f, '_tid'), "
                              "'getattr', ('__globals__',))",
    "public-attribute-of-a-function": "f.gi_frame",
    "a-generators-frame": "g.gi_frame.f_globals",
    "an-id-never-handed-out": "stub._callback(999, 'call', ())",
    "an-unknown-operation": "stub._callback(stub.object.__getattribute__(f, '_tid'), "
                            "'setattr', ('x', 1))",
}
ESCAPE_TESTS = (b"from e import core\n\n\n"
                b"def test_reach():\n    assert core.reach(lambda: 1, (x for x in [1])) == 1\n")
ESCAPE_TASK = Task("escape", TaskKind.REPO, prompt="Implement e.core.reach.",
                   files=(("e/__init__.py", b""), ("e/core.py", b"")),
                   test_files=(("tests/test_e.py", ESCAPE_TESTS),), test_command=("pytest",))


@pytest.mark.parametrize("escape", sorted(ESCAPES))
def test_a_handle_reaches_nothing_else_of_the_tests_process(runner, escape):
    code = ("import sys\nstub = sys.modules['_trialbox_repo_stub']\n\n\n"
            f"def reach(f, g):\n    got = {ESCAPES[escape]}\n    return 1\n")
    g = runner.run(judge_repo(ESCAPE_TASK, {"e/core.py": code}, runner.pool, FAST))
    assert g.outcome is Outcome.FAILED, (g.message, g.tests)
    # refused for the reason the rule gives, not by accident
    assert any(why in g.message for why in ("AttributeError", "broke the protocol")), \
        g.message


# In place: a call that changes a list, dict or set the test passed changes the test's
# own object, as in one process — so an answer that fills an output argument passes, and
# a wrong one that mutates its input is caught by the test that checks the input after.
PLACE_TESTS = (b"from p import core\n\n\n"
               b"def test_fills_the_given_list():\n    out = []\n    inner = [9]\n"
               b"    box = {'xs': inner}\n    core.collect(out, 3)\n    core.tag(box)\n"
               b"    assert out == [0, 1, 2] and box == {'xs': [9, 'seen'], 'tagged': True}\n"
               b"    assert box['xs'] is inner\n\n\n"
               b"def test_leaves_its_input_alone():\n    data = [3, 1, 2]\n"
               b"    assert core.sorted_copy(data) == [1, 2, 3]\n    assert data == [3, 1, 2]\n")
PLACE_GOOD = ("def collect(out, n):\n    out.extend(range(n))\n\n\n"
              "def tag(box):\n    box['xs'].append('seen')\n    box['tagged'] = True\n\n\n"
              "def sorted_copy(xs):\n    return sorted(xs)\n")
PLACE_WRONG = PLACE_GOOD.replace("    return sorted(xs)\n", "    xs.sort()\n    return xs\n")
PLACE_TASK = Task("place", TaskKind.REPO, prompt="Implement p.core.",
                  files=(("p/__init__.py", b""), ("p/core.py", b"")),
                  test_files=(("tests/test_p.py", PLACE_TESTS),), test_command=("pytest",))


@pytest.mark.parametrize("config", [FAST, IN_PROCESS], ids=["trusted", "in-process"])
def test_changes_in_place_reach_the_tests_objects(runner, config):
    good = runner.run(judge_repo(PLACE_TASK, {"p/core.py": PLACE_GOOD}, runner.pool, config))
    assert good.outcome is Outcome.PASSED, (good.message, good.tests)
    bad = runner.run(judge_repo(PLACE_TASK, {"p/core.py": PLACE_WRONG}, runner.pool, config))
    assert _failed(bad) == {"test_leaves_its_input_alone"}, bad.tests
