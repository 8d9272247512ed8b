"""The agent loop's logic above the sandbox interface: episodes on `FakeProvider`
sessions, a scripted policy and a scripted judge (the real tier and the real judge are
tested in test_agent.py)."""

from __future__ import annotations

import asyncio

import pytest

from trialbox.errors import InfraError, UsageError
from trialbox.rollout.agent import AgentConfig, Episodes, rollout
from trialbox.rollout.policy import ScriptedPolicy
from trialbox.sandbox.fake import FakeProvider
from trialbox.types import ExecResult, ExecStatus, Grade, Outcome, Task, TaskKind, \
    TestCase, TestResult

SQUARE = Task(
    task_id="square", kind=TaskKind.FUNCTION, entry_point="square",
    prompt='def square(x):\n    """Return x squared."""\n',
    visible_tests=(TestCase("v1", code="assert candidate(3) == 9"),),
    hidden_tests=(TestCase("h1", code="assert candidate(7777) == 7777 * 7777"),))
WRONG = "```python\ndef square(x):\n    return x + x\n```"
RIGHT = "```python\ndef square(x):\n    return x * x\n```"
CFG = AgentConfig(max_new_tokens=200)


async def grader(task: Task, completion: str, seed: int | None = None) -> Grade:
    """A judge that passes `x * x` and fails anything else (visible test named)."""
    ok = "x * x" in completion
    return Grade(task.task_id, Outcome.PASSED if ok else Outcome.FAILED,
                 tests=(TestResult("v1", ok, "" if ok else "assert failed", hidden=False),
                        TestResult("h1", ok)))


def test_wrong_then_right_on_the_fake_provider():
    async def body():
        provider = FakeProvider()
        policy = ScriptedPolicy([WRONG, RIGHT])
        batch = await rollout(policy, [SQUARE], config=CFG, pool=provider, grader=grader)
        [tr] = batch.trajectories
        assert tr.passed and tr.reward == 1.0 and tr.stop_reason == "passed"
        assert [t.outcome for t in tr.turns] == [Outcome.FAILED, Outcome.PASSED]
        assert "assert candidate(3) == 9" in tr.turns[0].feedback_text
        assert "7777" not in "".join(policy.prompts_seen)  # hidden tests never shown
        # one session for the episode, from the provider: each turn ran solution.py in
        # it (files kept), parked between leases, closed at the end
        [sb] = provider.opened
        assert sb.calls == [["python3", "solution.py"]] * 2
        assert sb.files["solution.py"].decode().startswith(SQUARE.prompt)
        assert "x * x" in sb.files["solution.py"].decode()
        assert sb.parks == 2 and sb.closed
        tok = policy.tokenizer
        assert list(tr.token_ids) == (list(tr.prompt_ids) + tok.encode(WRONG) + [256]
                                      + list(tr.turns[0].feedback_ids)
                                      + tok.encode(RIGHT) + [256])

    asyncio.run(body())


def test_a_provider_that_cannot_open_excludes_the_episode():
    async def broken(argv, stdin, files):
        return ExecResult(ExecStatus.INFRA, message="cell died")

    async def body():
        provider = FakeProvider(broken)  # every run, the control's too, is infra
        batch = await rollout(ScriptedPolicy([WRONG]), [SQUARE], config=CFG,
                              pool=provider, grader=grader)
        [tr] = batch.trajectories
        assert tr.reward is None and tr.stop_reason == "infra"
        assert len(provider.opened) == 2  # the episode's session and the control's
        assert all(sb.closed for sb in provider.opened)

        async def open_fails(limits=None):
            raise InfraError("no cell")
        provider = FakeProvider()
        provider.open = open_fails  # type: ignore[method-assign]
        batch = await rollout(ScriptedPolicy([RIGHT]), [SQUARE], config=CFG,
                              pool=provider, grader=grader)
        [tr] = batch.trajectories
        assert tr.passed and tr.reward == 1.0  # the judge's word stands

    asyncio.run(body())


