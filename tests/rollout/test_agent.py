"""The agent loop with a scripted policy, in REAL sandboxes, graded by the REAL judge."""

from __future__ import annotations

import pytest

from trialbox.errors import UsageError
from trialbox.rollout.agent import AgentConfig, rollout
from trialbox.rollout.text import default_prompt
from trialbox.rollout.policy import ByteTokenizer, ScriptedPolicy
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


def test_judge_only_mode_still_explains_a_compile_error(runner):
    broken = "```python\ndef square(x)\n    return x * x\n```"
    opened = []

    async def opener(limits):
        opened.append(limits)
        return await NamespaceSandbox.open(runner.pool, limits)

    cfg = AgentConfig(max_new_tokens=400, execute=False)
    [tr] = runner.run(rollout(ScriptedPolicy([broken, RIGHT]), [SQUARE], max_turns=2,
                              config=cfg, pool=runner.pool,
                              leaser=DirectLeaser(opener))).trajectories
    assert tr.passed and tr.turns[0].exec_status is None and opened == []
    fb = tr.turns[0].feedback_text
    assert "SyntaxError" in fb and "Running your code" not in fb


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


ADD = Task(
    task_id="add", kind=TaskKind.STDIO, prompt="Read two integers; print their sum.",
    visible_tests=(TestCase("v", stdin=b"2 3\n", expected=b"5\n"),),
    hidden_tests=(TestCase("h", stdin=b"4242 1\n", expected=b"4243\n"),))


def test_stdio_episode_and_turn_penalty(runner):
    wrong = "```python\na, b = map(int, input().split())\nprint(a * b)\n```"
    right = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
    policy = ScriptedPolicy([wrong, right])
    cfg = AgentConfig(max_new_tokens=400, turn_penalty=0.25)
    [tr] = runner.run(rollout(policy, [ADD], max_turns=3, config=cfg, pool=runner.pool,
                              leaser=leaser_on(runner.pool))).trajectories
    assert tr.passed and tr.reward == pytest.approx(0.75)  # 1.0 - 0.25 for one more turn
    fb = tr.turns[0].feedback_text
    assert "expected b'5\\n', got b'6\\n'" in fb
    seen = "\n".join(policy.prompts_seen + [fb])
    assert "4242" not in seen and "4243" not in seen


def test_sandbox_is_parked_while_the_policy_generates(runner):
    opened: list[NamespaceSandbox] = []
    checks: list[bool] = []

    async def opener(limits):
        sb = await NamespaceSandbox.open(runner.pool, limits)
        opened.append(sb)
        return sb

    def look(prompts):
        # Every session of every episode holds no cell while the "model" thinks.
        checks.append(bool(opened) and all(sb.parked for sb in opened))

    policy = ScriptedPolicy([WRONG, WRONG, RIGHT], on_generate=look)
    batch = runner.run(rollout(policy, [SQUARE], group_size=2, max_turns=3, config=FAST,
                               pool=runner.pool, leaser=DirectLeaser(opener)))
    assert [t.passed for t in batch.trajectories] == [True, True]
    assert len(opened) == 2 and checks == [False, True, True], \
        "no session before turn 1; both parked during turns 2 and 3"
    assert all(sb.closed for sb in opened), "sessions close when the episodes end"


def test_infrastructure_failure_gives_reward_none(runner):
    from trialbox.errors import SandboxStartError

    async def broken(limits):
        raise SandboxStartError("no cell could be started (test)")

    batch = runner.run(rollout(ScriptedPolicy([WRONG]), [SQUARE], group_size=2,
                               max_turns=3, config=FAST, pool=runner.pool,
                               leaser=DirectLeaser(broken)))
    for tr in batch.trajectories:
        assert tr.reward is None and tr.stop_reason == "infra" and not tr.passed
        assert len(tr.turns) == 1 and "no cell could be started" in tr.turns[0].exec_summary
        assert tr.turns[0].outcome is Outcome.FAILED  # the judge worked; the session did not
    assert batch.stats.excluded == 2
    # Code the judge passes is a pass: the trusted grade does not need the session's run.
    [tr] = runner.run(rollout(ScriptedPolicy([RIGHT]), [SQUARE], max_turns=3, config=FAST,
                              pool=runner.pool, leaser=DirectLeaser(broken))).trajectories
    assert tr.passed and tr.reward == 1.0 and tr.turns[0].exec_status.value == "infra"


def test_a_dead_policy_ends_the_rollout_and_releases_everything(runner):
    from trialbox.errors import InfraError
    from tests.sandbox.conftest import no_leaks

    class Dies(ScriptedPolicy):
        async def generate(self, prompts, **kw):
            if self.calls:
                raise InfraError("model server gone (test)")
            return await super().generate(prompts, **kw)

    leaser = leaser_on(runner.pool)
    with pytest.raises(InfraError, match="model server gone"):
        runner.run(rollout(Dies([WRONG]), [SQUARE], group_size=2, max_turns=3,
                           config=FAST, pool=runner.pool, leaser=leaser))
    assert leaser.open_sessions == 0 and leaser.stats.sessions_closed == 2
    no_leaks(runner)


