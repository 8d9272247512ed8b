"""The agent loop with a scripted policy, in REAL sandboxes, graded by the REAL judge."""

from __future__ import annotations

import pytest

from trialbox.errors import UsageError
from trialbox.rollout.agent import AgentConfig, rollout
from trialbox.rollout.policy import ScriptedPolicy
from trialbox.sandbox.namespace import NamespaceSandbox
from trialbox.schedule.lease import DirectLeaser
from trialbox.types import Outcome, Task, TaskKind, TestCase

FAST = AgentConfig(max_concurrent_env=4, max_new_tokens=400)

# Hidden tests carry a marker (7777, 31337) that must never reach the policy.
SQUARE = Task(
    task_id="square", kind=TaskKind.FUNCTION, entry_point="square",
    prompt='def square(x):\n    """Return x squared."""\n',
    visible_tests=(TestCase("v1", code="assert candidate(3) == 9"),),
    hidden_tests=(TestCase("h1", code="assert candidate(7777) == 7777 * 7777"),
                  TestCase("h2", code="assert candidate(-31337) == 31337 ** 2")))

WRONG = "```python\ndef square(x):\n    return x + x\n```"
RIGHT = "```python\ndef square(x):\n    return x * x\n```"


def leaser_on(pool):
    async def opener(limits):
        return await NamespaceSandbox.open(pool, limits)
    return DirectLeaser(opener)


def test_wrong_then_right_passes_with_aligned_tokens(runner):
    policy = ScriptedPolicy([WRONG, RIGHT])
    batch = runner.run(rollout(policy, [SQUARE], max_turns=3, config=FAST,
                               pool=runner.pool, leaser=leaser_on(runner.pool)))
    [tr] = batch.trajectories
    assert tr.passed and tr.reward == 1.0 and tr.stop_reason == "passed"
    assert len(tr.turns) == 2
    t1, t2 = tr.turns
    assert t1.outcome is Outcome.FAILED and t2.outcome is Outcome.PASSED
    assert t1.code == "def square(x):\n    return x + x\n" and t1.code_from == "fenced"
    # The feedback names the failing visible test and is in the second prompt.
    assert "assert candidate(3) == 9" in t1.feedback_text
    assert t1.feedback_text in policy.prompts_seen[1]
    assert t2.feedback_text == "" and t2.feedback_ids == ()
    # Token ids: prompt, output 1, feedback 1, output 2; mask 1 exactly on outputs.
    tok = policy.tokenizer
    assert tok.decode(tr.prompt_ids) == policy.prompts_seen[0]
    assert list(tr.token_ids) == (list(tr.prompt_ids) + tok.encode(WRONG) + [256]
                                  + tok.encode(t1.feedback_text) + tok.encode(RIGHT) + [256])
    p, o1, f1 = len(tr.prompt_ids), len(t1.output_ids), len(t1.feedback_ids)
    assert tr.loss_mask == (0,) * p + (1,) * o1 + (0,) * f1 + (1,) * len(t2.output_ids)
    assert all(lp == 0.0 for lp, m in zip(tr.old_logprobs, tr.loss_mask, strict=True) if m == 0)
    assert [lp for lp, m in zip(tr.old_logprobs, tr.loss_mask, strict=True) if m] == \
        list(t1.logprobs + t2.logprobs)
    # The second prompt is exactly the token context so far (no re-tokenisation).
    assert policy.prompt_ids_seen[1] == list(tr.token_ids[:p + o1 + f1])
    assert tr.grade is not None and {t.name for t in tr.grade.tests} == {"v1", "h1", "h2"}
    assert t1.gen_s >= 0 and t1.env_s > 0 and tr.env_s == pytest.approx(t1.env_s + t2.env_s)
    assert batch.stats.gen_calls == 2 and batch.stats.env_s > 0
    rec = tr.to_json()
    assert rec["reward"] == 1.0 and rec["turns"][0]["outcome"] == "failed"


def test_hidden_tests_never_reach_the_policy(runner):
    # Passes the visible test, fails the hidden ones: the feedback must say so without
    # revealing them, on every turn.
    cheaty = "```python\ndef square(x):\n    return 9\n```"
    policy = ScriptedPolicy([cheaty])
    batch = runner.run(rollout(policy, [SQUARE], max_turns=3, config=FAST,
                               pool=runner.pool, leaser=leaser_on(runner.pool)))
    [tr] = batch.trajectories
    assert tr.reward == 0.0 and tr.stop_reason == "max_turns" and len(tr.turns) == 3
    assert "cannot see" in tr.turns[0].feedback_text
    seen = "\n".join(policy.prompts_seen + [t.feedback_text for t in tr.turns])
    for secret in ("7777", "31337", "h1", "h2"):
        assert secret not in seen


def test_compile_error_feedback_and_group_batching(runner):
    broken = "```python\ndef square(x)\n    return x * x\n```"
    policy = ScriptedPolicy([broken, RIGHT])
    batch = runner.run(rollout(policy, [SQUARE], group_size=3, max_turns=2, config=FAST,
                               pool=runner.pool, leaser=leaser_on(runner.pool)))
    assert [t.passed for t in batch.trajectories] == [True, True, True]
    assert len({t.group_id for t in batch.trajectories}) == 1
    assert len({t.episode_id for t in batch.trajectories}) == 3
    fb = batch.trajectories[0].turns[0].feedback_text
    assert "SyntaxError" in fb and "Running your code" in fb
    # One generate call per turn for all the episodes waiting on the model.
    assert policy.calls == [3, 3]


def test_bad_input(runner):
    with pytest.raises(UsageError, match="group_size"):
        runner.run(rollout(ScriptedPolicy([RIGHT]), [SQUARE], group_size=0,
                           pool=runner.pool))
    with pytest.raises(UsageError, match="max_new_tokens"):
        AgentConfig(max_new_tokens=5000, max_context_tokens=4096)
    with pytest.raises(UsageError, match="max_context_tokens"):
        runner.run(rollout(ScriptedPolicy([RIGHT]), [SQUARE],
                           config=AgentConfig(max_new_tokens=5, max_context_tokens=20),
                           pool=runner.pool))
