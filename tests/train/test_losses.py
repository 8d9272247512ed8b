"""Each estimator and loss against values computed by hand (in the comments)."""

import math

import pytest
import torch

from trialbox.errors import UsageError
from trialbox.train.losses import (
    Advantage,
    Aggregation,
    aggregate,
    aggregate_weight,
    clipped_pg_loss,
    clipped_value_loss,
    gae,
    group_advantages,
    is_finite,
    kl_k3,
    rewards_tensor,
)


def close(t, values, tol=1e-4):
    assert torch.allclose(t, torch.tensor(values, dtype=t.dtype), atol=tol), t


def test_rewards_tensor_marks_none_as_excluded():
    values, valid = rewards_tensor([1.0, None, 0.0, 0.5])
    close(values, [1.0, 0.0, 0.0, 0.5])
    assert valid.tolist() == [True, False, True, True]


def test_grpo_advantages_normalise_within_each_group():
    r = torch.tensor([[1., 0., 0., 1.], [1., 1., 1., 0.]])
    adv = group_advantages(r, torch.ones_like(r, dtype=torch.bool), Advantage.GRPO)
    # group 0: mean .5, centred ±.5, unbiased var = 4*.25/3 = 1/3, std .57735 -> ±.86603
    # group 1: mean .75, centred (.25,.25,.25,-.75), var = (3*.0625+.5625)/3 = .25, std .5
    close(adv, [[.86603, -.86603, -.86603, .86603], [.5, .5, .5, -1.5]])


def test_excluded_samples_take_no_part_and_get_zero():
    r = torch.tensor([[1., 0., 123., 0.]])        # the 123 is an excluded sample's slot
    valid = torch.tensor([[True, True, False, True]])
    adv = group_advantages(r, valid, Advantage.GRPO)
    # valid: (1, 0, 0): mean 1/3; centred (2/3, -1/3, -1/3); var = (4/9+1/9+1/9)/2 = 1/3
    close(adv, [[1.15470, -.57735, 0.0, -.57735]])


def test_dr_grpo_is_centred_only():
    r = torch.tensor([[1., 0., 0., 0.]])
    adv = group_advantages(r, torch.ones_like(r, dtype=torch.bool), Advantage.DR_GRPO)
    close(adv, [[.75, -.25, -.25, -.25]])


def test_degenerate_groups_have_no_signal():
    r = torch.tensor([[1., 1., 1.], [1., 0., 0.]])
    valid = torch.tensor([[True, True, True], [True, False, False]])
    for kind in Advantage:
        adv = group_advantages(r, valid, kind)
        close(adv, [[0., 0., 0.], [0., 0., 0.]])  # all equal; one valid sample
        assert is_finite(adv)


def test_group_shapes_are_checked():
    with pytest.raises(UsageError, match=r"\(G, K\)"):
        group_advantages(torch.zeros(4), torch.ones(4, dtype=torch.bool), Advantage.GRPO)


def test_clipped_surrogate_by_hand():
    old = torch.full((1, 4), math.log(0.5))
    new = torch.log(torch.tensor([[0.75, 0.75, 0.25, 0.25]]))   # ratios 1.5, 1.5, .5, .5
    adv = torch.tensor([[1.0, -1.0, 1.0, -1.0]])
    loss = clipped_pg_loss(new, old, adv, eps_low=0.2, eps_high=0.2)
    # A>0, r=1.5: max(-1.5, -1.2) = -1.2 (clipped: no more push up)
    # A<0, r=1.5: max(1.5, 1.2) = 1.5 (a worse ratio is never clipped away)
    # A>0, r=.5: max(-.5, -.8) = -.5;  A<0, r=.5: max(.5, .8) = .8 (clipped)
    close(loss, [[-1.2, 1.5, -0.5, 0.8]])


def test_clipped_tokens_get_no_gradient():
    old = torch.full((1, 2), math.log(0.5))
    new = torch.log(torch.tensor([[0.75, 0.55]])).requires_grad_()   # r = 1.5 and 1.1
    clipped_pg_loss(new, old, torch.ones(1, 1), 0.2, 0.2).sum().backward()
    assert new.grad[0, 0] == 0.0                           # outside the clip: no gradient
    assert new.grad[0, 1] == pytest.approx(-1.1, abs=1e-5)   # d(-A r)/dlogp = -A r


def test_asymmetric_clip_uses_the_high_bound_above_one():
    old = torch.zeros(1, 1)
    new = torch.log(torch.tensor([[1.25]]))
    close(clipped_pg_loss(new, old, torch.ones(1, 1), 0.2, 0.28), [[-1.25]])  # inside .28
    close(clipped_pg_loss(new, old, torch.ones(1, 1), 0.2, 0.2), [[-1.2]])