def test_no_code_then_code_and_a_full_context(runner):
    policy = ScriptedPolicy(["  \n", RIGHT])
    [tr] = runner.run(rollout(policy, [SQUARE], max_turns=2, config=FAST,
                              pool=runner.pool, leaser=leaser_on(runner.pool))).trajectories
    assert tr.turns[0].code is None and tr.turns[0].exec_status is None
    assert "No code found" in tr.turns[0].feedback_text and tr.passed
    # A context with no room for the feedback ends the episode on that turn's grade.
    prompt_len = len(policy.tokenizer.encode(default_prompt(SQUARE)))
    cfg = AgentConfig(max_new_tokens=60, max_context_tokens=prompt_len + 80)
    [tr] = runner.run(rollout(ScriptedPolicy([WRONG]), [SQUARE], max_turns=3, config=cfg,
                              pool=runner.pool, leaser=leaser_on(runner.pool))).trajectories
    assert tr.stop_reason == "context" and len(tr.turns) == 1 and tr.reward == 0.0
    assert tr.turns[0].feedback_ids == () and len(tr.token_ids) <= prompt_len + 80


def test_hf_policy_episodes_keep_exact_logprobs_across_turns(runner):
    """A real (tiny, random) model in the loop: every model token's old log-prob equals
    a recomputation by one forward pass over the whole multi-turn sequence — the
    context each turn was sampled from is exactly the trajectory's prefix."""
    import torch
    from transformers import GPT2Config

    from trialbox.rollout.hf_policy import HFPolicy, sequence_logprobs

    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=258, n_positions=1024, n_embd=32, n_layer=2, n_head=2,
                     eos_token_id=256, bos_token_id=256)
    policy = HFPolicy.from_config(cfg, ByteTokenizer(), seed=0)
    agent = AgentConfig(max_new_tokens=12, max_context_tokens=1000, temperature=0.9)
    batch = runner.run(rollout(policy, [SQUARE], group_size=2, max_turns=2, config=agent,
                               pool=runner.pool, leaser=leaser_on(runner.pool)))
    assert batch.stats.gen_calls == 2 and batch.stats.batch_sizes == [2, 2]
    for tr in batch.trajectories:
        assert len(tr.turns) == 2 and tr.reward == 0.0  # random bytes do not pass
        policy.model.eval()  # from_config leaves it in train mode (dropout on)
        ref = sequence_logprobs(policy.model, tr.token_ids[:1], tr.token_ids[1:], 0.9)
        got = [lp for lp, m in zip(tr.old_logprobs[1:], tr.loss_mask[1:], strict=True) if m]
        want = [lp for lp, m in zip(ref, tr.loss_mask[1:], strict=True) if m]
        assert len(got) == tr.n_model_tokens and got == pytest.approx(want, abs=2e-4)


def test_spans_episode_with_judge_inside_and_model_calls(runner):
    from trialbox import telemetry

    with telemetry.capture() as exported:
        runner.run(rollout(ScriptedPolicy([WRONG, RIGHT]), [SQUARE], max_turns=2,
                           config=FAST, pool=runner.pool, leaser=leaser_on(runner.pool)))
    spans = exported.get_finished_spans()
    [ep] = [s for s in spans if s.name == "episode"]
    assert ep.attributes["episode.stop"] == "passed" and ep.attributes["episode.turns"] == 2
    grades = [s for s in spans if s.name == "judge.grade"]
    assert len(grades) == 2 and all(g.context.trace_id == ep.context.trace_id
                                    for g in grades)
    gens = [s for s in spans if s.name == "model.generate"]
    assert len(gens) == 2 and gens[0].attributes["batch.size"] == 1


def test_the_schedulers_leaser_plugs_in_unchanged(runner):
    """rollout() with the scheduler's SchedulerLeaser: a machine with room for one
    sandbox's quota at a time serialises the episodes' runs; everything still passes
    and every session is closed."""
    from trialbox.schedule.leasing import SchedulerLeaser
    from trialbox.schedule.quotas import Capacity, ResourcePool

    async def opener(limits):
        return await NamespaceSandbox.open(runner.pool, limits)

    one = FAST.exec_limits  # cpus=1.0: the capacity below fits exactly one
    resources = ResourcePool(Capacity(cpus=one.cpus, memory_mb=one.memory_mb,
                                      disk_mb=one.disk_mb), reserve=0.0)
    leaser = SchedulerLeaser(resources, opener=opener)
    batch = runner.run(rollout(ScriptedPolicy([WRONG, RIGHT]), [SQUARE], group_size=3,
                               max_turns=2, config=FAST, pool=runner.pool, leaser=leaser))
    assert [t.passed for t in batch.trajectories] == [True, True, True]
    assert resources.peak_cpus == one.cpus and resources.cpus == 0
    assert leaser.stats.leases == 6 and leaser.stats.sessions_closed == 3


