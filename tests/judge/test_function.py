"""Function-call judging from outside the candidate: correct solutions pass, wrong ones
and cheats fail, the sandbox breaking is never a wrong answer."""

from __future__ import annotations


import dataclasses

import pytest

from trialbox.judge.evaluate import evaluate, reward_of
from trialbox.judge.function import JudgeConfig, judge_function
from trialbox.store.tasks import load_humaneval
from trialbox.types import Limits, Outcome

TASKS = {t.task_id: t for t in load_humaneval()}
FAST = JudgeConfig(candidate_limits=Limits(wall_s=20, cpu_s=10, memory_mb=256, disk_mb=16),
                   harness_limits=Limits(wall_s=20, cpu_s=10, memory_mb=256, disk_mb=16),
                   call_timeout_s=2, load_timeout_s=3)


def judge(runner, task_id, completion, config=FAST):
    return runner.run(judge_function(TASKS[task_id], completion, runner.pool, config))


def test_all_164_canonical_solutions_pass_5_times_with_identical_rewards(runner):
    """The issue's bar: every canonical solution passes, 5 repeats, identical rewards
    (flake 0), with no cheat flag."""
    samples = [{"task_id": t.task_id, "completion": t.canonical_solution}
               for t in TASKS.values()]
    rows, summary = runner.run(evaluate(TASKS, samples, runner.pool, repeat=5, workers=4,
                                        config=FAST), timeout=900)
    rows = [r.to_dict() for r in rows]
    bad = [(r["task_id"], r["outcome"], r["message"]) for r in rows
           if r["outcome"] != "passed" or any(x["outcome"] != "passed" for x in r["repeats"])]
    assert not bad, bad
    assert summary["pass@1"] == 1.0 and summary["deterministic"] is True
    assert all(r["reward"] == 1.0 and [x["reward"] for x in r["repeats"]] == [1.0] * 4
               for r in rows)
    assert not any(r["flags"] for r in rows if r["task_id"] != "HumanEval/160"), \
        [r["flags"] for r in rows if r["flags"]]
    assert sum(len(r["tests"]) for r in rows) == sum(len(t.hidden_tests)
                                                     for t in TASKS.values())
    runner.assert_no_leaks()


WRONG = {
    "empty body": "    pass\n",
    "returns None": "    return None\n",
}


@pytest.mark.parametrize("task_id", ["HumanEval/0", "HumanEval/13", "HumanEval/38"])
@pytest.mark.parametrize("variant", sorted(WRONG))
def test_simple_wrong_variants_fail(runner, task_id, variant):
    g = judge(runner, task_id, WRONG[variant])
    assert g.outcome is Outcome.FAILED, (g.outcome, g.message)
    assert g.pass_rate is not None and g.pass_rate < 1


def test_off_by_one_fails(runner):
    task = TASKS["HumanEval/13"]  # greatest_common_divisor
    wrong = task.canonical_solution.replace("return a", "return a + 1")
    assert wrong != task.canonical_solution
    g = judge(runner, "HumanEval/13", wrong)
    assert g.outcome is Outcome.FAILED


CHEATS = {
    "always-equal object": (
        "    class Eq:\n        def __eq__(self, o): return True\n"
        "        def __ne__(self, o): return False\n    return Eq()\n"),
    "str subclass that equals anything": (
        "    class S(str):\n        def __eq__(self, o): return True\n    return S('x')\n"),
    "exit 0 before the tests": "    pass\nimport sys\nsys.exit(0)\n",
    "os._exit(0) in the call": "    import os\n    os._exit(0)\n",
    "SystemExit in the call": "    raise SystemExit(0)\n",
    "prints a fake success": (
        "    print('All tests passed'); print('{\"passed\": true}')\n    return None\n"),
    "patches builtins": (
        "    import builtins\n    builtins.AssertionError = type('A', (Exception,), {})\n"
        "    builtins.isinstance = lambda *a: True\n    return None\n"),
    "walks the stack": (
        "    import sys, gc\n    f = sys._getframe()\n    while f.f_back: f = f.f_back\n"
        "    for o in gc.get_objects():\n        pass\n    return None\n"),
    "reads the tests": (
        "    import os\n    found = os.listdir('/') + os.listdir('/tmp')\n"
        "    try:\n        found.append(open('job.json').read())\n"
        "    except OSError:\n        pass\n    return found\n"),
    "writes to the judge channel": (
        "    import os\n    os.write(3, b'\\x00\\x00\\x00\\x05junk!')\n    return None\n"),
}


DETECTOR = {
    "always-equal object": "always-equal",
    "str subclass that equals anything": "builtin-subclass-eq",
    "exit 0 before the tests": "exit-call",
    "os._exit(0) in the call": "exit-call",
    "SystemExit in the call": "exit-call",
    "prints a fake success": "test-runner-output",
    "patches builtins": "builtins-patch",
    "walks the stack": "frame-walk",
    "reads the tests": "fs-probe",
    "writes to the judge channel": "fd-tamper",
}


