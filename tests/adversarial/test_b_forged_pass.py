"""Class B of issue 14: wrong code is never graded passed (docs/adversary.md, section B).

Each program here is wrong and tries to be graded passed anyway, the way a reward-hacking
policy would; each is judged for real on the namespace tier and must not pass."""

from __future__ import annotations

from trialbox.judge.evaluate import reward_of
from trialbox.judge.stdio import StdioJudgeConfig, judge_stdio
from trialbox.types import Compare, Limits, Outcome, Task, TaskKind, TestCase

STDIO = StdioJudgeConfig(limits=Limits(wall_s=5, cpu_s=2, memory_mb=128, disk_mb=16))


# --------------------------------------------------------------------------- stdio

BIG = Task("big-product", TaskKind.STDIO, "Print a*b.", compare=Compare.FLOAT,
           float_tol=1e-6,
           visible_tests=(TestCase("v", stdin=b"1000000 1000000\n",
                                   expected=b"1000000000000\n"),),
           hidden_tests=(TestCase("h", stdin=b"1000003 999999\n",
                                  expected=b"1000001999997\n"),))


def test_stdio_float_mode_does_not_round_integers(runner):
    """A program off by a few units on a 13-digit integer answer was inside the float
    mode's relative tolerance (1e-6 of 10**12 is 10**6) and passed."""
    near = "a, b = map(int, input().split())\nprint(a * b + 7)\n"
    g = runner.run(judge_stdio(BIG, near, runner.pool, STDIO))
    assert g.outcome is Outcome.FAILED and reward_of(g) == 0.0, g
    float_spelt = "a, b = map(int, input().split())\nprint(float(a * b))\n"
    g = runner.run(judge_stdio(BIG, float_spelt, runner.pool, STDIO))
    assert g.outcome is Outcome.PASSED, g  # the same number, spelt as a float: right
