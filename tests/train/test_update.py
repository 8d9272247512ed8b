"""The one micro-batch driver (`update.micro_batch_epochs`) that GRPO's and PPO's
updates share, and the update function the trainer chooses once (`make_update`)."""

from __future__ import annotations

import copy

import pytest
import torch

import trialbox.train.trainer as trainer_module
from tests.train.test_trainer import tiny, trajectory
from trialbox.train.config import Algorithm, GRPOConfig, config_from_dict
from trialbox.train.ppo import ValueHead, ppo_step
from trialbox.train.update import (
    MicroLoss,
    UpdateStats,
    micro_batch_epochs,
    policy_step,
)


def _params(model):
    return [p.detach().clone() for p in model.parameters()]


def _same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def _round(model):
    trajs = [trajectory(model, c, r, i) for i, (c, r) in enumerate(
        [("x + 1\n", 1.0), ("x * 2\n", 0.0), ("x\n", 1.0), ("-x\n", 0.0)])]
    return trajs, torch.tensor([1.0, -1.0, 1.0, -1.0]), torch.ones(4, dtype=torch.bool)


@pytest.mark.parametrize("algorithm", [Algorithm.GRPO, Algorithm.PPO])
def test_micro_batches_reproduce_the_whole_batch_for_both_algorithms(algorithm):
    """Both updates go through the one driver: 4 micro-batches of 1 give the same
    weights as one batch of 4."""
    model = tiny()
    trajs, adv, valid = _round(model)
    results = []
    for micro in (1, 4):
        m = copy.deepcopy(model)
        g = GRPOConfig(algorithm=algorithm, micro_batch=micro, lr=1e-2, group_size=4)
        if algorithm is Algorithm.PPO:
            torch.manual_seed(0)
            head = ValueHead(32)
            opt = torch.optim.SGD(list(m.parameters()) + list(head.parameters()), lr=0.1)
            stats = ppo_step(m, head, opt, trajs, valid, g)
        else:
            opt = torch.optim.SGD(m.parameters(), lr=0.1)
            stats = policy_step(m, opt, trajs, adv, valid, g)
        assert not stats.skipped and stats.grad_norm > 0
        results.append(_params(m))
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(*results, strict=True))


def test_the_driver_skips_a_non_finite_part_or_hook_and_applies_nothing():
    model = tiny()
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=0.1)
    g = GRPOConfig(epochs=2)
    before = _params(model)
    x = torch.tensor([[1, 2, 3]])

    def micro(scale: float) -> MicroLoss:
        loss = model(input_ids=x).logits.float().mean() * scale
        return MicroLoss(loss, 0.5, {"seen": scale})

    stats = UpdateStats()
    assert micro_batch_epochs(opt, params, g, [1.0, float("nan")], micro, stats) is None
    assert stats.skipped and _same(before, model.parameters())
    stats = UpdateStats()
    assert micro_batch_epochs(opt, params, g, [1.0], micro, stats,
                              before_epoch=lambda: False) is None
    assert stats.skipped and _same(before, model.parameters())
    stats = UpdateStats()
    logs = micro_batch_epochs(opt, params, g, [1.0, 2.0], micro, stats)
    assert logs is not None and logs["seen"] == [1.0, 2.0, 1.0, 2.0]  # 2 epochs x 2 parts
    assert len(logs["loss"]) == 4 and not stats.skipped
    assert not _same(before, model.parameters())


@pytest.mark.parametrize("algorithm, runs, never", [
    ("grpo", "policy_step", "ppo_step"), ("ppo", "ppo_step", "policy_step")])
def test_the_trainer_chooses_its_update_once(monkeypatch, algorithm, runs, never):
    calls: list[str] = []
    for name in ("policy_step", "ppo_step"):
        real = getattr(trainer_module, name)

        def spy(*a, _name=name, _real=real, **kw):
            calls.append(_name)
            return _real(*a, **kw)
        monkeypatch.setattr(trainer_module, name, spy)
    config = config_from_dict({"grpo": {"algorithm": algorithm, "group_size": 4,
                                        "tasks_per_step": 1, "micro_batch": 4}})
    model = tiny()
    head = ValueHead(32) if algorithm == "ppo" else None
    params = list(model.parameters()) + (list(head.parameters()) if head else [])
    update = trainer_module.make_update(config, model, torch.optim.AdamW(params),
                                        head=head, ref=None, pad_id=257,
                                        device=torch.device("cpu"))
    assert update.__name__ == f"{algorithm}_update"
    trajs, _, _ = _round(model)
    for step in range(2):
        assert not update(trajs, step).skipped
    assert calls == [runs, runs] and never not in calls
