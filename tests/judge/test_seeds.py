"""Seeds derived from the run's secret, the task and the code (judge/seeds.py): the same
code gets the same verdict on a randomised task, on the real namespace tier."""

from __future__ import annotations

import pytest

from trialbox.errors import UsageError
from trialbox.judge import seeds
from trialbox.judge.grade import grade
from trialbox.types import Task, TaskKind, TestCase

# 40 random draws in [0, 19]: an answer wrong on 7 alone fails ~87% of gradings and
# passes ~13%: a policy re-grading it with fresh seeds passes sooner or later.
RANDOMISED = Task(
    "R/rand", TaskKind.FUNCTION, "def ident(x):\n", entry_point="ident",
    hidden_tests=(TestCase("h0", "import random\nfor _ in range(40):\n"
                                 "    x = random.randint(0, 19)\n"
                                 "    assert candidate(x) == x, x"),))
RARE_WRONG = "    return -1 if x == 7 else x\n"


def test_the_same_code_gets_the_same_seed_and_verdict(runner):
    grades = [runner.run(grade(RANDOMISED, RARE_WRONG, runner.pool)) for _ in range(4)]
    assert len({g.seed for g in grades}) == 1 and grades[0].seed is not None
    assert len({g.outcome for g in grades}) == 1, [g.outcome for g in grades]
    assert grades[0].seed == seeds.derive_seed(RANDOMISED.task_id, RARE_WRONG)
    # recorded: re-grading with the grade's seed reproduces it
    again = runner.run(grade(RANDOMISED, RARE_WRONG, runner.pool, seed=grades[0].seed))
    assert again.outcome is grades[0].outcome


def test_other_code_other_draws_and_the_secret_decides():
    a = seeds.derive_seed("T", "x")
    assert a != seeds.derive_seed("T", "x ") and a != seeds.derive_seed("U", "x")
    assert a != seeds.derive_seed("T", "x", seeds.TURN)
    assert seeds.derive_seed("T", "x", key=b"a" * 16) != seeds.derive_seed(
        "T", "x", key=b"b" * 16)
    assert 0 <= a < 2**63


def test_a_shared_secret_from_the_environment(monkeypatch):
    monkeypatch.setattr(seeds, "_SECRET", None)
    monkeypatch.setenv("TRIALBOX_SEED_SECRET", "ab" * 16)
    assert seeds.secret() == bytes.fromhex("ab" * 16)
    monkeypatch.setattr(seeds, "_SECRET", None)
    monkeypatch.setenv("TRIALBOX_SEED_SECRET", "not hex")
    with pytest.raises(UsageError, match="TRIALBOX_SEED_SECRET must be hex"):
        seeds.secret()
    monkeypatch.setattr(seeds, "_SECRET", None)  # the next caller draws its own



def test_eval_repeats_draw_apart_so_a_randomised_task_shows_its_disagreement(runner):
    """`eval --repeat`: the first repeat in the final domain, repeat r in `repeat:r` —
    the determinism report measures how often a randomised task disagrees across
    seeds (an answer wrong on half the draws: 12 repeats all agree with p ~ 1/2000)."""
    from trialbox.judge.evaluate import evaluate

    coin = Task("R/coin", TaskKind.FUNCTION, "def ident(x):\n", entry_point="ident",
                hidden_tests=(TestCase("h0", "import random\nx = random.randint(0, 19)\n"
                                             "assert candidate(x) == x, x"),))
    half_wrong = "    return x if x >= 10 else -1\n"
    rows, summary = runner.run(evaluate({coin.task_id: coin},
                                        [{"task_id": coin.task_id, "completion": half_wrong}],
                                        runner.pool, workers=2, repeat=12))
    assert summary["deterministic"] is False and summary["nondeterministic_task_ids"] == [
        coin.task_id]
    first = runner.run(grade(coin, half_wrong, runner.pool))  # the reward's own draws
    assert first.seed == seeds.derive_seed(coin.task_id, half_wrong)
    assert rows[0].outcome is first.outcome
