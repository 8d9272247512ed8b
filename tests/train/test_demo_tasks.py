"""The demo task family: deterministic, a real held-out split, tasks the real judge
grades as intended (reference passes, a near miss fails, the teacher's bugs fail), no
hidden test in a prompt."""

import random
import re

import subprocess
import sys

from trialbox.judge.function import judge_function
from trialbox.rollout.agent import feedback_report
from trialbox.train.demo_tasks import (
    FEEDBACK,
    TEACHER_BUGS,
    Split,
    all_programs,
    make_tasks,
    render_feedback,
    render_prompt,
    sft_pairs,
    split_of,
    teacher_answer,
)
from trialbox.types import Outcome

DIGEST = ("import hashlib; from trialbox.train.demo_tasks import *; print(hashlib.sha256("
          "repr(make_tasks(Split.HELDOUT, 50, 7) + make_tasks(Split.TRAIN, 50, 7))"
          ".encode()).hexdigest())")


def test_same_seed_same_tasks_in_every_process():
    # string inputs once came out of a set, whose order follows the process's hash seed
    digests = {subprocess.run([sys.executable, "-c", DIGEST], capture_output=True,
                              text=True, env={"PYTHONHASHSEED": str(h)}, check=True).stdout
               for h in (1, 2, 3)}
    assert len(digests) == 1
    assert make_tasks(Split.TRAIN, 5, 1) != make_tasks(Split.TRAIN, 5, 2)


def test_heldout_prompts_are_never_trained_on():
    train = make_tasks(Split.TRAIN, 3000, 0)
    held = make_tasks(Split.HELDOUT, 200, 12345)
    assert all(split_of(t.prompt) is Split.TRAIN for t in train)
    assert all(split_of(t.prompt) is Split.HELDOUT for t in held)
    assert not {t.prompt for t in train} & {t.prompt for t in held}
    # every template is in both splits (a split by program taught a spurious rule)
    def templates(exprs):
        return {re.sub(r"\d+|'[a-z]'", "#", e.strip()) for e in exprs}
    held_templates = templates(t.canonical_solution for t in held)
    assert held_templates == templates(t.canonical_solution for t in train)
    assert held_templates == templates(p.expr for p in all_programs())
    # ~1/4 of the prompts are held out
    shares = [split_of(f"def f(x):\n    # f({i}) == {i}\n    return ") is Split.HELDOUT
              for i in range(4000)]
    assert 0.2 < sum(shares) / len(shares) < 0.3


def test_prompts_show_only_the_visible_examples():
    for t in make_tasks(Split.HELDOUT, 100, 3):
        prompt = render_prompt(t)
        assert prompt.endswith("    return ") and prompt.startswith("def f(x):\n")
        for test in t.hidden_tests:
            call = test.code.removeprefix("assert candidate")
            assert f"f{call}" not in prompt
        for test in t.visible_tests:
            assert f"f{test.code.removeprefix('assert candidate')}" in prompt
        assert len(t.hidden_tests) == 6 and len(t.visible_tests) == 3


def test_the_judge_passes_the_reference_and_fails_a_near_miss(runner):
    tasks = make_tasks(Split.HELDOUT, 6, 5)

    async def grade_all():
        out = []
        for t in tasks:
            right = await judge_function(t, t.canonical_solution, runner.pool)
            wrong = await judge_function(t, t.canonical_solution.strip() + " * 2 + 1\n"
                                         if "'" not in t.canonical_solution and
                                         "len" not in t.canonical_solution else "x[1:2]\n",
                                         runner.pool)
            out.append((right, wrong))
        return out

    for t, (right, wrong) in zip(tasks, runner.run(grade_all(), timeout=300), strict=True):
        assert right.outcome is Outcome.PASSED, (t.task_id, right.message)
        assert wrong.outcome is Outcome.FAILED, (t.task_id, t.canonical_solution)


def test_feedback_is_a_fixed_marker_and_reveals_nothing_hidden():
    t = make_tasks(Split.TRAIN, 1, 0)[0]
    report = feedback_report(t, "x\n", None, None, 500)
    assert render_feedback(report) == FEEDBACK


def test_sft_pairs_include_second_turns_whose_first_answer_is_wrong():
    tasks = make_tasks(Split.TRAIN, 400, 0)
    pairs = sft_pairs(tasks, seed=0, retry_share=0.5)
    second = [(c, a) for c, a in pairs if FEEDBACK in c]
    assert 120 < len(second) < 280
    by_prompt = {t.prompt: t for t in tasks}
    for context, answer in second:
        prompt, rest = context.split("    return ", 1)[0] + "    return ", \
            context.split("    return ", 1)[1]
        task = by_prompt[prompt]
        wrong = rest.split("\n", 1)[0]
        assert answer == task.canonical_solution and wrong + "\n" != answer


def test_the_teacher_writes_its_bugs_at_its_rate_and_they_fail_the_judge(runner):
    buggy = {re.sub(r"\d+|'[a-z]'", "#", t.format(0)) for t in TEACHER_BUGS}
    tasks = [t for t in make_tasks(Split.TRAIN, 600, 4)
             if re.sub(r"\d+|'[a-z]'", "#", t.canonical_solution.strip()) in buggy]
    assert len(tasks) > 150
    rng = random.Random(0)
    answers = [teacher_answer(t, rng, 0.7) for t in tasks]
    bugged = [(t, a) for t, a in zip(tasks, answers, strict=True) if a != t.canonical_solution]
    assert 0.6 < len(bugged) / len(tasks) < 0.8
    assert all(teacher_answer(t, rng, 0.0) == t.canonical_solution for t in tasks)
    pairs = sft_pairs(tasks, seed=0, retry_share=0.0, teacher_error=1.0)
    assert all(a != t.canonical_solution for (_, a), t in zip(pairs, tasks, strict=True))
    # one bug of each kind, judged for real: it fails the hidden tests
    seen: dict[str, tuple] = {}
    for t, a in bugged:
        seen.setdefault(re.sub(r"\d+", "#", a), (t, a))
    assert len(seen) == len(TEACHER_BUGS)
    # no bug is another task's right answer (unlearning it would unlearn that too)
    assert not {a.strip() for _, a in bugged} & {p.expr for p in all_programs()}

    async def grade_all():
        return [await judge_function(t, a, runner.pool) for t, a in seen.values()]

    for (t, a), grade in zip(seen.values(), runner.run(grade_all(), timeout=300), strict=True):
        assert grade.outcome is Outcome.FAILED, (t.canonical_solution, a, grade.outcome)
