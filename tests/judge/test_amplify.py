"""Test amplification on a HumanEval subset, for real: generated in sandboxes from the
tests' own inputs and the reference, stored and checked, then graded by the trusted
harness — the canonical solutions still pass, solutions that only fit the original tests
(hard-coded to their inputs, off by one) pass the originals and fail the amplified."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from trialbox.errors import UsageError
from trialbox.judge import amplify
from trialbox.judge.function import judge_function
from trialbox.store.tasks import load_humaneval
from trialbox.types import Outcome

SUBSET = ("HumanEval/2", "HumanEval/12", "HumanEval/13", "HumanEval/23", "HumanEval/55")
CONFIG = amplify.AmplifyConfig(per_task=25)


@pytest.fixture(scope="module")
def subset():
    by_id = {t.task_id: t for t in load_humaneval()}
    return [by_id[k] for k in SUBSET]


@pytest.fixture(scope="module")
def amplified(runner, subset):
    return runner.run(amplify.generate(subset, runner.pool, "humaneval-subset", CONFIG),
                      timeout=300)


def test_each_task_gets_new_plain_tests_within_the_cap(amplified, subset):
    counts = amplified.counts()
    assert set(counts) == set(SUBSET) and amplified.errors == {}
    assert all(10 <= n <= CONFIG.per_task for n in counts.values()), counts
    for task in subset:
        pairs = amplified.tests[task.task_id]
        assert len({repr(a) for a, _ in pairs}) == len(pairs)  # deduplicated
        originals = " ".join(t.code for t in task.hidden_tests)
        assert any(repr(a[0]) not in originals for a, _ in pairs)  # new inputs
    # HumanEval/2 takes a float and answers one: the mutants keep the types
    assert all(type(a[0]) is float and type(w) is float
               for a, w in amplified.tests["HumanEval/2"])
    assert all(type(a[0]) is list and all(type(s) is str for s in a[0])
               for a, _ in amplified.tests["HumanEval/12"])


def test_the_file_is_versioned_and_its_hash_checked(amplified, tmp_path):
    path = tmp_path / "amp.json"
    digest = amplify.save(amplified, str(path))
    data = json.loads(path.read_text())
    assert data["version"] == amplify.VERSION and data["sha256"] == digest
    assert data["params"]["seed"] == CONFIG.seed and data["generator"]
    again = amplify.load(str(path))
    assert again.tests == amplified.tests and again.params == amplified.params
    data["tasks"]["HumanEval/13"][0] = data["tasks"]["HumanEval/13"][0].replace("[", "[ ", 1)
    path.write_text(json.dumps(data))
    with pytest.raises(UsageError, match="sha256 does not match"):
        amplify.load(str(path))
    path.write_text(json.dumps({**data, "version": 99}))
    with pytest.raises(UsageError, match="regenerate"):
        amplify.load(str(path))


def test_canonical_solutions_pass_the_amplified_tests(runner, amplified, subset):
    for task in amplify.apply(subset, amplified):
        assert len(task.hidden_tests) > len(subset[0].hidden_tests)
        g = runner.run(judge_function(task, task.canonical_solution, runner.pool))
        assert g.outcome is Outcome.PASSED, (task.task_id, g.message)


def hard_coded(task):
    """A completion that answers the original tests' inputs from a table (computed with
    the reference) and anything else wrongly: it passes the original tests."""
    ns: dict = {}
    exec(task.prompt + task.canonical_solution, ns)
    ref, table = ns[task.entry_point], {}

    def record(*args):
        table[repr(args)] = ref(*args)
        return table[repr(args)]
    env = {"candidate": record}
    for t in (*task.hidden_tests, *task.visible_tests):
        exec(t.code, env)
    return (f"    return _T.get(repr(_args_of(locals())))\n\n\n_T = {table!r}\n\n\n"
            "def _args_of(ls):\n    return tuple(ls.values())\n")


OFF_BY_ONE = {  # plausible slips the original tests do not catch
    "HumanEval/13": "    for d in range(min(a, b), 0, -1):\n"
                    "        if a % d == 0 and b % d == 0:\n            return d\n",
    "HumanEval/55": "    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n"
                    "    return a if n < 13 else a + 1\n",
}


def test_solutions_fitted_to_the_original_tests_fail_the_amplified_ones(
        runner, amplified, subset):
    by_id = {t.task_id: t for t in amplify.apply(subset, amplified)}
    wrong = [(t, hard_coded(t)) for t in subset]
    wrong += [(next(t for t in subset if t.task_id == k), src) for k, src in OFF_BY_ONE.items()]
    for task, completion in wrong:
        before = runner.run(judge_function(task, completion, runner.pool))
        assert before.outcome is Outcome.PASSED, (task.task_id, before.message)
        after = runner.run(judge_function(by_id[task.task_id], completion, runner.pool))
        assert after.outcome is Outcome.FAILED, (task.task_id, completion)
        assert any(not t.passed and t.name.startswith("amplified_") for t in after.tests)


def test_tasks_without_amplified_tests_are_unchanged(amplified, subset):
    other = replace(subset[0], task_id="elsewhere")
    assert amplify.apply([other], amplified) == [other]


def test_eval_opts_in_with_amplified(amplified, subset, tmp_path):
    """`trialbox eval --amplified FILE`: the same samples, graded with the stored set."""
    from trialbox.cli import main
    amplify.save(amplified, str(tmp_path / "amp.json"))
    gcd = next(t for t in subset if t.task_id == "HumanEval/13")
    rows = [{"task_id": gcd.task_id, "completion": gcd.canonical_solution},
            {"task_id": gcd.task_id, "completion": OFF_BY_ONE[gcd.task_id]}]
    (tmp_path / "s.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    outcomes = {}
    for extra in ([], ["--amplified", str(tmp_path / "amp.json")]):
        out = tmp_path / "o.jsonl"
        assert main(["eval", "--tasks", "humaneval", "--samples", str(tmp_path / "s.jsonl"),
                     "--out", str(out), "--workers", "1", *extra]) == 0
        outcomes[bool(extra)] = [json.loads(x)["outcome"] for x in out.read_text().split("\n")
                                 if x]
    assert outcomes == {False: ["passed", "passed"], True: ["passed", "failed"]}


def test_the_shipped_humaneval_set_loads_and_its_canonicals_pass(runner):
    """The stored set (generated once, hashed): every task has tests, and the canonical
    solutions of a spread of tasks pass them (all 164: docs/adversary.md's figures)."""
    shipped = amplify.load("humaneval")
    assert shipped.task_set == "humaneval" and shipped.errors == {}
    tasks = load_humaneval()
    assert set(shipped.tests) == {t.task_id for t in tasks}
    assert all(shipped.tests[t.task_id] for t in tasks)
    assert sum(shipped.counts().values()) > 5 * sum(len(t.hidden_tests) for t in tasks)
    for task in amplify.apply(tasks[::16], shipped):
        g = runner.run(judge_function(task, task.canonical_solution, runner.pool))
        assert g.outcome is Outcome.PASSED, (task.task_id, g.message)
