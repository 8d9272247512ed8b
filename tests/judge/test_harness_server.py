"""The harness server: a shared harness session runs one trusted server that runs
judgement after judgement in its own process. What one job changes in the interpreter
is put back before the next, a hung job is interrupted on its deadline (graded as a
broken test, not a wrong answer), and a server that dies is an infrastructure failure:
retried, never scored."""

from __future__ import annotations

import asyncio

from tests.judge.test_function import FAST
from trialbox.judge.function import _servers, judge_function, open_harness
from trialbox.types import Outcome, Task, TaskKind, TestCase

PROMPT = "def add(a, b):\n"
GOOD = "    return a + b\n"


def task(*tests: str, setup: str = "") -> Task:
    return Task("t/add", TaskKind.FUNCTION, PROMPT, entry_point="add", test_setup=setup,
                hidden_tests=tuple(TestCase(f"test_{i}", code) for i, code in
                                   enumerate(tests)))


SHORT = FAST.__class__(**{**FAST.__dict__, "call_timeout_s": 0.5, "load_timeout_s": 0.5})
"""Short call and load limits: a job's deadline comes within seconds."""


def judge_in_turn(runner, config, *jobs):
    """Grade (task, completion) pairs one after another on one harness server."""
    async def body():
        harness = await open_harness(runner.pool, config)
        try:
            return [await judge_function(t, c, runner.pool, config, harness)
                    for t, c in jobs]
        finally:
            await harness.close()
    return runner.run(body())


def test_one_server_serves_many_jobs_and_jobs_do_not_share_state(runner):
    """Test code that changes module state in one job does not see it in the next: the
    server puts back module globals, sys.path, the recursion limit and the modules a
    job imported, and seeds `random` from the job's seed (here given: 1234), so the
    draws of one job do not move those of the next."""
    leaky = task("import json; json.leaked = getattr(json, 'leaked', 0) + 1",
                 "import json; assert json.leaked == 1, json.leaked",
                 "import sys; assert '/leak' not in sys.path; sys.path.append('/leak')",
                 "import sys; assert sys.getrecursionlimit() != 1077; "
                 "sys.setrecursionlimit(77 + 1000)",
                 "import sys; assert 'colorsys' not in sys.modules; import colorsys",
                 "import random; assert random.random() == random.Random(1234).random()",
                 "assert candidate(2, 3) == 5")

    async def body():
        harness = await open_harness(runner.pool, FAST)
        try:
            grades = [await judge_function(leaky, GOOD, runner.pool, FAST, harness,
                                           seed=1234) for _ in range(4)]
            server = _servers[harness]
            return grades, server.seq, server.alive
        finally:
            await harness.close()
    grades, seq, alive = runner.run(body())
    assert [g.outcome for g in grades] == [Outcome.PASSED] * 4, [g.message for g in grades]
    assert seq == 4 and alive  # one server, four jobs
    runner.assert_no_leaks()


def test_a_hung_test_job_is_killed_and_the_server_goes_on(runner):
    """A job past its deadline (here: test code that never returns) is killed; the grade
    says the harness produced no result (a broken task, excluded), and the next job on
    the same server is graded normally."""
    hung = task("while True: pass")
    ok = task("assert candidate(1, 1) == 2")
    g1, g2 = judge_in_turn(runner, SHORT, (hung, GOOD), (ok, GOOD))
    assert g1.outcome is Outcome.ERROR and "deadline" in g1.message, g1.message
    assert g2.outcome is Outcome.PASSED, g2.message
    runner.assert_no_leaks()


