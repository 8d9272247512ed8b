"""The gym-style environment's contract, on real sandboxes and the real judge: reset and
step return what the interface says, an episode terminates on a pass and is truncated at
`max_turns`, the feedback is the agent loop's, and the episode's session is released on
termination, on reset, on close and on garbage collection."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import pytest

from trialbox.errors import UsageError
from trialbox.integrations.grader import Grader
from trialbox.integrations.gym import AsyncCodeEnv, CodeEnv, EnvConfig
from trialbox.store.tasks import parse_task
from trialbox.types import Grade, Outcome, Task

INC = {"task_id": "inline/inc", "prompt": 'def inc(x):\n    """x plus one."""\n',
       "entry_point": "inc",
       "test": "def check(candidate):\n    assert candidate(1) == 2\n"
               "    assert candidate(41) == 42\n"}
ECHO = {"task_id": "inline/echo", "kind": "stdio", "prompt": "Print the input doubled.",
        "tests": [{"stdin": "3\n", "expected": "6\n", "hidden": False},
                  {"stdin": "5\n", "expected": "10\n"}]}
TASKS = [parse_task(INC), parse_task(ECHO)]
RIGHT = "Here:\n```python\ndef inc(x):\n    return x + 1\n```"
WRONG = "```python\ndef inc(x):\n    return x\n```"
CRASH = "```python\nraise ValueError('boom at import')\n```"


def test_a_sync_episode_feedback_then_pass_then_released() -> None:
    with CodeEnv(TASKS, EnvConfig(max_turns=3)) as env:
        obs, info = env.reset(options={"task_id": "inline/inc"})
        assert "def inc(x):" in obs and info == {"task_id": "inline/inc", "max_turns": 3}
        sb = env.env.session
        assert sb is not None and not sb.closed

        obs, reward, terminated, truncated, info = env.step("  \n")  # no code
        assert obs == "No code found. Write the solution in one ```python block."
        assert (reward, terminated, truncated, info["grade"]) == (0.0, False, False, None)

        obs, reward, terminated, truncated, info = env.step(CRASH)
        assert obs.startswith("Running your code: exit (exit 1)") and "boom at import" in obs
        assert (reward, terminated, truncated, info["outcome"]) == (0.0, False, False, "failed")

        obs, reward, terminated, truncated, info = env.step(RIGHT)
        assert (reward, terminated, truncated, info["passed"]) == (1.0, True, False, True)
        assert obs == "The solution is accepted."
        assert info["turn"] == 3 and env.env.session is None and sb.closed
        with pytest.raises(UsageError, match="call reset\\(\\) first"):
            env.step(RIGHT)


def test_truncated_at_max_turns_and_step_rewards() -> None:
    async def go() -> None:
        async with Grader() as grader:
            env = AsyncCodeEnv(TASKS, EnvConfig(max_turns=2), grader=grader)
            await env.reset(options={"task_id": "inline/inc"})
            first = await env.step(WRONG)
            assert first[1:4] == (0.0, False, False)
            assert "fails tests you cannot see" in first[0]
            last = await env.step(WRONG)
            assert last[1:4] == (0.0, False, True)  # truncated, not terminated
            assert env.session is None

            env = AsyncCodeEnv(TASKS, EnvConfig(max_turns=2, reward="step"), grader=grader)
            await env.reset(options={"task": ECHO})  # a whole task row
            obs, reward, terminated, truncated, info = \
                await env.step("```python\nprint(int(input()) * 3)\n```")
            assert (reward, terminated, truncated) == (0.0, False, False)
            assert "Visible tests failed" in obs
            obs, reward, terminated, truncated, info = \
                await env.step("```python\nprint(int(input()) * 2)\n```")
            assert (reward, terminated, truncated) == (1.0, True, False)
            await env.close()
            assert grader._pool is not None  # a shared grader is the caller's to close
    asyncio.run(go())


def test_reset_draws_by_seed_and_releases_the_last_session() -> None:
    async def go() -> None:
        async with AsyncCodeEnv(TASKS) as env:
            _, a = await env.reset(seed=7)
            drawn = [(await env.reset(seed=7))[1]["task_id"] for _ in range(3)]
            assert drawn == [a["task_id"]] * 3
            assert {(await env.reset())[1]["task_id"] for _ in range(12)} == \
                {"inline/inc", "inline/echo"}
            old = env.session
            await env.reset(options={"task_id": "inline/inc"})
            assert old is not None and old.closed and env.session is not old
            with pytest.raises(UsageError, match="unknown task id 'nope'"):
                await env.reset(options={"task_id": "nope"})
        assert env.session is None
    asyncio.run(go())


def test_garbage_collection_releases_the_session() -> None:
    env = CodeEnv(TASKS)
    env.reset(options={"task_id": "inline/inc"})
    sb, thread = env.env.session, env._thread
    assert sb is not None and not sb.closed
    del env
    gc.collect()
    assert sb.closed and thread.closed


class _Broken(Grader):
    """The real pool, but every grading is an infrastructure failure."""

    async def grade(self, task: Task, completion: str, seed: int | None = None) -> Grade:
        return Grade(task.task_id, Outcome.INFRA, message="forced by the test")


def test_an_infrastructure_failure_is_flagged_excluded() -> None:
    async def go() -> dict[str, Any]:
        async with _Broken() as grader:
            env = AsyncCodeEnv(TASKS, EnvConfig(max_turns=1), grader=grader)
            await env.reset(options={"task_id": "inline/inc"})
            _, reward, terminated, truncated, info = await env.step(RIGHT)
            assert (reward, terminated, truncated) == (0.0, False, True)
            await env.close()
            return info
    info = asyncio.run(go())
    assert info["excluded"] is True and info["outcome"] == "infra"


def test_bad_config_says_what_to_change() -> None:
    with pytest.raises(UsageError, match="max_turns must be an int >= 1"):
        EnvConfig(max_turns=0)
    with pytest.raises(UsageError, match="'final' or 'step'"):
        EnvConfig(reward="sparse")
