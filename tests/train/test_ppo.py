"""PPO in the trainer: one update on a real tiny model (policy and value head), the NaN
guard, the `algorithm` field's validation. Its short real run with resume (the value
head checkpointed and restored) is test_resume.py's, with GRPO's and async's."""


import pytest
import torch

from trialbox.errors import UsageError
from trialbox.train.config import Algorithm, GRPOConfig, config_from_dict
from trialbox.train.losses import gae, rewards_tensor
from trialbox.train.ppo import (
    ValueHead,
    logprobs_and_values,
    ppo_step,
    terminal_rewards,
)
from trialbox.train.update import batch_of

from tests.train.test_trainer import TOK, seq_logp, tiny, trajectory


def value_error(model, head, trajs, g):
    """Mean squared error of the head's values against the GAE returns computed from
    the values before any update (fixed targets, passed in as `g`)."""
    b = batch_of(trajs, TOK.pad_id, torch.device("cpu"))
    with torch.no_grad():
        _, v = logprobs_and_values(model, head, b["ids"], b["attn"])
    m = b["mask"]
    return float((((v - g) ** 2) * m).sum() / m.sum())


def test_one_ppo_step_raises_the_rewarded_completion_and_fits_the_values():
    model = tiny()
    torch.manual_seed(0)
    head = ValueHead(32)
    good, bad = "x + 1\n", "x * 2\n"
    before = seq_logp(model, good), seq_logp(model, bad)
    trajs = [trajectory(model, good, 1.0, 0), trajectory(model, bad, 0.0, 1),
             trajectory(model, good, 1.0, 2), trajectory(model, bad, None, 3)]
    graded = trajs[:3]
    # the returns ppo_step regresses on: GAE over the pre-update values
    b = batch_of(graded, TOK.pad_id, torch.device("cpu"))
    with torch.no_grad():
        _, v0 = logprobs_and_values(model, head, b["ids"], b["attn"])
    g = GRPOConfig(algorithm=Algorithm.PPO, micro_batch=2, group_size=4)
    _, returns = gae(terminal_rewards(graded, b["mask"]), v0 * b["mask"], b["mask"],
                     g.gamma, g.lam)
    # the last model token of a rewarded episode returns its reward; a wrong one 0
    last = int(b["mask"][0].nonzero()[-1])
    assert returns[0, last] == pytest.approx(1.0) and float(returns[1].abs().sum()) == 0
    err_before = value_error(model, head, graded, returns)

    _, valid = rewards_tensor([t.reward for t in trajs])
    opt = torch.optim.AdamW(list(model.parameters()) + list(head.parameters()), lr=3e-3)
    stats = ppo_step(model, head, opt, trajs, valid, g)
    assert not stats.skipped and stats.trained_on == 3   # the excluded one is left out
    assert stats.value_loss > 0 and stats.clip_frac == 0.0   # on-policy: ratios are 1
    after = seq_logp(model, good), seq_logp(model, bad)
    assert after[0] > before[0] + 0.05, (before, after)
    assert after[1] < before[1] - 0.05, (before, after)
    err_after = value_error(model, head, graded, returns)
    assert err_after < 0.97 * err_before, (err_before, err_after)  # 0.500 -> 0.452


def test_a_non_finite_ppo_loss_skips_the_step_and_changes_nothing():
    model = tiny()
    head = ValueHead(32)
    trajs = [trajectory(model, "x + 1\n", 1.0, 0),
             trajectory(model, "x\n", 0.0, 1, logp_scale=float("nan"))]
    _, valid = rewards_tensor([1.0, 0.0])
    opt = torch.optim.AdamW(list(model.parameters()) + list(head.parameters()), lr=1e-2)
    snapshot = [p.detach().clone() for p in [*model.parameters(), *head.parameters()]]
    stats = ppo_step(model, head, opt, trajs, valid,
                     GRPOConfig(algorithm=Algorithm.PPO, micro_batch=2))
    assert stats.skipped
    assert all(torch.equal(a, b) for a, b in
               zip(snapshot, [*model.parameters(), *head.parameters()], strict=True))


def test_algorithm_field_is_an_enum_and_inconsistent_keys_name_the_field():
    assert config_from_dict({}).grpo.algorithm is Algorithm.GRPO
    c = config_from_dict({"grpo": {"algorithm": "ppo", "gamma": 0.99, "lam": 0.9}})
    assert c.grpo.algorithm is Algorithm.PPO and c.grpo.gamma == 0.99
    # PPO needs no group: a group of one is fine there (not under GRPO)
    assert config_from_dict({"grpo": {"algorithm": "ppo", "group_size": 1,
                                      "micro_batch": 1}}).grpo.group_size == 1
    with pytest.raises(UsageError, match=r"\[grpo\] algorithm = 'a2c': use one of grpo, ppo"):
        config_from_dict({"grpo": {"algorithm": "a2c"}})
    with pytest.raises(UsageError, match=r"\[grpo\] gamma only applies to algorithm = 'ppo'"):
        config_from_dict({"grpo": {"gamma": 0.9}})
    with pytest.raises(UsageError, match=r"\[grpo\] advantage only applies to algorithm"):
        config_from_dict({"grpo": {"algorithm": "ppo", "advantage": "dr_grpo"}})
    with pytest.raises(UsageError, match=r"\[grpo\] lam must be in \[0, 1\], got 1.5"):
        config_from_dict({"grpo": {"algorithm": "ppo", "lam": 1.5}})
    with pytest.raises(UsageError, match=r"\[grpo\] value_coef and value_clip must be > 0"):
        config_from_dict({"grpo": {"algorithm": "ppo", "value_coef": 0.0}})
