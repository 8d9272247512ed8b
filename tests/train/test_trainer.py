"""The GRPO update on a real tiny model, the NaN guard, configuration errors, the
model's save/load, and a real run stopped by non-finite losses. The short real run
(agent loop, judge, sandboxes) with resume is test_resume.py's, one per way to train."""

import json
import os

import pytest
import torch

from trialbox.errors import UsageError
from trialbox.rollout.policy import ByteTokenizer
from trialbox.train.config import (
    GRPOConfig,
    config_from_dict,
    load_config,
)
from trialbox.train.losses import Advantage, rewards_tensor
from trialbox.train.model import ModelConfig, build_model, load_model, resolve_device, \
    save_model
from trialbox.train.trainer import train
from trialbox.train.update import policy_step, token_logprobs
from trialbox.types import Trajectory, Turn

TOK = ByteTokenizer()
PROMPT = "def f(x):\n    # f(1) == 2\n    return "


def trajectory(model, completion, reward, i, logp_scale=1.0):
    prompt = tuple(TOK.encode(PROMPT))
    out = tuple(TOK.encode(completion)) + (TOK.eos_id,)
    ids = torch.tensor([prompt + out])
    with torch.no_grad():
        lp = token_logprobs(model, ids, torch.ones_like(ids))[0, len(prompt):].tolist()
    lp = [x * logp_scale for x in lp]
    turn = Turn(completion, out, tuple(lp))
    return Trajectory("t", f"t/{i}", prompt, (turn,), prompt + out,
                      (0,) * len(prompt) + (1,) * len(out), (0.0,) * len(prompt) + tuple(lp),
                      reward=reward, group_id="t/g")


def seq_logp(model, completion):
    prompt = TOK.encode(PROMPT)
    ids = torch.tensor([prompt + TOK.encode(completion) + [TOK.eos_id]])
    with torch.no_grad():
        return float(token_logprobs(model, ids, torch.ones_like(ids))[0, len(prompt):].sum())


def tiny():
    return build_model(ModelConfig(n_layer=1, n_embd=32, n_head=2, n_positions=64), TOK,
                       seed=0)


def test_one_grpo_step_raises_the_rewarded_completion():
    model = tiny()
    good, bad = "x + 1\n", "x * 2\n"
    before = seq_logp(model, good), seq_logp(model, bad)
    # one group: two rewarded samples, one wrong, one excluded (infra: reward None)
    trajs = [trajectory(model, good, 1.0, 0), trajectory(model, bad, 0.0, 1),
             trajectory(model, good, 1.0, 2), trajectory(model, bad, None, 3)]
    from trialbox.train.losses import group_advantages
    values, valid = rewards_tensor([t.reward for t in trajs])
    adv = group_advantages(values.view(1, 4), valid.view(1, 4), Advantage.GRPO).view(-1)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    stats = policy_step(model, opt, trajs, adv, valid, GRPOConfig(micro_batch=2))
    assert not stats.skipped and stats.trained_on == 3   # the excluded one is left out
    after = seq_logp(model, good), seq_logp(model, bad)
    assert after[0] > before[0] + 0.05, (before, after)
    assert after[1] < before[1] - 0.05, (before, after)
    assert stats.clip_frac == 0.0   # on-policy: every ratio is 1


def test_a_non_finite_loss_skips_the_step_and_changes_nothing():
    model = tiny()
    trajs = [trajectory(model, "x + 1\n", 1.0, 0), trajectory(model, "x\n", 0.0, 1,
                                                                logp_scale=float("nan"))]
    values, valid = rewards_tensor([1.0, 0.0])
    adv = torch.tensor([1.0, -1.0])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    snapshot = [p.detach().clone() for p in model.parameters()]
    stats = policy_step(model, opt, trajs, adv, valid, GRPOConfig(micro_batch=2))
    assert stats.skipped
    assert all(torch.equal(a, b) for a, b in zip(snapshot, model.parameters(), strict=True))


# --------------------------------------------------------------------------- config

def test_config_errors_name_the_field_to_change(tmp_path):
    with pytest.raises(UsageError, match=r"\[grpo\] unknown key 'group_sise'"):
        config_from_dict({"grpo": {"group_sise": 4}})
    with pytest.raises(UsageError, match=r"unknown section \[gpro\]"):
        config_from_dict({"gpro": {}})
    with pytest.raises(UsageError, match=r"micro_batch=24 must divide .* = 64"):
        config_from_dict({"grpo": {"tasks_per_step": 8, "group_size": 8, "micro_batch": 24}})
    with pytest.raises(UsageError, match=r"n_positions=128"):
        config_from_dict({"model": {"n_positions": 128}, "rollout": {"max_turns": 3}})
    with pytest.raises(UsageError, match=r"\[model\] n_head=5 must divide"):
        config_from_dict({"model": {"n_head": 5}})
    with pytest.raises(UsageError, match=r"\[grpo\] advantage = 'ppo': use one of grpo"):
        config_from_dict({"grpo": {"advantage": "ppo"}})
    with pytest.raises(UsageError, match=r"\[sft\] steps must be an integer"):
        config_from_dict({"sft": {"steps": "many"}})
    with pytest.raises(UsageError, match=r"group_size must be >= 2"):
        config_from_dict({"grpo": {"group_size": 1, "micro_batch": 1}})
    missing = str(tmp_path / "nope")
    with pytest.raises(UsageError, match="does not exist"):
        config_from_dict({"model": {"path": missing}})
    with pytest.raises(UsageError, match="does not exist"):
        load_config(str(tmp_path / "absent.toml"))
    bad = tmp_path / "bad.toml"
    bad.write_text("[grpo\nsteps = 1\n")
    with pytest.raises(UsageError, match="not valid TOML"):
        load_config(str(bad))


