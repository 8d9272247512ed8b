"""Self-imitation (`[grpo] replay`): what the buffer keeps, and that the replayed term
raises a verified answer's probability when the batch itself carries no signal."""

import pytest
import torch

from trialbox.errors import UsageError
from trialbox.train.config import GRPOConfig, config_from_dict
from trialbox.train.replay import SuccessReplay
from trialbox.train.update import policy_step
from trialbox.types import Outcome, Trajectory, Turn
from tests.train.test_trainer import PROMPT, TOK, seq_logp, tiny, trajectory


def episode(task, completion, *, first_turn_passed=True, turns=1, reward=1.0, i=0):
    """A trajectory of `task` whose last turn said `completion`."""
    prompt = tuple(TOK.encode(PROMPT))
    out = tuple(TOK.encode(completion)) + (TOK.eos_id,)
    fb = tuple(TOK.encode("# wrong\n"))
    made: list[Turn] = []
    ids, mask = list(prompt), [0] * len(prompt)
    for k in range(turns):
        last = k == turns - 1
        passed = first_turn_passed if k == 0 else last
        turn = Turn(completion, out, (-0.1,) * len(out),
                    outcome=Outcome.PASSED if passed else Outcome.FAILED,
                    feedback_text="" if last else "# wrong\n",
                    feedback_ids=() if last else fb)
        made.append(turn)
        ids += list(out) + list(turn.feedback_ids)
        mask += [1] * len(out) + [0] * len(turn.feedback_ids)
    lp = tuple(-0.1 if m else 0.0 for m in mask)
    return Trajectory(task, f"{task}/{i}", prompt, tuple(made), tuple(ids), tuple(mask), lp,
                      reward=reward, passed=reward is not None and reward > 0)


def test_the_buffer_keeps_distinct_first_turn_passes_only():
    buf = SuccessReplay(capacity=3, seed=0)
    new = buf.add([
        episode("a", "x + 1\n", i=0), episode("a", "x + 1\n", i=1),   # one entry
        episode("b", "x + 2\n"),
        episode("c", "x\n", reward=0.0, first_turn_passed=False),    # wrong: never kept
        episode("d", "x\n", turns=2, first_turn_passed=False),        # 2nd-turn pass
        episode("e", "x\n", reward=None),                             # excluded (infra)
    ])
    assert new == 2 and len(buf) == 2
    buf.add([episode("f", "-x\n"), episode("g", "x * x\n")])          # capacity 3: FIFO
    assert len(buf) == 3
    assert {t.task_id for t in buf.sample(10, step=0)} == {"b", "f", "g"}
    assert [t.task_id for t in buf.sample(2, step=5)] == \
        [t.task_id for t in buf.sample(2, step=5)]                    # same step, same draw
    assert len(buf.sample(2, step=5)) == 2


def test_replay_raises_a_verified_answer_without_any_group_signal():
    model = tiny()
    good = "x + 1\n"
    before = seq_logp(model, good)
    # this step's group is all right: every advantage 0, no policy-gradient signal
    trajs = [trajectory(model, "x * 2\n", 1.0, i) for i in range(2)]
    adv, valid = torch.zeros(2), torch.ones(2, dtype=torch.bool)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    off = policy_step(model, opt, trajs, adv, valid, GRPOConfig(micro_batch=2))
    assert off.trained_on == 0 and off.replayed == 0
    assert seq_logp(model, good) == pytest.approx(before)            # nothing moved
    g = GRPOConfig(micro_batch=2, replay=4, replay_coef=0.5)
    replay = [trajectory(model, good, 1.0, 9)]
    on = policy_step(model, opt, trajs, adv, valid, g, replay=replay)
    assert on.replayed == 1 and not on.skipped and on.replay_nll > 0
    assert seq_logp(model, good) > before + 0.05
    # a coefficient of 0 turns the term off
    still = seq_logp(model, good)
    zero = policy_step(model, opt, trajs, adv, valid,
                       GRPOConfig(micro_batch=2, replay=4, replay_coef=0.0), replay=replay)
    assert zero.replayed == 0 and seq_logp(model, good) == pytest.approx(still)


def test_replay_config_errors_name_the_field():
    with pytest.raises(UsageError, match=r"\[grpo\] replay must be >= 0"):
        config_from_dict({"grpo": {"replay": -1}})
    with pytest.raises(UsageError, match=r"\[grpo\] replay only applies to algorithm = "
                                         r"'grpo'"):
        config_from_dict({"grpo": {"algorithm": "ppo", "group_size": 1, "replay": 8}})
    assert config_from_dict({"grpo": {"replay": 8}}).grpo.replay == 8
