"""The trainer's async mode (`[rollout] mode = "async"`, trialbox/train/pipeline.py): the
config switch, the staleness rule on a scripted producer, the priority of the oldest
batch for environment slots, the off-policy ratio against the recorded log-probs, and
short real runs (demo model, real judge) with a larger bound and PPO, and that still
skip non-finite losses. The short run that records versions, keeps the bound and
resumes is test_resume.py's, with GRPO's and PPO's."""

import asyncio
import json
import os
import random
from types import SimpleNamespace

import pytest
import torch

from trialbox.errors import UsageError
from trialbox.rollout.agent import RolloutBatch, RolloutStats
from trialbox.train.config import GRPOConfig, RolloutMode, config_from_dict, with_changes
from trialbox.train.losses import rewards_tensor
from trialbox.train import pipeline
from trialbox.train.model import load_model
from trialbox.train.pipeline import (
    AsyncBatches,
    ModelClock,
    PrioritySlots,
    SyncBatches,
    launch_version,
    may_train,
)
from trialbox.train.trainer import train
from trialbox.train.update import policy_step

from tests.train.test_trainer import tiny, trajectory

# --------------------------------------------------------------------------- config


def test_async_config_and_its_errors_name_the_field():
    c = config_from_dict({"rollout": {"mode": "async", "max_staleness": 2}})
    assert c.rollout.mode is RolloutMode.ASYNC and c.rollout.max_staleness == 2
    assert config_from_dict({}).rollout.mode is RolloutMode.SYNC
    assert config_from_dict({"rollout": {"mode": "async"}}).rollout.max_staleness == 1
    with pytest.raises(UsageError, match=r"\[rollout\] mode = 'asynch': use one of sync, async"):
        config_from_dict({"rollout": {"mode": "asynch"}})
    with pytest.raises(UsageError, match=r"\[rollout\] max_staleness only applies to "
                                         r"mode = 'async'"):
        config_from_dict({"rollout": {"max_staleness": 2}})
    with pytest.raises(UsageError, match=r"\[rollout\] max_staleness must be >= 1, got 0"):
        config_from_dict({"rollout": {"mode": "async", "max_staleness": 0}})
    with pytest.raises(UsageError, match=r"\[rollout\] max_staleness must be an integer"):
        config_from_dict({"rollout": {"mode": "async", "max_staleness": 1.5}})


# --------------------------------------------------------------------------- the rule

def test_the_staleness_rule():
    assert [launch_version(s, 1) for s in range(5)] == [0, 0, 1, 2, 3]
    assert [launch_version(s, 3) for s in range(6)] == [0, 0, 0, 0, 1, 2]
    assert [launch_version(s, 2, first=4) for s in range(4, 9)] == [4, 4, 4, 5, 6]
    assert may_train(5, 4, 1) and may_train(5, 5, 1) and not may_train(5, 3, 1)
    assert not may_train(5, 6, 2)  # sampled by weights newer than the trained ones


def _fake_batch(step):
    model = tiny()
    trajs = [trajectory(model, "x + 1\n", 1.0, step)]
    return RolloutBatch(trajs, RolloutStats(episodes=1))


@pytest.mark.parametrize("k,first", [(1, 0), (2, 0), (3, 2)])
def test_the_producer_keeps_the_bound_by_waiting_and_overlaps(k, first):
    """A scripted producer (random rollout times) and trainer (random update times): no
    batch starts before the weights it needs exist, none is trained more than K updates
    stale, at most K + 1 are in flight, and batches do overlap."""
    steps = 9
    rng = random.Random(k * 10 + first)
    published = [first]   # versions the trainer has published, in order
    in_flight = set()
    most = [0]
    starts = {}

    def launch(step, version):
        # called when the batch is launched: the weights it reads are the newest ones
        assert version == published[-1], (step, version, published)
        starts[step] = version
        in_flight.add(step)
        most[0] = max(most[0], len(in_flight))

        async def rollout():
            await asyncio.sleep(rng.uniform(0.0, 0.02))
            in_flight.discard(step)
            return _fake_batch(step)
        return rollout()

    async def trainer():
        batches = AsyncBatches(launch, first=first, steps=steps, max_staleness=k)
        batches.start()
        seen = []
        try:
            for step in range(first, steps):
                got = await batches.get(step)
                assert got.step == step and 0 <= got.staleness <= k
                assert {t.policy_version for t in got.batch.trajectories} == {got.version}
                seen.append(got.version)
                await asyncio.sleep(rng.uniform(0.0, 0.01))   # the update
                published.append(step + 1)
                batches.publish(step + 1)
        finally:
            await batches.aclose()
        return seen

    seen = asyncio.run(trainer())
    assert seen == [launch_version(s, k, first) for s in range(first, steps)]
    assert sorted(starts) == list(range(first, steps))
    assert 2 <= most[0] <= k + 1


def test_sync_batches_are_on_policy():
    async def go():
        batches = SyncBatches(lambda step, version: asyncio.sleep(0, _fake_batch(step)))
        batches.start()
        got = await batches.get(3)
        await batches.aclose()
        return got
    got = asyncio.run(go())
    assert got.version == 3 and got.staleness == 0
    assert got.batch.trajectories[0].policy_version == 3


def test_priority_slots_serve_the_oldest_batch_first():
    async def go():
        slots = PrioritySlots(1)
        order = []

        async def turn(step, name):
            async with slots.lane(step):
                order.append(name)
                await asyncio.sleep(0.001)

        async with slots.lane(0):   # hold the only slot while others queue
            tasks = [asyncio.ensure_future(turn(1, "young-a")),
                     asyncio.ensure_future(turn(0, "old-a")),
                     asyncio.ensure_future(turn(1, "young-b")),
                     asyncio.ensure_future(turn(0, "old-b"))]
            await asyncio.sleep(0.01)
            tasks[1].cancel()   # a cancelled waiter gives nothing up and takes nothing
            await asyncio.sleep(0)
        await asyncio.gather(*tasks, return_exceptions=True)
        return order, slots.free
    order, free = asyncio.run(go())
    assert order == ["old-b", "young-a", "young-b"]
    assert free == 1