def test_a_bad_config_is_refused_before_torch_is_imported(tmp_path):
    """`trialbox train` reads and checks the config, then imports the trainer: a typo
    costs no ~10 s of torch and transformers imports (issue 26)."""
    import subprocess
    import sys
    bad = tmp_path / "bad.toml"
    bad.write_text("[grpo]\ngroup_sise = 4\n")
    probe = ("import sys\nfrom trialbox.errors import UsageError\n"
             "from trialbox.cli import main\n"
             f"code = main(['train', {str(bad)!r}])\n"
             "print(code, 'torch' in sys.modules, 'transformers' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=120)
    assert "unknown key 'group_sise'" in out.stderr, out.stderr
    assert out.stdout.split() == ["2", "False", "False"], (out.stdout, out.stderr)


def test_reward_kind_is_chosen_by_enum():
    from trialbox.train.config import RewardKind
    from trialbox.train.trainer import agent_config
    c = config_from_dict({"rollout": {"reward": "pass_rate"}})
    assert c.rollout.reward is RewardKind.PASS_RATE
    spec = agent_config(c).reward_spec
    assert not spec.binary and spec.pass_rate == 0.5 and spec.all_passed == 0.5
    assert agent_config(config_from_dict({})).reward_spec.binary
    with pytest.raises(UsageError, match=r"\[rollout\] reward = 'dense': use one of"):
        config_from_dict({"rollout": {"reward": "dense"}})


def test_the_shipped_config_loads():
    c = load_config("trialbox/train/demo.toml")
    assert c.grpo.advantage is Advantage.GRPO and c.rollout.max_turns >= 2


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error")
def test_cuda_without_a_gpu_is_a_clear_error():
    with pytest.raises(UsageError, match="no CUDA GPU"):
        resolve_device("cuda")
    assert resolve_device("cpu").type == "cpu"


def test_model_save_load_round_trip(tmp_path):
    model = tiny()
    save_model(model, TOK, str(tmp_path / "m"))
    loaded, tok = load_model(str(tmp_path / "m"))
    assert tok.eos_id == TOK.eos_id
    ids = torch.tensor([TOK.encode(PROMPT)])
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, loaded(ids).logits)
    with pytest.raises(UsageError, match="does not exist"):
        load_model(str(tmp_path / "missing"))
    os.makedirs(tmp_path / "empty")
    with pytest.raises(UsageError, match="no config.json"):
        load_model(str(tmp_path / "empty"))


# --------------------------------------------------------------------------- a real run

def test_resume_without_a_checkpoint_is_a_usage_error(runner, tmp_path):
    config = config_from_dict({"run": {"out_dir": str(tmp_path), "resume": True}})
    with pytest.raises(UsageError, match="holds no checkpoint"):
        runner.run(train(config, runner.pool))


def test_trialbox_train_cli_bad_input_exits_2_with_the_field(tmp_path, capsys):
    from trialbox.cli import main as cli_main
    bad = tmp_path / "bad.toml"
    bad.write_text("[grpo]\ngroup_size = 4\nlearning_rate = 0.1\n")
    assert cli_main(["train", str(bad)]) == 2  # (tests/test_cli.py: main's status is the exit's)
    assert "[grpo] unknown key 'learning_rate'" in capsys.readouterr().err


@pytest.mark.slow
def test_non_finite_losses_are_skipped_then_the_run_stops_with_the_reason(
        runner, tmp_path, monkeypatch):
    import trialbox.train.trainer as trainer_module
    import trialbox.train.update as update_module
    real = update_module.token_logprobs

    def poisoned(*args, **kwargs):  # what a numerically broken forward pass returns
        return real(*args, **kwargs) * float("nan")

    monkeypatch.setattr(update_module, "token_logprobs", poisoned)
    # an untrained model fails every task, so every advantage would be 0 and no loss
    # would be computed at all: give the samples signal (alternating +1 / -1)
    monkeypatch.setattr(trainer_module, "group_advantages",
                        lambda r, v, kind: torch.where(torch.arange(r.numel()) % 2 == 0,
                                                       1.0, -1.0).view(r.shape))
    out = str(tmp_path / "run")
    config = config_from_dict({
        "run": {"out_dir": out, "seed": 2},
        "model": {"n_layer": 1, "n_embd": 32, "n_head": 2},
        "sft": {"steps": 3, "batch_size": 4},
        "grpo": {"steps": 5, "tasks_per_step": 2, "group_size": 4, "micro_batch": 8,
                 "max_bad_steps": 2},
        "rollout": {"max_turns": 2, "max_new_tokens": 8},
        "eval": {"tasks": 0}})
    result = runner.run(train(config, runner.pool), timeout=300)
    assert result.steps_done == 2
    assert "2 steps in a row had a non-finite loss" in result.stopped
    lines = [json.loads(x) for x in open(os.path.join(out, "metrics.jsonl"))]
    skips = [x for x in lines if x["kind"] == "skip"]
    assert [x["skipped"] for x in skips] == ["non-finite loss"] * 2
    # nothing was applied: the final model is the warm-started one
    final, _ = load_model(os.path.join(out, "final"))
    sft_model, _ = load_model(os.path.join(out, "sft"))
    assert all(torch.equal(a, b) for a, b in
               zip(final.parameters(), sft_model.parameters(), strict=True))
