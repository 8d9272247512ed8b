"""The tiny built-in model: a byte-level tokenizer and a small GPT-2-shaped causal
transformer built from a config with `transformers` (no downloads), saved and loaded
with `save_pretrained` to a local directory.

    tok = ByteTokenizer()
    model = build_model(ModelConfig(n_layer=3, n_embd=128), tok)
    save_model(model, tok, "runs/m")
    model, tok = load_model("runs/m")         # UsageError if the path is not a model

The tokenizer is the rollout layer's `ByteTokenizer` (bytes 0..255, eos 256, pad 257), so
the model's ids are exactly what the agent loop feeds it. Why bytes and not a learned
vocabulary: the demo's programs are short ASCII
expressions; a byte vocabulary is total (every string round-trips, nothing is unknown),
needs no training step, and keeps the embedding table tiny (258 rows).
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch
from transformers import GPT2Config, GPT2LMHeadModel

from trialbox.errors import UsageError
from trialbox.rollout.policy import ByteTokenizer
from trialbox.train.settings import ModelConfig

TOKENIZER_FILE = "trialbox_tokenizer.json"


def build_model(config: ModelConfig, tok: ByteTokenizer | None = None,
                seed: int | None = None) -> Any:
    """A freshly initialised model (deterministic when `seed` is given)."""
    tok = tok or ByteTokenizer()
    if seed is not None:
        torch.manual_seed(seed)
    hf = GPT2Config(vocab_size=tok.vocab_size, n_positions=config.n_positions,
                    n_embd=config.n_embd, n_layer=config.n_layer, n_head=config.n_head,
                    resid_pdrop=config.dropout, embd_pdrop=config.dropout,
                    attn_pdrop=config.dropout, bos_token_id=tok.eos_id,
                    eos_token_id=tok.eos_id, pad_token_id=tok.pad_id)
    return GPT2LMHeadModel(hf)


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def save_model(model: Any, tok: ByteTokenizer, path: str) -> None:
    """`save_pretrained` plus the tokenizer's description, in one local directory."""
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # noise here
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path)
    with open(os.path.join(path, TOKENIZER_FILE), "w") as f:
        json.dump({"kind": "byte", "eos_id": tok.eos_id, "pad_id": tok.pad_id}, f)


def load_model(path: str) -> tuple[Any, ByteTokenizer]:
    """A model saved by `save_model`. A missing or foreign directory is a UsageError
    that names the path (never a download attempt: `local_files_only`)."""
    if not os.path.isdir(path):
        raise UsageError(f"model path {path!r} does not exist or is not a directory; "
                         "give a directory written by save_model (or a checkpoint)")
    if not os.path.exists(os.path.join(path, "config.json")):
        raise UsageError(f"model path {path!r} holds no config.json; it is not a saved "
                         "model")
    tok_file = os.path.join(path, TOKENIZER_FILE)
    if os.path.exists(tok_file):
        with open(tok_file) as f:
            desc = json.load(f)
        if desc.get("kind") != "byte":
            raise UsageError(f"{tok_file}: unknown tokenizer kind {desc.get('kind')!r}")
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # noise here
    model = GPT2LMHeadModel.from_pretrained(path, local_files_only=True)
    return model, ByteTokenizer()


def resolve_device(name: str) -> torch.device:
    """`cpu`, `cuda` or `cuda:N`; asking for CUDA where there is none is a UsageError."""
    if name == "cpu":
        return torch.device("cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise UsageError(f"device {name!r} asked for, but no CUDA GPU is available "
                             "here (torch.cuda.is_available() is False); use 'cpu'")
        return torch.device(name)
    raise UsageError(f"unknown device {name!r}; use 'cpu' or 'cuda[:N]'")
