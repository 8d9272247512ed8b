"""One policy-gradient update on a round's trajectories: the right-padded batch, the
log-probs of the tokens under the current weights, the clipped surrogate (+ KL), and
`micro_batch_epochs`, the one driver of every update: epochs of gradient accumulation
over micro-batches, the NaN guard, clipping and the optimizer step. GRPO's update
(`policy_step`) and PPO's (`ppo.ppo_step`) differ only in the loss of one micro-batch.

The importance ratio is exp(logp - logp_old) with `logp_old` the log-probs the
trajectory recorded when its tokens were sampled (`Trajectory.old_logprobs`), never a
fresh recompute: on-policy the ratio is 1 in the first epoch; with stale batches (the
trainer's async mode, `pipeline.py`) it is the off-policy correction and the clip bounds
how far a stale sample can push the weights.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from trialbox.train.config import GRPOConfig
from trialbox.train.losses import aggregate, aggregate_weight, clipped_pg_loss, is_finite, kl_k3
from trialbox.types import Trajectory


def token_logprobs(model: torch.nn.Module, ids: torch.Tensor, attn: torch.Tensor,
                   temperature: float = 1.0) -> torch.Tensor:
    """log p(ids[:, t] | ids[:, :t]) for t >= 1, (B, T) with column 0 = 0. Right-padded
    rows, so positions are the default 0..T-1 (the same as an unpadded sequence)."""
    logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()  # (B, T-1, V)
    if temperature > 0:
        logits = logits / temperature
    logp = torch.log_softmax(logits, dim=-1).gather(2, ids[:, 1:, None]).squeeze(2)
    return torch.nn.functional.pad(logp, (1, 0))                                # (B, T)


def batch_of(trajs: list[Trajectory], pad_id: int,
             device: torch.device) -> dict[str, torch.Tensor]:
    """Right-padded (B, T) tensors of the trajectories' ids, attention, loss mask and
    sampled log-probs."""
    width = max(len(t.token_ids) for t in trajs)
    B = len(trajs)
    ids = torch.full((B, width), pad_id, dtype=torch.long)
    attn = torch.zeros((B, width), dtype=torch.long)
    mask = torch.zeros((B, width))
    logp_old = torch.zeros((B, width))
    for i, t in enumerate(trajs):
        n = len(t.token_ids)
        ids[i, :n] = torch.tensor(t.token_ids)
        attn[i, :n] = 1
        mask[i, :n] = torch.tensor(t.loss_mask, dtype=torch.float)
        logp_old[i, :n] = torch.tensor(t.old_logprobs)
    return {"ids": ids.to(device), "attn": attn.to(device), "mask": mask.to(device),
            "logp_old": logp_old.to(device)}



@dataclass
class UpdateStats:
    trained_on: int = 0
    """Trajectories with a reward and a non-zero advantage (the others carry no signal)."""
    loss: float = 0.0
    kl: float = 0.0
    clip_frac: float = 0.0
    """Share of model tokens whose ratio left the clip range (0 with epochs = 1)."""
    grad_norm: float = 0.0
    skipped: bool = False
    """The loss was not finite: no parameter was changed."""
    value_loss: float = 0.0
    """PPO: the clipped value loss (aggregated like the policy loss); 0 for GRPO."""
    replayed: int = 0
    """Judge-passed answers of earlier steps imitated in this update (`replay.py`)."""
    replay_nll: float = 0.0
    """Their mean negative log-likelihood per output token, before the update."""


def clip_fraction(logp: torch.Tensor, logp_old: torch.Tensor, mask: torch.Tensor,
                   g: GRPOConfig) -> float:
    """Share of the masked tokens whose ratio is outside the clip range."""
    ratio = torch.exp(logp.detach() - logp_old)
    out = (ratio < 1 - g.clip_eps_low) | (ratio > 1 + g.clip_eps_high)
    return float((out.float() * mask).sum() / mask.sum().clamp(min=1))


def clip_and_step(opt: torch.optim.Optimizer, params: Any, g: GRPOConfig,
                   stats: UpdateStats) -> bool:
    """Clip the accumulated gradients and apply them; a non-finite norm drops them,
    marks the update skipped and returns False (nothing is applied)."""
    norm = torch.nn.utils.clip_grad_norm_(params, g.max_grad_norm)
    if not is_finite(norm):
        opt.zero_grad(set_to_none=True)
        stats.skipped = True
        return False
    stats.grad_norm = float(norm)
    opt.step()
    return True


@dataclass
class MicroLoss:
    """One micro-batch's contribution to an update."""

    loss: torch.Tensor
    """The micro-batch's loss, aggregated over its own tokens (a scalar)."""
    weight: torch.Tensor | float
    """Its share of the round (`losses.aggregate_weight`): the accumulated gradient then
    equals the whole round's in one batch."""
    logs: dict[str, float] = field(default_factory=dict)
    """Figures averaged over the micro-batches into UpdateStats (kl, clip_frac, …)."""


Part = TypeVar("Part")