def test_episodes_started_one_by_one_share_batches():
    """Scheduler-style: each episode is started on its own (as a job would), at any
    time; a batch waits for every live episode, and a cancelled one leaves it."""
    async def body():
        policy = ScriptedPolicy([WRONG, RIGHT])
        async with Episodes(policy, CFG, FakeProvider(), grader=grader) as episodes:
            first = [asyncio.ensure_future(episodes.run(SQUARE, f"e{i}", "g", order=i))
                     for i in range(3)]
            stuck = asyncio.ensure_future(episodes.run(SQUARE, "e9", "g", order=9))
            await asyncio.sleep(0)
            stuck.cancel()  # preempted while it waits on the model
            trajs = await asyncio.gather(*first)
            assert all(t.passed and len(t.turns) == 2 for t in trajs)
            late = await episodes.run(SQUARE, "e3", "g", order=3)
            assert late.passed
        with pytest.raises(asyncio.CancelledError):
            await stuck
        # turn 1 of the three (the cancelled one left the batch), turn 2 of the three,
        # then the late one's two turns alone
        assert policy.calls == [3, 3, 1, 1]

    asyncio.run(body())


def test_admission_is_per_episode_and_bad_input_is_named():
    async def body():
        inside, peak = 0, 0

        class Slot:
            async def __aenter__(self):
                nonlocal inside, peak
                inside += 1
                peak = max(peak, inside)

            async def __aexit__(self, *exc):
                nonlocal inside
                inside -= 1
        seen: list[str] = []

        def slot(episode: str) -> Slot:
            seen.append(episode)
            return Slot()
        policy = ScriptedPolicy([RIGHT])
        async with Episodes(policy, CFG, FakeProvider(), grader=grader,
                            env_slot=slot) as episodes:
            await asyncio.gather(*(episodes.run(SQUARE, f"ep{i}", "g") for i in range(4)))
        assert sorted(seen) == ["ep0", "ep1", "ep2", "ep3"] and peak == 4
        with pytest.raises(UsageError, match="SandboxProvider"):
            await rollout(policy, [SQUARE], pool=object(), grader=grader)  # type: ignore

    asyncio.run(body())


def test_stopping_at_a_pass_is_no_oracle_the_final_grading_is_the_reward():
    """A turn whose grading passes ends the episode, and its reward is one grading more
    with the final-domain seed no turn saw (judge/seeds.py). A judge whose random draws
    pass the turn's seed and fail the final one (a rare-wrong answer, lucky once) gives
    reward 0, and the episode still ends: no second chance to sample the hidden tests.
    Every turn's seed is derived from the code, so resubmitting it draws the same."""
    from trialbox.judge.seeds import FINAL, TURN, TURN_PASS_ONLY, derive_seed

    seen: list[tuple[str, int | None]] = []

    async def lucky_on_turns(task: Task, completion: str, seed: int | None = None) -> Grade:
        seen.append((completion, seed))
        ok = seed == derive_seed(task.task_id, completion, TURN)
        return Grade(task.task_id, Outcome.PASSED if ok else Outcome.FAILED,
                     tests=(TestResult("h1", ok),), seed=seed)

    async def body():
        policy = ScriptedPolicy([RIGHT, RIGHT, RIGHT])
        cfg = AgentConfig(max_new_tokens=200, max_turns=3)
        [tr] = (await rollout(policy, [SQUARE], config=cfg, pool=FakeProvider(),
                              grader=lucky_on_turns)).trajectories
        assert len(tr.turns) == 1 and tr.stop_reason == "passed"
        assert tr.reward == 0.0 and not tr.passed
        assert TURN_PASS_ONLY in tr.grade.flags
        [(c1, s1), (c2, s2)] = seen
        assert c1 == c2 and s1 == derive_seed(SQUARE.task_id, c1, TURN)
        assert s2 == derive_seed(SQUARE.task_id, c1, FINAL) != s1
        # a deterministic judge passes both: reward 1, as before
        seen.clear()
        [tr] = (await rollout(ScriptedPolicy([RIGHT]), [SQUARE], config=cfg,
                              pool=FakeProvider(), grader=grader)).trajectories
        assert tr.passed and tr.reward == 1.0 and len(tr.turns) == 1

    asyncio.run(body())


def test_the_last_turn_is_graded_once_in_the_final_domain():
    from trialbox.judge.seeds import FINAL, derive_seed

    seeds: list[int | None] = []

    async def judge(task: Task, completion: str, seed: int | None = None) -> Grade:
        seeds.append(seed)
        return await grader(task, completion)

    async def body():
        [tr] = (await rollout(ScriptedPolicy([RIGHT]), [SQUARE],
                              config=AgentConfig(max_new_tokens=200, max_turns=1),
                              pool=FakeProvider(), grader=judge)).trajectories
        assert tr.passed and tr.reward == 1.0
        code = "\n" + RIGHT.split("\n", 1)[1].rsplit("```", 1)[0]
        assert seeds == [derive_seed(SQUARE.task_id, code, FINAL)]

    asyncio.run(body())
