"""Advantage estimators and policy-gradient losses: small pure functions on tensors.

Shapes: B sequences, T tokens; G groups of K samples (GRPO). `mask` (B, T) is 1 on the
tokens the model generated (the loss mask of a `Trajectory`), 0 on prompt, feedback and
padding. `valid` marks samples with a reward; a sample whose reward is None (an
infrastructure failure) is *excluded*: it gets no advantage, takes no part in its
group's statistics, and is counted, never scored 0.0.

Variants are chosen once, by enum, when the trainer is built (`Advantage`,
`Aggregation`), never by strings in the hot loop.

    adv = group_advantages(rewards, valid, Advantage.GRPO)          # (G, K)
    tok_loss = clipped_pg_loss(logp, logp_old, adv.view(-1, 1), eps_low, eps_high)
    loss = aggregate(tok_loss + beta * kl_k3(logp, logp_ref), mask, Aggregation.TOKEN_MEAN)
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from trialbox.errors import UsageError
from trialbox.train.settings import Advantage, Aggregation


def rewards_tensor(rewards: Sequence[float | None]) -> tuple[Tensor, Tensor]:
    """(values, valid) from rewards where None means excluded; values are 0 there.

    >>> rewards_tensor([1.0, None, 0.0])
    (tensor([1., 0., 0.]), tensor([ True, False,  True]))
    """
    valid = torch.tensor([r is not None for r in rewards], dtype=torch.bool)
    values = torch.tensor([0.0 if r is None else float(r) for r in rewards])
    return values, valid


def group_advantages(rewards: Tensor, valid: Tensor, kind: Advantage,
                     eps: float = 1e-6) -> Tensor:
    """Advantages (G, K) from rewards (G, K) of G groups of K samples.

    Only `valid` samples enter a group's mean and std (std unbiased, as in TRL); an
    excluded sample's advantage is 0; a group with fewer than 2 valid samples has no
    baseline and gets 0 throughout.

    >>> group_advantages(torch.tensor([[1., 0., 0., 1.]]), torch.ones(1, 4, dtype=torch.bool),
    ...                  Advantage.DR_GRPO)
    tensor([[ 0.5000, -0.5000, -0.5000,  0.5000]])
    """
    if rewards.shape != valid.shape or rewards.dim() != 2:
        raise UsageError(f"group_advantages: rewards {tuple(rewards.shape)} and valid "
                         f"{tuple(valid.shape)} must both be (G, K)")
    w = valid.to(rewards.dtype)                                   # (G, K)
    n = w.sum(dim=1, keepdim=True)                                # (G, 1)
    mean = (rewards * w).sum(dim=1, keepdim=True) / n.clamp(min=1)
    centred = (rewards - mean) * w
    adv = centred
    if kind is Advantage.GRPO:
        var = (centred ** 2).sum(dim=1, keepdim=True) / (n - 1).clamp(min=1)
        adv = centred / (var.sqrt() + eps)
    return torch.where(n >= 2, adv, torch.zeros_like(adv))


def clipped_pg_loss(logp: Tensor, logp_old: Tensor, adv: Tensor, eps_low: float = 0.2,
                    eps_high: float = 0.2) -> Tensor:
    """PPO's clipped surrogate, per token (B, T): max(-A r, -A clip(r, 1-el, 1+eh)) with
    r = exp(logp - logp_old). `adv` is (B, 1) for GRPO (one advantage per sequence) or
    (B, T) for PPO. Where the clip is active the gradient is 0 (that is the point)."""
    ratio = torch.exp(logp - logp_old)                                    # (B, T)
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    return torch.maximum(unclipped, clipped)


def kl_k3(logp: Tensor, logp_ref: Tensor) -> Tensor:
    """Per-token estimate of KL(pi || pi_ref) from samples of pi (Schulman's k3):
    exp(ref - logp) - (ref - logp) - 1, always >= 0, unbiased."""
    d = logp_ref - logp
    return torch.exp(d) - d - 1.0


def aggregate(per_token: Tensor, mask: Tensor, how: Aggregation,
              max_tokens: int | None = None) -> Tensor:
    """One scalar from a (B, T) per-token loss over the masked tokens.

    `max_tokens` is SEQ_SUM's constant (default: T). A sequence with no masked token
    adds nothing to SEQ_MEAN's numerator but still counts in its denominator."""
    m = mask.to(per_token.dtype)
    total = (per_token * m).sum()
    if how is Aggregation.TOKEN_MEAN:
        return total / m.sum().clamp(min=1)
    if how is Aggregation.SEQ_MEAN:
        per_seq = (per_token * m).sum(dim=1) / m.sum(dim=1).clamp(min=1)  # (B,)
        return per_seq.mean()
    width = per_token.shape[1] if max_tokens is None else max_tokens
    return total / (per_token.shape[0] * width)


def aggregate_weight(mask_part: Tensor, mask_all: Tensor, how: Aggregation) -> float:
    """The weight of a micro-batch's `aggregate` in the whole batch's, for gradient
    accumulation: its share of masked tokens (TOKEN_MEAN) or of sequences (others)."""
    if how is Aggregation.TOKEN_MEAN:
        return float(mask_part.sum()) / max(1.0, float(mask_all.sum()))
    return mask_part.shape[0] / mask_all.shape[0]


# --------------------------------------------------------------------------- PPO

def gae(rewards: Tensor, values: Tensor, mask: Tensor, gamma: float,
        lam: float) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation over masked token sequences: (adv, returns),
    each (B, T), zero where `mask` is 0.

    Only masked positions are steps: feedback and prompt tokens between two turns are
    skipped (the value after a turn's last token bootstraps from the next turn's first
    token). After a sequence's last masked token the episode ends (next value 0).
    `rewards` (B, T) usually holds the episode's reward at its last model token (and a
    per-token KL penalty, if any)."""
    if not (rewards.shape == values.shape == mask.shape) or rewards.dim() != 2:
        raise UsageError("gae: rewards, values and mask must all be (B, T)")
    if not (0.0 <= gamma <= 1.0 and 0.0 <= lam <= 1.0):
        raise UsageError(f"gae: gamma and lam must be in [0, 1], got {gamma}, {lam}")
    B, T = rewards.shape
    m = mask.to(rewards.dtype)
    adv = torch.zeros_like(rewards)
    next_value = torch.zeros(B, dtype=rewards.dtype, device=rewards.device)
    next_adv = torch.zeros(B, dtype=rewards.dtype, device=rewards.device)
    for t in range(T - 1, -1, -1):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        a = delta + gamma * lam * next_adv
        on = m[:, t] > 0
        adv[:, t] = torch.where(on, a, torch.zeros_like(a))
        next_value = torch.where(on, values[:, t], next_value)
        next_adv = torch.where(on, a, next_adv)
    returns = (adv + values) * m
    return adv, returns


def clipped_value_loss(values: Tensor, values_old: Tensor, returns: Tensor,
                       clip: float) -> Tensor:
    """Per-token (B, T): 0.5 * max((v - R)^2, (v_old + clip(v - v_old, ±c) - R)^2)."""
    v_clipped = values_old + torch.clamp(values - values_old, -clip, clip)
    return 0.5 * torch.maximum((values - returns) ** 2, (v_clipped - returns) ** 2)


def masked_whiten(x: Tensor, mask: Tensor, eps: float = 1e-8) -> Tensor:
    """(x - mean) / std over the masked entries (PPO normalises GAE advantages so)."""
    m = mask.to(x.dtype)
    n = m.sum().clamp(min=1)
    mean = (x * m).sum() / n
    var = (((x - mean) * m) ** 2).sum() / n
    return (x - mean) * torch.rsqrt(var + eps) * m


def is_finite(x: Tensor) -> bool:
    """True when every entry is finite (a NaN/inf loss skips the step)."""
    return bool(torch.isfinite(x.detach()).all())