def micro_batch_epochs(opt: torch.optim.Optimizer, params: Sequence[torch.nn.Parameter],
                       g: GRPOConfig, parts: Sequence[Part],
                       micro: Callable[[Part], MicroLoss], stats: UpdateStats, *,
                       before_epoch: Callable[[], bool] | None = None) -> \
        dict[str, list[float]] | None:
    """`g.epochs` optimizer steps, each accumulating `micro(part)`'s weighted loss over
    every part; clipped to `g.max_grad_norm`. `before_epoch` adds gradients of its own
    first (replay) and returns False when they are not finite. A non-finite loss or
    gradient norm drops the epoch's gradients, sets `stats.skipped` and returns None
    (that epoch and any later one apply nothing). Returns each log's values, one per
    micro-batch and epoch ("loss" included)."""
    logs: dict[str, list[float]] = {"loss": []}
    for _ in range(g.epochs):
        opt.zero_grad(set_to_none=True)
        if before_epoch is not None and not before_epoch():
            opt.zero_grad(set_to_none=True)
            stats.skipped = True
            return None
        for part in parts:
            m = micro(part)
            if not is_finite(m.loss):
                opt.zero_grad(set_to_none=True)  # skipped: nothing is applied
                stats.skipped = True
                return None
            (m.loss * m.weight).backward()  # type: ignore[no-untyped-call]
            logs["loss"].append(float(m.loss.detach()))
            for key, value in m.logs.items():
                logs.setdefault(key, []).append(value)
        if not clip_and_step(opt, params, g, stats):
            return None
    return logs


def mean_of(logs: dict[str, list[float]], key: str) -> float:
    values = logs.get(key, [])
    return sum(values) / len(values) if values else 0.0


def kl_term(model_logp: torch.Tensor, ref: Any, ids: torch.Tensor, attn: torch.Tensor,
            mask: torch.Tensor, g: GRPOConfig, temperature: float,
            logs: dict[str, float]) -> torch.Tensor | None:
    """`g.kl_coef` x the k3 KL to the frozen `ref` per token (b, T), its aggregate in
    `logs["kl"]`; None without a reference."""
    if ref is None or g.kl_coef <= 0:
        return None
    with torch.no_grad():
        logp_ref = token_logprobs(ref, ids, attn, temperature)
    kl = kl_k3(model_logp, logp_ref)                                            # (b, T)
    logs["kl"] = float(aggregate(kl.detach(), mask, g.aggregation))
    return g.kl_coef * kl


def policy_step(model: Any, opt: torch.optim.Optimizer, trajs: list[Trajectory],
                adv: torch.Tensor, valid: torch.Tensor, g: GRPOConfig, *,
                ref: Any = None, temperature: float = 1.0, max_tokens: int | None = None,
                pad_id: int = 0, device: torch.device | None = None,
                replay: list[Trajectory] | None = None) -> UpdateStats:
    """GRPO's update: `g.epochs` optimizer steps on one round's trajectories with the
    clipped surrogate (plus `g.kl_coef` x k3 KL to `ref`), aggregated as
    `g.aggregation`, through `micro_batch_epochs` (so the result equals one big batch;
    a non-finite loss skips the step).
    `adv` (B,), `valid` (B,): excluded samples (reward None) are not trained on.
    `replay`: judge-passed answers of earlier steps; `g.replay_coef` x their mean NLL
    per output token is added to the loss (self-imitation, `replay.py`)."""
    device = device or torch.device("cpu")
    stats = UpdateStats()
    keep = [i for i in range(len(trajs)) if valid[i] and adv[i] != 0]
    stats.trained_on = len(keep)
    replay = replay if replay and g.replay_coef > 0 else []
    stats.replayed = len(replay)
    if not keep and not replay:
        return stats
    model.train()
    full_mask = batch_of([trajs[i] for i in keep], pad_id, device)["mask"] if keep \
        else torch.zeros(0)
    nlls: list[float] = []

    def micro(part: list[int]) -> MicroLoss:
        mb = batch_of([trajs[i] for i in part], pad_id, device)
        a = adv[part].to(device)[:, None]                                       # (b, 1)
        logp = token_logprobs(model, mb["ids"], mb["attn"], temperature)        # (b, T)
        per_tok = clipped_pg_loss(logp, mb["logp_old"], a, g.clip_eps_low,
                                  g.clip_eps_high)                              # (b, T)
        logs = {"clip_frac": clip_fraction(logp, mb["logp_old"], mb["mask"], g)}
        kl = kl_term(logp, ref, mb["ids"], mb["attn"], mb["mask"], g, temperature, logs)
        if kl is not None:
            per_tok = per_tok + kl
        return MicroLoss(aggregate(per_tok, mb["mask"], g.aggregation, max_tokens=max_tokens),
                         aggregate_weight(mb["mask"], full_mask, g.aggregation), logs)

    parts = [keep[lo:lo + g.micro_batch] for lo in range(0, len(keep), g.micro_batch)]
    logs = micro_batch_epochs(
        opt, list(model.parameters()), g, parts, micro, stats,
        before_epoch=(lambda: imitate(model, replay, g, nlls, temperature=temperature,
                                      pad_id=pad_id, device=device)) if replay else None)
    if logs is None:
        return stats
    stats.loss = mean_of(logs, "loss")
    stats.kl = mean_of(logs, "kl")
    stats.clip_frac = mean_of(logs, "clip_frac")
    stats.replay_nll = nlls[0] if nlls else 0.0
    return stats


def imitate(model: Any, replay: list[Trajectory], g: GRPOConfig, nlls: list[float], *,
            temperature: float, pad_id: int, device: torch.device) -> bool:
    """Accumulate the gradient of `g.replay_coef` x the mean NLL per output token of the
    replayed answers (micro-batched; each part weighted by its share of the tokens).
    Appends the mean NLL to `nlls`; False (gradients dropped) when it is not finite."""
    total = float(sum(sum(t.loss_mask) for t in replay))
    nll_sum = 0.0
    for lo in range(0, len(replay), g.micro_batch):
        mb = batch_of(replay[lo:lo + g.micro_batch], pad_id, device)
        logp = token_logprobs(model, mb["ids"], mb["attn"], temperature)
        part = -(logp * mb["mask"]).sum()
        if not is_finite(part):
            return False
        (g.replay_coef * part / max(1.0, total)).backward()  # type: ignore[no-untyped-call]
        nll_sum += float(part.detach())
    nlls.append(nll_sum / max(1.0, total))
    return True