def test_k3_kl_by_hand():
    logp = torch.log(torch.tensor([0.5, 0.5]))
    ref = torch.log(torch.tensor([0.25, 0.5]))
    # d = log(.25/.5) = -ln 2: exp(d) - d - 1 = .5 + .693147 - 1 = .193147; equal -> 0
    close(kl_k3(logp, ref), [0.193147, 0.0])


PER_TOKEN = torch.tensor([[1., 2., 3., 4.], [5., 6., 7., 8.]])
MASK = torch.tensor([[0., 1., 1., 1.], [1., 0., 0., 0.]])


def test_aggregations_by_hand():
    # masked tokens: (2, 3, 4) and (5)
    assert float(aggregate(PER_TOKEN, MASK, Aggregation.TOKEN_MEAN)) == pytest.approx(3.5)
    assert float(aggregate(PER_TOKEN, MASK, Aggregation.SEQ_MEAN)) == pytest.approx(4.0)
    assert float(aggregate(PER_TOKEN, MASK, Aggregation.SEQ_SUM)) == pytest.approx(14 / 8)
    assert float(aggregate(PER_TOKEN, MASK, Aggregation.SEQ_SUM, max_tokens=7)) == \
        pytest.approx(14 / 14)


@pytest.mark.parametrize("how", list(Aggregation))
def test_micro_batch_weights_reproduce_the_whole_batch(how):
    torch.manual_seed(0)
    x = torch.randn(6, 5)
    mask = (torch.rand(6, 5) > 0.4).float()
    whole = aggregate(x, mask, how, max_tokens=5)
    parts = sum(aggregate(x[i:i + 2], mask[i:i + 2], how, max_tokens=5)
                * aggregate_weight(mask[i:i + 2], mask, how) for i in (0, 2, 4))
    assert float(parts) == pytest.approx(float(whole), abs=1e-6)


def test_gae_skips_unmasked_tokens_between_turns():
    # mask: prompt, turn-1 tokens (1, 2), a feedback token (3), turn-2 token (4)
    mask = torch.tensor([[0., 1., 1., 0., 1.]])
    values = torch.tensor([[0., .5, .6, 9., .8]])      # the 9 is never used
    rewards = torch.tensor([[0., 0., 0., 0., 1.]])
    adv, ret = gae(rewards, values, mask, gamma=1.0, lam=1.0)
    # t4: 1 + 0 - .8 = .2;  t2: 0 + .8 - .6 = .2 -> .4;  t1: .6 - .5 = .1 -> .5
    close(adv, [[0., .5, .4, 0., .2]])
    close(ret, [[0., 1., 1., 0., 1.]])
    adv, _ = gae(rewards, values, mask, gamma=0.9, lam=0.5)
    # t4: .2;  t2: .9*.8 - .6 = .12 -> .12 + .45*.2 = .21;  t1: .9*.6 - .5 = .04 -> .1345
    close(adv, [[0., .1345, .21, 0., .2]])


def test_gae_rows_are_independent_and_shapes_checked():
    mask = torch.tensor([[1., 1.], [1., 0.]])
    adv, _ = gae(torch.tensor([[0., 1.], [2., 0.]]), torch.zeros(2, 2), mask, 1.0, 1.0)
    close(adv, [[1., 1.], [2., 0.]])
    with pytest.raises(UsageError):
        gae(torch.zeros(2, 3), torch.zeros(2, 2), mask, 1.0, 1.0)
    with pytest.raises(UsageError, match="gamma"):
        gae(torch.zeros(2, 2), torch.zeros(2, 2), mask, 1.5, 1.0)


def test_clipped_value_loss_by_hand():
    # v = 1.0 moved from .5 (clip .2 -> .7); R = 1.2: max(.04, .25) / 2 = .125
    close(clipped_value_loss(torch.tensor([1.0]), torch.tensor([.5]), torch.tensor([1.2]),
                             0.2), [.125])
    # v moved the right way within the clip: plain squared error (1.0 - 1.2)^2 / 2
    close(clipped_value_loss(torch.tensor([1.0]), torch.tensor([.9]), torch.tensor([1.2]),
                             0.2), [.02])


def test_is_finite():
    assert is_finite(torch.tensor([1.0, 2.0]))
    assert not is_finite(torch.tensor([1.0, float("nan")]))
    assert not is_finite(torch.tensor(float("inf")))
