"""PPO's update: a value head over the policy's last hidden states, GAE advantages
over the loss mask, the clipped surrogate plus the clipped value loss. The trainer runs
`ppo_step` in place of the group advantages + `update.policy_step` when
`[grpo] algorithm = "ppo"` (docs/training.md, "PPO"); both drive their micro-batches
through `update.micro_batch_epochs` and differ only in the loss of one micro-batch."""

from __future__ import annotations

from typing import Any

import torch

from trialbox.train.config import GRPOConfig
from trialbox.train.losses import (
    aggregate,
    aggregate_weight,
    clipped_pg_loss,
    clipped_value_loss,
    gae,
    masked_whiten,
)
from trialbox.train.update import (
    MicroLoss,
    UpdateStats,
    batch_of,
    clip_fraction,
    kl_term,
    mean_of,
    micro_batch_epochs,
)
from trialbox.types import Trajectory

VALUE_HEAD_FILE = "value_head.pt"


class ValueHead(torch.nn.Module):
    """PPO's critic: one linear map from the policy's last hidden state to a scalar.

    It shares the policy's trunk (one forward gives log-probs and values; the value
    loss also shapes the trunk, weighted by `value_coef`) rather than being a separate
    model: the demo's policy is a few million parameters and a second copy would
    double the update's cost. Zero-initialised, so every value starts at 0 (the
    demo's rewards are in [0, 1])."""

    def __init__(self, n_embd: int):
        super().__init__()
        self.linear = torch.nn.Linear(n_embd, 1)
        torch.nn.init.zeros_(self.linear.weight)
        torch.nn.init.zeros_(self.linear.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        values: torch.Tensor = self.linear(hidden.float()).squeeze(-1)
        return values


def logprobs_and_values(model: Any, head: ValueHead, ids: torch.Tensor,
                        attn: torch.Tensor, temperature: float = 1.0) -> \
        tuple[torch.Tensor, torch.Tensor]:
    """`token_logprobs` and, aligned with it, V (B, T): column t is the value of the
    state before token t (the hidden state at t - 1, which also predicts token t);
    column 0 = 0."""
    out = model(input_ids=ids, attention_mask=attn, output_hidden_states=True)
    logits = out.logits[:, :-1].float()
    if temperature > 0:
        logits = logits / temperature
    logp = torch.log_softmax(logits, dim=-1).gather(2, ids[:, 1:, None]).squeeze(2)
    values = head(out.hidden_states[-1][:, :-1])                               # (B, T-1)
    pad = torch.nn.functional.pad
    return pad(logp, (1, 0)), pad(values, (1, 0))


def terminal_rewards(trajs: list[Trajectory], mask: torch.Tensor) -> torch.Tensor:
    """(B, T): each trajectory's reward on its last model token, 0 elsewhere (and all 0
    for a trajectory without a model token)."""
    rewards = torch.zeros_like(mask, dtype=torch.float)
    for i, t in enumerate(trajs):
        on = mask[i].nonzero()
        if len(on) and t.reward is not None:
            rewards[i, int(on[-1])] = float(t.reward)
    return rewards


def ppo_step(model: Any, head: ValueHead, opt: torch.optim.Optimizer,
             trajs: list[Trajectory], valid: torch.Tensor, g: GRPOConfig, *,
             ref: Any = None, temperature: float = 1.0, max_tokens: int | None = None,
             pad_id: int = 0, device: torch.device | None = None) -> UpdateStats:
    """`g.epochs` PPO optimizer steps on one round's trajectories through
    `micro_batch_epochs` (micro-batch accumulation, the NaN guard), like `policy_step`:

    1. old values V_old for every token, no grad, before any update;
    2. per-token rewards: the episode's reward on its last model token;
    3. advantages and returns by GAE over the loss mask (feedback tokens skipped),
       advantages whitened over the masked tokens of the round;
    4. loss = clipped surrogate + `g.value_coef` x clipped value loss, aggregated as
       `g.aggregation`.

    `valid` (B,): samples whose reward is None are excluded (not trained on)."""
    device = device or torch.device("cpu")
    stats = UpdateStats()
    keep = [i for i in range(len(trajs)) if valid[i]]
    stats.trained_on = len(keep)
    if not keep:
        return stats
    kept = [trajs[i] for i in keep]
    full = batch_of(kept, pad_id, device)
    spans = [(lo, min(lo + g.micro_batch, len(kept)))
             for lo in range(0, len(kept), g.micro_batch)]

    def rows(name: str, lo: int, hi: int) -> torch.Tensor:
        width = int(full["attn"][lo:hi].sum(dim=1).max())  # trim the shared padding
        return full[name][lo:hi, :width]

    # 1-3: values, GAE and whitening, once for the round (the old policy's view)
    model.train(False)
    values_old = torch.zeros_like(full["mask"])
    with torch.no_grad():
        for lo, hi in spans:
            ids = rows("ids", lo, hi)
            _, v = logprobs_and_values(model, head, ids, rows("attn", lo, hi), temperature)
            values_old[lo:hi, :ids.shape[1]] = v
    values_old = values_old * full["mask"]
    adv, returns = gae(terminal_rewards(kept, full["mask"]), values_old, full["mask"],
                       g.gamma, g.lam)
    adv = masked_whiten(adv, full["mask"])

    model.train()

    def micro(span: tuple[int, int]) -> MicroLoss:
        lo, hi = span
        ids, attn, mask = rows("ids", lo, hi), rows("attn", lo, hi), rows("mask", lo, hi)
        width = ids.shape[1]
        logp_old = rows("logp_old", lo, hi)
        logp, v = logprobs_and_values(model, head, ids, attn, temperature)      # (b, T)
        pg = clipped_pg_loss(logp, logp_old, adv[lo:hi, :width], g.clip_eps_low,
                             g.clip_eps_high)
        vl = clipped_value_loss(v, values_old[lo:hi, :width], returns[lo:hi, :width],
                                g.value_clip)
        per_tok = pg + g.value_coef * vl
        logs = {"clip_frac": clip_fraction(logp, logp_old, mask, g),
                "value_loss": float(aggregate(vl.detach(), mask, g.aggregation,
                                              max_tokens=max_tokens))}
        kl = kl_term(logp, ref, ids, attn, mask, g, temperature, logs)
        if kl is not None:
            per_tok = per_tok + kl
        return MicroLoss(aggregate(per_tok, mask, g.aggregation, max_tokens=max_tokens),
                         aggregate_weight(mask, full["mask"], g.aggregation), logs)

    params = list(model.parameters()) + list(head.parameters())
    logs = micro_batch_epochs(opt, params, g, spans, micro, stats)
    if logs is None:
        return stats
    stats.loss = mean_of(logs, "loss")
    stats.value_loss = mean_of(logs, "value_loss")
    stats.kl = mean_of(logs, "kl")
    stats.clip_frac = mean_of(logs, "clip_frac")
    return stats
