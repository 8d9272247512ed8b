"""The demo task family: deterministic, a real held-out split, tasks the real judge
grades as intended (reference passes, a near miss fails), no hidden test in a prompt."""

import subprocess
import sys

from trialbox.judge.function import judge_function
from trialbox.rollout.agent import feedback_report
from trialbox.train.demo_tasks import (
    _INT_TEMPLATES,
    _STR_TEMPLATES,
    FEEDBACK,
    Split,
    all_programs,
    make_tasks,
    programs,
    render_feedback,
    render_prompt,
    sft_pairs,
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


def test_heldout_programs_with_constants_are_never_trained_on():
    train = {(p.expr, p.arg) for p in programs(Split.TRAIN)}
    held = {(p.expr, p.arg) for p in programs(Split.HELDOUT)}
    both = train & held
    assert len(held - both) >= 20          # unseen programs exist
    # what both splits share is exactly the templates without a constant
    constant_free = {(t, "int") for t, r in _INT_TEMPLATES if not r} | \
        {(t, "str") for t, r in _STR_TEMPLATES if not r}
    assert both == constant_free
    assert len(all_programs()) == len(train | held)
    seen = {t.canonical_solution.strip() for t in make_tasks(Split.TRAIN, 3000, 0)}
    fresh = [t for t in make_tasks(Split.HELDOUT, 200, 12345)
             if (t.canonical_solution.strip(), "int") not in constant_free
             and (t.canonical_solution.strip(), "str") not in constant_free]
    assert len(fresh) > 50
    for t in fresh:
        assert t.canonical_solution.strip() not in seen


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
