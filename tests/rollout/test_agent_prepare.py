"""A GRPO group from one prepared state (`AgentConfig.prepare`, rollout/prepare.py): the
set-up runs once per task, and each episode of the task's group starts from a fork of
its snapshot — on the real namespace tier: every episode sees its own task's prepared
state and none sees another episode's writes (each episode changes the state, and an
episode that saw a change fails its run). On a tier without snapshots (FakeProvider)
each episode's session runs the set-up itself."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import replace

import pytest

from tests.conftest import Runner
from trialbox.errors import UsageError
from trialbox.rollout.agent import AgentConfig, rollout
from trialbox.rollout.policy import ScriptedPolicy
from trialbox.rollout.prepare import Prepare
from trialbox.sandbox import PoolConfig
from trialbox.sandbox.base import Sandbox
from trialbox.sandbox.fake import FakeProvider
from trialbox.schedule.lease import DirectLeaser
from trialbox.types import ExecStatus, Grade, Limits, Outcome, Task, TaskKind, TestCase

LIM = Limits(wall_s=30, cpu_s=30, memory_mb=256, disk_mb=32, output_bytes=1 << 16)


def _task(name: str, power: int) -> Task:
    return Task(task_id=name, kind=TaskKind.FUNCTION, entry_point=name,
                prompt=f'def {name}(x):\n    """Return x to the power {power}."""\n',
                visible_tests=(TestCase("v1", code=f"assert candidate(3) == {3 ** power}"),),
                hidden_tests=(TestCase("h1", code=f"assert candidate(5) == {5 ** power}"),))


SQUARE, CUBE = _task("square", 2), _task("cube", 3)


def answer(prompt: str, turn: int) -> str:
    """The right function; run as the episode's program it checks the prepared state is
    its own task's, untouched, and then changes it."""
    name, power = ("square", 2) if "def square" in prompt else ("cube", 3)
    return f"""```python
def {name}(x):
    return x ** {power}

if __name__ == '__main__':  # run in the episode's session (the judge imports it)
    state = open('/workspace/prepared/state.txt').read()
    assert state == 'ready for {name}', state
    open('/workspace/prepared/state.txt', 'a').write(' and used')
    open('/workspace/prepared/by-{name}', 'w').write('x')
```"""


class Prepared:
    """The set-up: a real run in the session writes the task's state."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def __call__(self, task: Task, sb: Sandbox) -> None:
        self.calls.append(task.task_id)
        r = await sb.exec(["python3", "-c", "import os; os.mkdir('prepared'); open("
                           f"'prepared/state.txt', 'w').write('ready for {task.task_id}')"],
                          limits=LIM)
        if r.status is not ExecStatus.OK:
            raise UsageError(f"set-up failed: {r.status.value} {r.message} {r.stderr[-300:]!r}")


@pytest.fixture(scope="module")
def prep_runner() -> Iterator[Runner]:
    r = Runner(PoolConfig(warm=4))
    yield r
    r.close()


def config(prepare: Prepare | None) -> AgentConfig:
    return AgentConfig(max_concurrent_env=4, max_new_tokens=500, exec_limits=LIM,
                       prepare=prepare)


def test_each_group_starts_from_its_tasks_prepared_state(prep_runner):
    prepare = Prepared()
    batch = prep_runner.run(rollout(ScriptedPolicy(answer), [SQUARE, CUBE], group_size=4,
                                    max_turns=1, config=config(prepare),
                                    pool=prep_runner.pool))
    assert sorted(prepare.calls) == ["cube", "square"]  # once per task, not per episode
    assert len(batch.trajectories) == 8
    for tr in batch.trajectories:
        [turn] = tr.turns
        assert turn.exec_status is ExecStatus.OK, (tr.task_id, turn.exec_summary)
        assert tr.passed, tr.task_id


def test_without_the_prepared_state_the_same_runs_fail(prep_runner):
    """The control: the check above is real (a plain session has no prepared state; a
    session prepared for the other task has the wrong one)."""
    batch = prep_runner.run(rollout(ScriptedPolicy(answer), [SQUARE], group_size=2,
                                    max_turns=1, config=config(None),
                                    pool=prep_runner.pool))
    assert all(tr.turns[0].exec_status is ExecStatus.EXIT for tr in batch.trajectories)

    async def wrong(task: Task, sb: Sandbox) -> None:
        await Prepared()(CUBE, sb)
    batch = prep_runner.run(rollout(ScriptedPolicy(answer), [SQUARE], group_size=2,
                                    max_turns=1, config=config(wrong),
                                    pool=prep_runner.pool))
    assert all(tr.turns[0].exec_status is ExecStatus.EXIT for tr in batch.trajectories)


async def no_judge(task: Task, completion: str, seed: int | None = None) -> Grade:
    return Grade(task.task_id, Outcome.FAILED)


def test_a_tier_without_snapshots_prepares_every_episode():
    async def body() -> tuple[list[str], int]:
        seen: list[str] = []

        async def prepare(task: Task, sb: Sandbox) -> None:
            seen.append(task.task_id)
            await sb.write_file("prepared/state.txt", f"ready for {task.task_id}".encode())
        cfg = replace(config(None), prepare=prepare)
        batch = await rollout(ScriptedPolicy(answer), [SQUARE], group_size=3, max_turns=1,
                              config=cfg, pool=FakeProvider(), grader=no_judge)
        return seen, len(batch.trajectories)
    seen, n = asyncio.run(body())
    assert n == 3 and seen == ["square"] * 3


def test_prepare_and_a_leaser_together_is_a_usage_error(prep_runner):
    with pytest.raises(UsageError, match="prepare or a leaser"):
        prep_runner.run(rollout(ScriptedPolicy(answer), [SQUARE], config=config(Prepared()),
                                pool=prep_runner.pool, leaser=DirectLeaser()))
    with pytest.raises(UsageError, match="prepare must be an async function"):
        AgentConfig(prepare="pip install")  # type: ignore[arg-type]
