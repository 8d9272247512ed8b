"""The environment class for TRL's `environment_factory`, driven as GRPOTrainer drives
it (trl 1.16: instances built once by the factory, `reset(**row)` per rollout, public
methods as tools whose schema transformers reads from their docstrings, `get_reward()`
at the end), on real sandboxes and the real judge."""

from __future__ import annotations

import gc
import inspect
from functools import partial

import pytest
from transformers.utils import get_json_schema

from trialbox.errors import UsageError
from trialbox.integrations.grader import ThreadedGrader
from trialbox.integrations.trl_env import TrialboxToolEnv

ROW = {"task_id": "inline/inc", "prompt": 'def inc(x):\n    """x plus one."""\n',
       "entry_point": "inc",
       "test": "def check(candidate):\n    assert candidate(1) == 2\n"}


def _tools(env: TrialboxToolEnv) -> dict[str, object]:
    """What TRL exposes as tools: the public functions of the class, but reset and
    get_reward (grpo_trainer.py, environment probing)."""
    return {n: getattr(env, n) for n, _ in inspect.getmembers(type(env), inspect.isfunction)
            if n not in ("reset", "get_reward") and not n.startswith("_")}


def test_a_multi_turn_rollout_then_the_next_on_the_same_instance() -> None:
    with ThreadedGrader() as grader:
        env = partial(TrialboxToolEnv, "humaneval", grader=grader)()
        tools = _tools(env)
        assert sorted(tools) == ["run_code", "run_tests"]
        schemas = {n: get_json_schema(t) for n, t in tools.items()}  # type: ignore[arg-type]
        assert schemas["run_code"]["function"]["parameters"]["required"] == ["code"]
        assert schemas["run_tests"]["function"]["parameters"]["required"] == ["solution"]

        assert env.reset(prompt=[{"role": "user", "content": "…"}], task_id="HumanEval/2") \
            is None
        out = env.run_code("print(3.5 % 1.0)\nimport sys; print('oops', file=sys.stderr)")
        assert out.startswith("ok\n0.5") and "oops" not in out
        out = env.run_code("raise SystemExit(3)")
        assert out.startswith("exit") and "exit 3" in out
        session = env._session[0]
        assert "fails tests you cannot see" in env.run_tests(
            "def truncate_number(number: float) -> float:\n    return number\n")
        assert env.run_tests("def truncate_number(number: float) -> float:\n"
                             "    return number % 1.0\n") == "The solution is accepted."
        assert env.get_reward() == 1.0
        assert session.closed and env._session == []

        # the same instance, reused for the next rollout (as TRL does): a task row
        env.reset(prompt="…", task=ROW)
        env.run_code("print(1)")
        session = env._session[0]
        env.run_tests("def inc(x):\n    return x\n")
        env.reset(prompt="…", task=ROW)  # a reset mid-rollout releases its session
        assert session.closed
        assert env.get_reward() == 0.0  # nothing checked in this rollout: the empty answer

        env.reset(task_id="HumanEval/2")
        env.run_code("print(1)")
        session = env._session[0]
        del env, tools  # the tools are bound methods: they hold the env too
        gc.collect()
        assert session.closed


def test_rows_without_a_task_say_what_is_missing() -> None:
    with ThreadedGrader() as grader:
        env = TrialboxToolEnv("humaneval", grader=grader)
        with pytest.raises(UsageError, match="needs a 'task_id'"):
            env.reset(prompt="…")
        with pytest.raises(UsageError, match="reset\\(\\*\\*row\\) first"):
            env.run_tests("x")


def test_checking_until_accepted_is_no_oracle_the_reward_is_one_final_grading() -> None:
    """`run_tests` grades with the turn-domain seed of the code; `get_reward` grades the
    last checked answer once more with the final-domain seed no check saw
    (judge/seeds.py): a judge lucky on the checks' draws only gives reward 0."""
    from trialbox.judge.seeds import FINAL, TURN, derive_seed
    from trialbox.types import Grade, Outcome

    seen: list[int | None] = []

    class LuckyOnChecks:
        async def grade(self, task, completion, seed=None):  # type: ignore[no-untyped-def]
            seen.append(seed)
            ok = seed == derive_seed(task.task_id, completion, TURN)
            return Grade(task.task_id, Outcome.PASSED if ok else Outcome.FAILED)

    with ThreadedGrader(grader=LuckyOnChecks()) as grader:  # type: ignore[arg-type]
        env = TrialboxToolEnv("humaneval", grader=grader)
        env.reset(task=ROW)
        code = "def inc(x):\n    return x + 1\n"
        assert env.run_tests(code) == "The solution is accepted."
        assert env.get_reward() == 0.0
        answer = env._answer
        assert answer is not None and answer.startswith("\n" + code)
        assert seen == [derive_seed("inline/inc", answer, TURN),
                        derive_seed("inline/inc", answer, FINAL)]