def test_a_server_killed_mid_job_is_checked_by_a_control_and_not_retried(runner):
    """Kill the harness session's server while it runs a job: the attempt would be an
    infrastructure failure, but a control (the trivial program) then gets a verdict on
    a new server, so the machinery is proven to work and the failure is scored as the
    candidate's (retry.py: an exclusion is proven, never assumed) — FAILED, flagged
    `self_inflicted_infra`, with no second try. The price of the rule: a fault that
    clears before its control runs counts against the candidate (docs/adversary.md)."""
    slow = task("import time; time.sleep(1.0)", "assert candidate(2, 2) == 4")

    async def body():
        harness = await open_harness(runner.pool, FAST)
        try:
            judging = asyncio.ensure_future(
                judge_function(slow, GOOD, runner.pool, FAST, harness))
            await asyncio.sleep(0.5)
            await harness.stop()  # kills the server and its job
            return await judging
        finally:
            await harness.close()
    g = runner.run(body())
    assert g.outcome is Outcome.FAILED and g.attempts == 1, (g.outcome, g.message,
                                                             g.attempts)
    assert "self_inflicted_infra" in g.flags and g.pass_rate == 0.0
    assert "stopped answering" in g.message and "a trivial program" in g.message, g.message
    runner.assert_no_leaks()


def test_a_job_that_takes_over_the_alarm_does_not_disarm_the_next_deadline(runner):
    """Test code may install its own SIGALRM handler (here: ignore it); the server sets
    its own again before every job, so a later hung job is still interrupted on its
    deadline (ERROR, first attempt), not left to the judge's outer timeout (which stops
    the server: an infrastructure failure, retried)."""
    grab = task("import signal; signal.signal(signal.SIGALRM, signal.SIG_IGN)",
                "assert candidate(1, 1) == 2")
    hung = task("while True: pass")
    g1, g2 = judge_in_turn(runner, SHORT, (grab, GOOD), (hung, GOOD))
    assert g1.outcome is Outcome.PASSED, g1.message
    assert g2.outcome is Outcome.ERROR and "deadline" in g2.message, (g2.outcome, g2.message)
    assert g2.attempts == 1, "the first server's alarm did not fire: the attempt was retried"
    runner.assert_no_leaks()


def test_answers_that_make_a_trusted_test_overrun_are_the_candidates_timeout(runner):
    """The test's own work on the candidate's answer is quadratic; an answer within the
    codec's limits (60,000 items) makes it overrun the job's deadline. The reference
    solution passes the same test in time, so this is the candidate's TIMEOUT (reward
    0), not a broken task (excluded): a policy must not escape its zero this way. The
    reference itself is graded normally, and a task whose reference also overruns
    stays a broken task (ERROR, excluded)."""
    quadratic = Task("t/uniq", TaskKind.FUNCTION, "def ids(n):\n", entry_point="ids",
                     canonical_solution="    return list(range(n))\n",
                     hidden_tests=(TestCase("test_0", "r = candidate(3)\nassert all(r.count(x)"
                                                      " == 1 for x in r)"),
                                   TestCase("test_1", "assert candidate(2) == [0, 1]")))
    flood = "    return list(range(60000))\n"
    broken = Task("t/slow", TaskKind.FUNCTION, "def ids(n):\n", entry_point="ids",
                  canonical_solution="    return list(range(n))\n",
                  hidden_tests=(TestCase("test_0", "r = candidate(3)\nwhile r: pass"),))
    g_flood, g_ref, g_broken = judge_in_turn(
        runner, SHORT, (quadratic, flood), (quadratic, quadratic.canonical_solution),
        (broken, "    return [1]\n"))
    assert g_flood.outcome is Outcome.TIMEOUT, (g_flood.outcome, g_flood.message)
    assert "deadline" in g_flood.message and "reference" in g_flood.message
    assert [t.passed for t in g_flood.tests] == [False, False]  # the rest is not run
    assert g_ref.outcome is Outcome.PASSED, g_ref.message
    assert g_broken.outcome is Outcome.ERROR and "deadline" in g_broken.message, \
        (g_broken.outcome, g_broken.message)
    runner.assert_no_leaks()