def test_model_clock_counts_the_union_of_busy_intervals(monkeypatch):
    """Busy [0, 2] and [1, 3] overlap: 3 s busy, not 4, so 1 s idle of the lap's 4. On
    a clock the test sets (the real one, on a loaded host, would make it a guess)."""
    now = [0.0]
    monkeypatch.setattr(pipeline, "time", SimpleNamespace(monotonic=lambda: now[0]))
    clock = ModelClock()
    a, b = clock.busy(), clock.busy()
    a.__enter__()
    now[0] = 1.0
    b.__enter__()
    now[0] = 2.0
    a.__exit__(None, None, None)
    assert clock.busy_s() == 2.0  # the interval still open counts
    now[0] = 3.0
    b.__exit__(None, None, None)
    now[0] = 4.0
    assert clock.lap() == (4.0, 1.0)
    now[0] = 6.0
    assert clock.lap() == (2.0, 2.0)  # a lap counts from the last one


# --------------------------------------------------------------------------- off-policy

def test_the_ratio_is_taken_against_the_sampler_s_logprobs():
    """Trajectories sampled by an older copy of the weights: the update's ratio uses their
    recorded log-probs, so it is not 1 and the clip acts (a recompute would give 1)."""
    model = tiny()
    trajs = [trajectory(model, "x + 1\n", 1.0, 0), trajectory(model, "x * 2\n", 0.0, 1)]
    values, valid = rewards_tensor([1.0, 0.0])
    adv = torch.tensor([1.0, -1.0])
    g = GRPOConfig(micro_batch=2, lr=1e-2)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-2)
    on_policy = policy_step(model, opt, trajs, adv, valid, g)
    assert on_policy.clip_frac == 0.0
    for _ in range(3):   # the trainer moves on: the same trajectories are now stale
        policy_step(model, opt, trajs, adv, valid, g)
    stale = policy_step(model, opt, trajs, adv, valid, g)
    assert stale.clip_frac > 0.0 and not stale.skipped


# --------------------------------------------------------------------------- real runs

def _config(out, **rollout):
    return config_from_dict({
        "run": {"out_dir": out, "seed": 3, "checkpoint_every": 1},
        "model": {"n_layer": 1, "n_embd": 32, "n_head": 2},
        "sft": {"steps": 5, "batch_size": 8},
        "grpo": {"steps": 3, "tasks_per_step": 2, "group_size": 2, "micro_batch": 4,
                 "lr": 1e-2},
        "rollout": {"max_turns": 2, "max_new_tokens": 8, "env_workers": 2,
                    "mode": "async", **rollout},
        "eval": {"tasks": 0}})


def _steps(out):
    lines = [json.loads(x) for x in open(os.path.join(out, "metrics.jsonl"))]
    return [x for x in lines if x["kind"] in ("step", "skip")]


def _alternating_advantages(monkeypatch):
    # an untrained model fails every task, so every advantage would be 0 and nothing
    # would be trained: give the samples signal (alternating +1 / -1)
    import trialbox.train.trainer as trainer_module
    monkeypatch.setattr(trainer_module, "group_advantages",
                        lambda r, v, kind: torch.where(torch.arange(r.numel()) % 2 == 0,
                                                       1.0, -1.0).view(r.shape))


@pytest.mark.slow
def test_async_with_a_larger_bound_and_ppo(runner, tmp_path):
    out = str(tmp_path / "run")
    config = config_from_dict({
        "run": {"out_dir": out, "seed": 4, "checkpoint_every": 10},
        "model": {"n_layer": 1, "n_embd": 32, "n_head": 2},
        "sft": {"steps": 5, "batch_size": 8},
        "grpo": {"algorithm": "ppo", "steps": 4, "tasks_per_step": 2, "group_size": 2,
                 "micro_batch": 4},
        "rollout": {"max_turns": 2, "max_new_tokens": 8, "env_workers": 2,
                    "mode": "async", "max_staleness": 2},
        "eval": {"tasks": 0}})
    result = runner.run(train(config, runner.pool), timeout=300)
    assert result.steps_done == 4
    steps = _steps(out)
    assert [x["policy_version"] for x in steps] == [0, 0, 0, 1]
    assert max(x["staleness"] for x in steps) == 2
    assert all("value_loss" in x for x in steps)


@pytest.mark.slow
def test_async_non_finite_losses_are_skipped_then_the_run_stops(runner, tmp_path,
                                                                monkeypatch):
    import trialbox.train.update as update_module
    real = update_module.token_logprobs
    monkeypatch.setattr(update_module, "token_logprobs",
                        lambda *a, **kw: real(*a, **kw) * float("nan"))
    _alternating_advantages(monkeypatch)
    out = str(tmp_path / "run")
    config = with_changes(_config(out), grpo={"steps": 5, "max_bad_steps": 2})
    result = runner.run(train(config, runner.pool), timeout=300)
    assert result.steps_done == 2
    assert "2 steps in a row had a non-finite loss" in result.stopped
    assert [x["skipped"] for x in _steps(out)] == ["non-finite loss"] * 2
    final, _ = load_model(os.path.join(out, "final"))
    sft_model, _ = load_model(os.path.join(out, "sft"))
    assert all(torch.equal(a, b) for a, b in
               zip(final.parameters(), sft_model.parameters(), strict=True))
    runner.assert_no_leaks()   # the batches still in flight were cancelled cleanly