@pytest.mark.parametrize("how", ["graded-infra", "raised"])
def test_a_judge_infrastructure_failure_is_excluded(runner, monkeypatch, how):
    """The judge's INFRA (its retries exhausted), or a judge sandbox that cannot be had,
    excludes the episode: reward None, never 0.0. (The judge stands in here; its own
    infra path is tested in tests/judge.)"""
    from trialbox.errors import SandboxStartError
    from trialbox.rollout import agent
    from trialbox.types import Grade

    async def judge(task, completion, *args, **kw):
        if how == "raised":
            raise SandboxStartError("no cell for the judge (test)")
        return Grade(task.task_id, Outcome.INFRA, message="retries exhausted (test)")

    monkeypatch.setattr(agent, "grade", judge)  # the judge's one entry point
    [tr] = runner.run(rollout(ScriptedPolicy([WRONG]), [SQUARE], max_turns=3, config=FAST,
                              pool=runner.pool, leaser=leaser_on(runner.pool))).trajectories
    assert tr.reward is None and tr.stop_reason == "infra" and len(tr.turns) == 1
    assert tr.turns[0].outcome is Outcome.INFRA and tr.turns[0].feedback_text == ""


def test_a_batch_goes_out_in_episode_order_not_in_arrival_order():
    """The batcher sends the waiting prompts in the episodes' order, whatever order their
    judgements came back in: a sampler drawing for the rows from one random stream then
    gives each episode the same draws on every run."""
    import asyncio

    from trialbox.rollout.agent import RolloutStats, _Batcher
    from trialbox.rollout.policy import Generation

    class Recorder:
        def __init__(self):
            self.calls = []

        async def generate(self, prompts, *, max_new_tokens, temperature=1.0, stop=None):
            self.calls.append([p[0] for p in prompts])
            return [Generation(str(p[0]), (p[0],), (0.0,)) for p in prompts]

    async def scenario(arrivals):
        rec = Recorder()
        batcher = _Batcher(rec, AgentConfig(), live=len(arrivals), stats=RolloutStats())
        runner = asyncio.ensure_future(batcher.run())
        waits = []
        for order in arrivals:  # episode `order` asks with a context naming itself
            waits.append(asyncio.ensure_future(batcher.generate([order], order)))
            await asyncio.sleep(0)
        got = await asyncio.gather(*waits)
        for _ in arrivals:
            batcher.finished()
        await runner
        return rec.calls, [g.text for g, _ in got]

    calls, texts = asyncio.run(scenario([2, 0, 3, 1]))
    assert calls == [[0, 1, 2, 3]]                   # one call, in episode order
    assert texts == ["2", "0", "3", "1"]             # each episode got its own row
    assert asyncio.run(scenario([1, 3, 0, 2]))[0] == [[0, 1, 2, 3]]


def test_an_episode_that_breaks_its_own_session_is_graded_not_excluded(runner):
    """An episode whose own session run ends `infra` while the trusted judge grades the
    same code FAILED is excluded only if a control session from the same leaser fails
    too. Here the episode's session is broken by its own doing (stood in for by a
    session whose runs report infra) and a fresh one works: graded, reward 0, never None.
    With every session broken (the machinery), it is still excluded (the test above)."""
    from trialbox.sandbox import NamespaceSandbox
    from trialbox.types import ExecResult, ExecStatus

    class BrokenByItsCandidate:
        """The episode's session: each run reports infra, as a candidate that wrecked its
        own workspace beyond repair would leave it."""

        def __init__(self, sb):
            self.sb = sb

        def __getattr__(self, name):
            return getattr(self.sb, name)

        async def exec(self, argv, **kw):
            return ExecResult(ExecStatus.INFRA, message="the cell's init vanished (test)")

    opened = []

    async def opener(limits):
        sb = await NamespaceSandbox.open(runner.pool, limits)
        opened.append(sb)
        return BrokenByItsCandidate(sb) if len(opened) == 1 else sb

    [tr] = runner.run(rollout(ScriptedPolicy([WRONG]), [SQUARE], max_turns=3, config=FAST,
                              pool=runner.pool, leaser=DirectLeaser(opener))).trajectories
    assert tr.stop_reason == "session_broken" and tr.reward == 0.0 and not tr.passed
    assert len(tr.turns) == 1 and tr.turns[0].outcome is Outcome.FAILED
    assert len(opened) == 2, "one control session was opened"
    assert all(sb.closed for sb in opened)
