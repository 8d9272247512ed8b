"""The training configuration's torch-free parts: the enums and the model and SFT
sections that `train/config.py` reads from TOML.

They live apart from `losses.py`, `model.py` and `sft.py` (which re-export them) so that
reading and checking a config imports neither torch nor transformers: a bad
`trialbox train` config is refused in well under a second, not after ~10 s of imports.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from trialbox.errors import UsageError


class Advantage(enum.Enum):
    """How group rewards become advantages (one scalar per sample)."""

    GRPO = "grpo"
    """(r - mean(group)) / (std(group) + eps): DeepSeekMath's group normalisation."""
    DR_GRPO = "dr_grpo"
    """r - mean(group): Dr. GRPO drops the std division (it up-weights groups that are
    nearly all right or all wrong, a difficulty bias)."""


class Aggregation(enum.Enum):
    """How per-token losses become one number."""

    TOKEN_MEAN = "token_mean"
    """Sum over every masked token of the batch / number of masked tokens."""
    SEQ_MEAN = "seq_mean"
    """Mean over sequences of each sequence's token mean (GRPO's original form: a long
    answer's tokens each weigh less)."""
    SEQ_SUM = "seq_sum"
    """Sum over masked tokens / (B * max_tokens), a constant: Dr. GRPO's unbiased form
    (no length normalisation)."""



@dataclass(frozen=True)
class ModelConfig:
    """Shape of the tiny policy (GPT-2 blocks: learned positions, pre-LayerNorm)."""

    n_layer: int = 3
    """Transformer blocks."""
    n_embd: int = 128
    """Width of the residual stream."""
    n_head: int = 4
    """Attention heads (must divide n_embd)."""
    n_positions: int = 256
    """Longest sequence (prompt + every turn + feedback), in bytes."""
    dropout: float = 0.0
    """Dropout everywhere; 0 keeps generation log-probs equal to training log-probs."""

    def __post_init__(self) -> None:
        for name in ("n_layer", "n_embd", "n_head", "n_positions"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise UsageError(f"model.{name} must be a positive integer, got {value!r}")
        if self.n_embd % self.n_head:
            raise UsageError(f"model.n_head={self.n_head} must divide model.n_embd="
                             f"{self.n_embd}; change one of them")
        if not 0.0 <= self.dropout < 1.0:
            raise UsageError(f"model.dropout must be in [0, 1), got {self.dropout!r}")


@dataclass(frozen=True)
class SFTConfig:
    """The supervised phase."""

    steps: int = 300
    """Optimizer steps."""
    batch_size: int = 32
    """Pairs per step."""
    lr: float = 2e-3
    """Peak learning rate (linear warm-up over `warmup` steps, then cosine to 10%)."""
    warmup: int = 20
    """Warm-up steps."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    seed: int = 0
    """Order of the pairs."""
    teacher_error: float = 0.0
    """The demo's data: the share of tasks of a buggy template that the unverified
    teacher answers with its bug (`demo_tasks.TEACHER_BUGS`); 0 = a perfect teacher."""
    retry_share: float = 0.25
    """The demo's data: the share of pairs that are second turns (a wrong answer, the
    feedback marker, then the teacher's answer)."""

    def __post_init__(self) -> None:
        if self.steps < 0 or self.batch_size < 1 or self.warmup < 0:
            raise UsageError("[sft] steps must be >= 0, batch_size >= 1, warmup >= 0")
        if not self.lr > 0:
            raise UsageError(f"[sft] lr must be > 0, got {self.lr!r}")
        for name in ("teacher_error", "retry_share"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise UsageError(f"[sft] {name} must be in [0, 1], got "
                                 f"{getattr(self, name)!r}")