@pytest.mark.parametrize("cheat", sorted(CHEATS))
def test_cheats_do_not_pass(runner, cheat):
    """Every attack runs — no source is scored unrun — and fails by its own tests: they
    run in the harness's process and only plain data crosses back, so none of these
    reaches the evidence (an object returned is refused by the codec). Not passed,
    reward 0, never excluded; its detector recorded, notable for the audit."""
    g = judge(runner, "HumanEval/0", CHEATS[cheat])
    assert g.outcome not in (Outcome.PASSED, Outcome.INFRA, Outcome.ERROR), (cheat, g)
    assert reward_of(g) == 0.0 and g.seed is not None, g
    assert g.tests and not all(t.passed for t in g.tests), "the tests alone fail it"
    assert DETECTOR[cheat] in g.flags, (cheat, g.flags)
    # and the honest solution of the same task still passes
    ok = judge(runner, "HumanEval/0", TASKS["HumanEval/0"].canonical_solution)
    assert ok.passed, ok


def test_hang_is_a_timeout_and_memory_bomb_is_memory(runner):
    g = judge(runner, "HumanEval/0", "    while True:\n        pass\n")
    assert g.outcome is Outcome.TIMEOUT, (g.outcome, g.message)
    g = judge(runner, "HumanEval/0",
              "    b = []\n    while True:\n        b.append(b'x' * 10**7)\n")
    assert g.outcome in (Outcome.MEMORY, Outcome.FAILED), (g.outcome, g.message)
    runner.assert_no_leaks()


def test_same_code_same_grade_every_time(runner):
    task = TASKS["HumanEval/38"]  # random inputs inside its tests
    outcomes = {judge(runner, task.task_id, task.canonical_solution).outcome
                for _ in range(3)}
    assert outcomes == {Outcome.PASSED}


def test_bad_input_is_named_not_crashed(runner):
    """A check that crashes in its own setup is the task's fault (ERROR, excluded); a
    huge completion is the candidate's (FAILED, with the cause); neither raises."""
    import dataclasses

    from trialbox.judge.evaluate import reward_of
    task = TASKS["HumanEval/0"]
    broken = dataclasses.replace(task, task_id="broken/0",
                                 test_setup="raise RuntimeError('dataset bug')")
    g = runner.run(judge_function(broken, task.canonical_solution, runner.pool, FAST))
    assert g.outcome is Outcome.ERROR and "dataset bug" in g.message, g
    assert reward_of(g) is None
    huge = "    return True\n" + "#" * (40 << 20) + "\n"
    g = judge(runner, "HumanEval/0", huge)
    assert g.outcome is Outcome.FAILED and "workspace" in g.message, (g.outcome, g.message)
    assert reward_of(g) == 0.0


def test_time_limits_scale_with_the_reference(runner):
    """With time_scale, a test's per-call limit is a multiple of the reference solution's
    time on it (floored): a correct but far slower solution times out, and passes under
    the flat default limit."""
    from trialbox.judge.function import reference_times
    task = TASKS["HumanEval/13"]  # greatest_common_divisor: the reference is instant
    slow = "    import time\n    time.sleep(0.4)\n" + task.canonical_solution
    scaled = dataclasses.replace(FAST, time_scale=5.0, min_call_timeout_s=0.1)
    ref = runner.run(reference_times(task, runner.pool, scaled))
    assert set(ref) == {t.name for t in task.hidden_tests} and all(ms < 100 for ms in ref.values())
    assert scaled.limit_for(ref["test_0"]) == max(0.1, 5.0 * ref["test_0"] / 1000)
    g = runner.run(judge_function(task, slow, runner.pool, scaled, reference=ref))
    assert g.outcome is Outcome.TIMEOUT, (g.outcome, g.message)
    g = judge(runner, "HumanEval/13", slow)
    assert g.outcome is Outcome.PASSED, (g.outcome, g.message)


def test_a_pool_without_the_judges_modules_preloaded_still_judges(runner):
    """The suites run on a judge pool (tests/judge/conftest.py); on a plain pool the
    codec and stub are copied into the candidate's workspace instead, and a right
    solution passes and a wrong one fails there too."""
    from trialbox.judge.function import _preloaded
    from trialbox.sandbox import CellPool, PoolConfig

    async def body():
        pool = await CellPool(PoolConfig(warm=1)).start()
        try:
            assert not _preloaded(pool)
            task = TASKS["HumanEval/0"]
            return (await judge_function(task, task.canonical_solution, pool, FAST),
                    await judge_function(task, WRONG["returns None"], pool, FAST))
        finally:
            await pool.close()
    good, bad = runner.run(body())
    assert good.outcome is Outcome.PASSED, good.message
    assert bad.outcome is Outcome.FAILED, bad.message


def test_a_solution_with_crlf_or_cr_newlines_loads_as_python_would_read_it(runner):
    """The stub reads solution.py with plain syscalls and decodes it as UTF-8; newlines
    are translated as a text-mode read (and `python3 solution.py`) would."""
    task = TASKS["HumanEval/0"]
    crlf = judge(runner, task.task_id, task.canonical_solution.replace("\n", "\r\n"))
    assert crlf.outcome is Outcome.PASSED, crlf.message
    bad = judge(runner, task.task_id, "    return '\udcff'\n")  # not UTF-8 once written
    assert bad.outcome is Outcome.FAILED and "UnicodeDecodeError" in bad.message, bad.message
