"""A run directory's files: the checkpoint (replaced atomically) and the metrics log
(metrics.jsonl and TensorBoard side by side)."""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

import torch

from trialbox.errors import UsageError
from trialbox.rollout.policy import ByteTokenizer
from trialbox.train.model import save_model
from trialbox.train.ppo import VALUE_HEAD_FILE, ValueHead
from trialbox.types import TrainState


class Checkpoint:
    """out_dir/checkpoint: the model (save_pretrained), the optimizer and the trainer's
    state, replaced atomically (written beside, then renamed)."""

    def __init__(self, out_dir: str):
        self.path = os.path.join(out_dir, "checkpoint")

    def save(self, model: Any, tok: ByteTokenizer, opt: torch.optim.Optimizer,
             state: TrainState, head: ValueHead | None = None) -> None:
        tmp = self.path + ".tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        save_model(model, tok, tmp)
        torch.save(opt.state_dict(), os.path.join(tmp, "optimizer.pt"))
        if head is not None:
            torch.save(head.state_dict(), os.path.join(tmp, VALUE_HEAD_FILE))
        with open(os.path.join(tmp, "state.json"), "w") as f:
            json.dump(state.to_dict(), f)
        old = self.path + ".old"
        shutil.rmtree(old, ignore_errors=True)
        if os.path.exists(self.path):
            os.rename(self.path, old)
        os.rename(tmp, self.path)
        shutil.rmtree(old, ignore_errors=True)

    def load_state(self) -> TrainState:
        try:
            with open(os.path.join(self.path, "state.json")) as f:
                state: dict[str, Any] = json.load(f)
        except FileNotFoundError as e:
            raise UsageError(f"[run] resume = true but {self.path} holds no checkpoint; "
                             "set resume = false to start afresh") from e
        return TrainState.from_dict(state)


class MetricsLog:
    """metrics.jsonl and TensorBoard, side by side."""

    def __init__(self, out_dir: str, append: bool, keep_through: int | None = None):
        """`keep_through` (a resumed run): drop the step records after that step (a crash
        came before their checkpoint: the resumed run writes them again)."""
        from torch.utils.tensorboard import SummaryWriter
        path = os.path.join(out_dir, "metrics.jsonl")
        if append and keep_through is not None and os.path.exists(path):
            with open(path) as f:
                lines = [x for x in f if x.strip()]
            kept = [x for x in lines if not (json.loads(x).get("kind") in ("step", "skip")
                                             and json.loads(x).get("step", 0) > keep_through)]
            if len(kept) != len(lines):
                with open(path + ".tmp", "w") as f:
                    f.writelines(kept)
                os.replace(path + ".tmp", path)
        self.jsonl = open(path, "a" if append else "w")
        self.tb = SummaryWriter(os.path.join(out_dir, "tb"))

    def write(self, kind: str, step: int, record: dict[str, Any]) -> None:
        self.jsonl.write(json.dumps({"kind": kind, "step": step, **record}) + "\n")
        self.jsonl.flush()
        for key, value in record.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self.tb.add_scalar(f"{kind}/{key}", value, step)
        self.tb.flush()

    def close(self) -> None:
        self.jsonl.close()
        self.tb.close()

