"""PPO in the trainer: one update on a real tiny model (policy and value head), the NaN
guard, the `algorithm` field's validation, and a short real run with resume."""

import json
import math
import os

import pytest
import torch

from trialbox.errors import UsageError
from trialbox.train.config import Algorithm, GRPOConfig, config_from_dict, with_changes
from trialbox.train.losses import gae, rewards_tensor
from trialbox.train.ppo import (
    VALUE_HEAD_FILE,
    ValueHead,
    logprobs_and_values,
    ppo_step,
    terminal_rewards,
)
from trialbox.train.trainer import train
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


def test_short_ppo_run_logs_value_loss_checkpoints_the_head_and_resumes(runner, tmp_path):
    out = str(tmp_path / "run")
    config = config_from_dict({
        "run": {"out_dir": out, "seed": 1, "checkpoint_every": 1},
        "model": {"n_layer": 1, "n_embd": 32, "n_head": 2},
        "sft": {"steps": 5, "batch_size": 8},
        "grpo": {"algorithm": "ppo", "steps": 2, "tasks_per_step": 2, "group_size": 2,
                 "micro_batch": 2},
        # partial credit (and the turn penalty): rewards are non-zero even for a barely
        # trained model, so the critic (which starts at 0) has something to fit
        "rollout": {"max_turns": 2, "max_new_tokens": 8, "env_workers": 2,
                    "reward": "pass_rate"},
        "eval": {"tasks": 0}})
    result = runner.run(train(config, runner.pool), timeout=300)
    assert result.steps_done == 2 and not result.stopped
    lines = [json.loads(x) for x in open(os.path.join(out, "metrics.jsonl"))]
    steps = [x for x in lines if x["kind"] == "step"]
    assert [x["step"] for x in steps] == [1, 2]
    for x in steps:
        assert x["episodes"] == 4 and x["trained_on"] == 4 - x["excluded"]
        assert x["reward"] != 0   # so some return is non-zero: the critic has an error
        assert math.isfinite(x["value_loss"]) and x["value_loss"] > 0
        assert math.isfinite(x["loss"])
    head_file = os.path.join(out, "checkpoint", VALUE_HEAD_FILE)
    saved = torch.load(head_file)
    assert set(saved) == {"linear.weight", "linear.bias"}
    assert os.path.exists(os.path.join(out, "final", VALUE_HEAD_FILE))

    # resume: the head comes back from the checkpoint and training continues
    more = with_changes(config, run={"resume": True}, grpo={"steps": 3})
    result = runner.run(train(more, runner.pool), timeout=300)
    assert result.steps_done == 3
    lines = [json.loads(x) for x in open(os.path.join(out, "metrics.jsonl"))]
    assert [x["step"] for x in lines if x["kind"] == "step"] == [1, 2, 3]

    # a GRPO checkpoint has no head: resuming it as PPO says what to change
    os.remove(head_file)
    with pytest.raises(UsageError, match=r"holds no value_head.pt"):
        runner.run(train(with_changes(more, grpo={"steps": 4}), runner.pool))