def test_with_no_reference_an_overrun_is_the_candidates_timeout_when_no_candidate_is_fast(
        runner):
    """A task with no reference solution: the same quadratic check overruns on the
    flood answer; the control, a trivial program whose every call answers None, gets
    a verdict in time, so the overrun is the candidate's TIMEOUT (reward 0), not an
    exclusion a failing policy could aim for. A test that is slow
    before any call overruns with no candidate too: a broken task, excluded (ERROR) —
    for every candidate alike (the tests above: a hung test stays ERROR)."""
    quadratic = Task("t/uniq-noref", TaskKind.FUNCTION, "def ids(n):\n", entry_point="ids",
                     hidden_tests=(TestCase("test_0", "r = candidate(3)\nassert all(r.count(x)"
                                                      " == 1 for x in r)"),
                                   TestCase("test_1", "assert candidate(2) == [0, 1]")))
    slow_first = Task("t/slow-first", TaskKind.FUNCTION, "def ids(n):\n", entry_point="ids",
                      hidden_tests=(TestCase("test_0", "assert candidate(1) == [0]"),
                                    TestCase("test_1", "while True: pass\ncandidate(3)")))
    g_flood, g_ok, g_slow = judge_in_turn(
        runner, SHORT, (quadratic, "    return list(range(60000))\n"),
        (quadratic, "    return list(range(n))\n"),
        (slow_first, "    return list(range(n))\n"))
    assert g_flood.outcome is Outcome.TIMEOUT, (g_flood.outcome, g_flood.message)
    assert "a trivial program" in g_flood.message and "self_inflicted_infra" in g_flood.flags
    assert [t.passed for t in g_flood.tests] == [False, False]
    assert g_ok.outcome is Outcome.PASSED, g_ok.message
    assert g_slow.outcome is Outcome.ERROR and "deadline" in g_slow.message, \
        (g_slow.outcome, g_slow.message)
    runner.assert_no_leaks()

def _harness_module():
    """harness_program as the sandbox loads it (it imports the codec as
    `_trialbox_codec`), here in the test's own interpreter."""
    import importlib
    import sys

    from trialbox.judge import codec
    sys.modules.setdefault("_trialbox_codec", codec)
    return importlib.import_module("trialbox.judge.harness_program")


def test_restore_puts_back_what_a_job_changed_with_and_without_version_tags(monkeypatch):
    """_Baseline.restore skips module dicts whose version tag has not moved; a rebind
    (same key, another object), an added and a deleted global, an imported module and a
    replaced sys.modules entry are all put back — and the same without version tags (the
    fallback that compares every module)."""
    import sys
    import types

    hp = _harness_module()
    for with_tags in (True, False):
        if not with_tags:
            monkeypatch.setattr(hp, "_dict_versions", lambda: None)
        mod = types.ModuleType("_tb_restore_probe")
        mod.x, mod.gone = 1, "here"
        monkeypatch.setitem(sys.modules, mod.__name__, mod)
        baseline = hp._Baseline()
        assert bool(baseline.views) is with_tags
        for _ in range(3):  # every job starts from the baseline, not from the last job
            mod.x = 2  # rebound: the key set is unchanged
            mod.added = True
            del mod.gone
            sys.modules["_tb_restore_new"] = types.ModuleType("_tb_restore_new")
            sys.modules[mod.__name__] = types.ModuleType("impostor")
            baseline.restore()
            assert sys.modules[mod.__name__] is mod
            assert "_tb_restore_new" not in sys.modules
            assert (mod.x, mod.gone, hasattr(mod, "added")) == (1, "here", False)
        baseline.restore()  # nothing changed: nothing to put back
        assert (mod.x, mod.gone) == (1, "here")


def test_dict_version_tags_are_read_where_the_sandbox_runtime_has_them():
    """The sandbox's interpreter (CPython 3.11 here) has PEP 509 version tags, so the
    server's restore takes the fast path; a tag moves on every change of its dict."""
    hp = _harness_module()
    reader = hp._dict_versions()
    assert reader is not None
    d = {"k": 1}
    view = reader(d)
    before = view.value
    d["k"] = 2
    assert view.value != before


