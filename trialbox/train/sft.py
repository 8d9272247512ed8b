"""A short supervised warm start: teacher forcing on (prompt, completion) pairs, the loss
on the completion's tokens only (and the end-of-sequence token that closes it).

    pairs = [(t.prompt, solution_of(t)) for t in make_tasks(Split.TRAIN, 2000, seed)]
    stats = sft(model, tok, pairs, SFTConfig(steps=300))

Why a warm start at all: a randomly initialised model never writes a passing program,
so every GRPO group would have all-zero rewards and no gradient. The phase is kept
short on purpose (the demo measures what GRPO adds on top of it).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from trialbox.errors import UsageError
from trialbox.rollout.policy import ByteTokenizer
from trialbox.train.settings import SFTConfig


@dataclass
class SFTStats:
    steps: int = 0
    final_loss: float = math.nan
    seconds: float = 0.0


def batch_tensors(tok: ByteTokenizer, pairs: Sequence[tuple[str, str]],
                  device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded (ids, attention mask, loss mask), each (B, T); the loss mask marks
    the completion's tokens and the closing eos."""
    rows = []
    for prompt, completion in pairs:
        p = tok.encode(prompt)
        c = tok.encode(completion) + ([tok.eos_id] if tok.eos_id is not None else [])
        rows.append((p + c, [0] * len(p) + [1] * len(c)))
    width = max(len(ids) for ids, _ in rows)
    ids = torch.full((len(rows), width), tok.pad_id, dtype=torch.long)
    attn = torch.zeros((len(rows), width), dtype=torch.long)
    loss_mask = torch.zeros((len(rows), width), dtype=torch.float)
    for i, (r, m) in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(r)
        attn[i, :len(r)] = 1
        loss_mask[i, :len(m)] = torch.tensor(m, dtype=torch.float)
    return ids.to(device), attn.to(device), loss_mask.to(device)


def completion_nll(model: torch.nn.Module, ids: torch.Tensor, attn: torch.Tensor,
                   loss_mask: torch.Tensor) -> torch.Tensor:
    """Mean negative log-likelihood of the masked tokens (a scalar)."""
    logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1]   # (B, T-1, V)
    target = ids[:, 1:]                                                   # (B, T-1)
    mask = loss_mask[:, 1:]
    nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), target,
                                            reduction="none")             # (B, T-1)
    return (nll * mask).sum() / mask.sum().clamp(min=1)


def lr_at(step: int, steps: int, warmup: int) -> float:
    """Multiplier of the peak learning rate: linear warm-up, cosine decay to 0.1."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))


def sft(model: torch.nn.Module, tok: ByteTokenizer, pairs: Sequence[tuple[str, str]],
        config: SFTConfig, *, device: torch.device | None = None,
        progress: Callable[[int, float], None] | None = None) -> SFTStats:
    """Train `model` in place on `pairs` for `config.steps` steps."""
    if not pairs:
        raise UsageError("sft needs at least one (prompt, completion) pair")
    device = device or torch.device("cpu")
    model.to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=config.lr,
                            weight_decay=config.weight_decay)
    rng = random.Random(config.seed)
    order: list[int] = []
    stats = SFTStats()
    t0 = time.monotonic()
    for step in range(config.steps):
        batch = []
        for _ in range(config.batch_size):
            if not order:
                order = list(range(len(pairs)))
                rng.shuffle(order)
            batch.append(pairs[order.pop()])
        for group in opt.param_groups:
            group["lr"] = config.lr * lr_at(step, config.steps, config.warmup)
        loss = completion_nll(model, *batch_tensors(tok, batch, device))
        opt.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        stats.steps = step + 1
        stats.final_loss = float(loss.detach())
        if progress is not None:
            progress(step + 1, stats.final_loss)
    stats.seconds = time.monotonic() - t0
    model.eval()
    return stats