def test_jobs_and_reports_on_both_sides_of_the_inline_limit(runner):
    """Requests and reports up to the inline limit (60,000) travel on the control
    socket, received whole (its receive size is 64 KiB); larger ones go through a
    workspace file. Just under and just over it, every grade is right."""
    from trialbox.judge.function import _INLINE_MAX

    def padded(size: int) -> Task:  # a job whose request is about `size` bytes
        return task("assert candidate(2, 3) == 5", setup="PAD = %r\n" % ("p" * size))

    def noisy(n: int) -> Task:  # n failing tests, each with a ~900-character message
        return task(*[f"assert candidate(1, 1) == 3, 'm' * 900 + '{i}'" for i in range(n)])

    grades = judge_in_turn(runner, FAST,
                           (padded(_INLINE_MAX - 1_500), GOOD), (padded(_INLINE_MAX + 5_000), GOOD),
                           (noisy(60), GOOD), (noisy(70), GOOD), (padded(10), GOOD))
    assert [g.outcome for g in grades] == [Outcome.PASSED, Outcome.PASSED, Outcome.FAILED,
                                           Outcome.FAILED, Outcome.PASSED], grades
    assert len(grades[2].tests) == 60 and len(grades[3].tests) == 70
    assert all(not t.passed and t.message.startswith("assertion failed: mmm")
               for g in grades[2:4] for t in g.tests)


def test_a_garbled_reply_is_infra_not_a_crash(runner):
    """The control socket carries the server's replies; a (broken) task whose test code
    writes its own bytes there garbles the reply. That is the machinery failing: the
    attempt is `infra` (retried, then excluded) with the cause named — the judge does
    not crash and the next judgement on the same harness session works."""
    garble = task("import os; os.write(3, b'{not json')", "assert candidate(1, 1) == 2")
    fine = task("assert candidate(2, 2) == 4")
    g_bad, g_good = judge_in_turn(runner, FAST, (garble, GOOD), (fine, GOOD))
    assert g_bad.outcome is Outcome.INFRA, (g_bad.outcome, g_bad.message)
    assert "unreadable" in g_bad.message and g_bad.attempts > 1, (g_bad.message,
                                                                   g_bad.attempts)
    assert g_good.outcome is Outcome.PASSED, g_good.message
    runner.assert_no_leaks()


def test_random_is_seeded_per_attempt_from_a_secret_and_recorded(runner):
    """Issue 14, B: the harness used to reseed `random` with 0 before every job, so a
    solution could replay the test's "random" inputs from random.Random(0) and ignore
    its argument. Now each attempt draws from a seed derived from the run's secret, the
    task and the code (judge/seeds.py: the same code draws alike, other code otherwise),
    recorded in the grade; re-grading with that seed reproduces the draws (and the
    verdict)."""
    rand = Task("t/double", TaskKind.FUNCTION, "def double(x):\n", entry_point="double",
                canonical_solution="    return 2 * x\n",
                hidden_tests=tuple(TestCase(f"test_{i}", "import random\n"
                                            "x = random.randint(0, 10**9)\n"
                                            "assert candidate(x) == 2 * x")
                                   for i in range(3)))
    replay = ("    import random\n    global r\n    if r is None:\n"
              "        r = random.Random(0)\n    return 2 * r.randint(0, 10**9)\n\n\nr = None\n")
    probe = ("    import random\n    global r\n    if r is None:\n"
             "        r = random.Random(SEED)\n    return 2 * r.randint(0, 10**9)\n\n\nr = None\n")
    g_replay, g_ref1, g_ref2 = judge_in_turn(runner, FAST, (rand, replay),
                                             (rand, rand.canonical_solution),
                                             (rand, rand.canonical_solution))
    assert g_replay.outcome is Outcome.FAILED, (g_replay.outcome, g_replay.message)
    assert g_ref1.passed and g_ref2.passed
    assert None not in (g_replay.seed, g_ref1.seed, g_ref2.seed)
    assert g_ref1.seed == g_ref2.seed != g_replay.seed  # the same code, the same draws
    # a re-grade with the recorded seed sees the same draws: the probe that knows the
    # seed passes exactly then (and the replaying solution fails again)
    knows = probe.replace("SEED", str(g_replay.seed))

    async def regrade():
        harness = await open_harness(runner.pool, FAST)
        try:
            return [await judge_function(rand, c, runner.pool, FAST, harness, seed=s)
                    for c, s in ((knows, g_replay.seed), (knows, None),
                                 (replay, g_replay.seed))]
        finally:
            await harness.close()
    same, other, again = runner.run(regrade())
    assert same.outcome is Outcome.PASSED and same.seed == g_replay.seed, same.message
    assert other.outcome is Outcome.FAILED and other.seed != g_replay.seed
    assert again.outcome is Outcome.FAILED and again.seed == g_replay.seed
