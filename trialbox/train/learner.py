"""What the update changes and a checkpoint saves: the model, the optimizer, PPO's
value head, and beside them the frozen reference the KL term pulls towards.

    learner = build_learner(config, model, tok, device, Checkpoint(out_dir))
    learner.save(ckpt, state)        # out_dir/checkpoint (`runfiles.Checkpoint`)
    save_final(learner, out_dir)     # out_dir/final
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from typing import Any

import torch

from trialbox.errors import UsageError
from trialbox.rollout.policy import ByteTokenizer
from trialbox.train.config import Algorithm, TrainConfig
from trialbox.train.model import save_model
from trialbox.train.ppo import VALUE_HEAD_FILE, ValueHead
from trialbox.train.runfiles import Checkpoint
from trialbox.types import TrainState


@dataclass(frozen=True)
class Learner:
    """The model the trainer updates and what its update needs."""

    model: Any
    tok: ByteTokenizer
    opt: torch.optim.Optimizer
    head: ValueHead | None
    """PPO's critic (None: GRPO)."""
    ref: Any
    """The frozen model the KL term pulls towards (None: kl_coef = 0)."""

    def save(self, ckpt: Checkpoint, state: TrainState) -> None:
        ckpt.save(self.model, self.tok, self.opt, state, self.head)


def build_learner(config: TrainConfig, model: Any, tok: ByteTokenizer,
                  device: torch.device, ckpt: Checkpoint) -> Learner:
    """The KL term's reference (kl_coef > 0), PPO's value head and the optimizer over
    the model (and the head); on a resumed run the head and the optimizer's moments are
    the checkpoint's."""
    g = config.grpo
    ref = None
    if g.kl_coef > 0:  # the frozen starting point the KL term pulls towards (on a
        # resumed run: the checkpoint's model, the original start is not kept)
        ref = copy.deepcopy(model).train(False)
        for p in ref.parameters():
            p.requires_grad_(False)
    head: ValueHead | None = None
    params = list(model.parameters())
    if g.algorithm is Algorithm.PPO:  # the critic shares the optimizer (and lr)
        head = ValueHead(model.config.n_embd).to(device)
        if config.run.resume:
            head_file = os.path.join(ckpt.path, VALUE_HEAD_FILE)
            if not os.path.exists(head_file):
                raise UsageError(f"[grpo] algorithm = 'ppo' but {ckpt.path} holds no "
                                 f"{VALUE_HEAD_FILE} (a GRPO checkpoint?); resume it "
                                 "with algorithm = 'grpo' or start afresh")
            head.load_state_dict(torch.load(head_file, map_location=device))
        params += list(head.parameters())
    opt = torch.optim.AdamW(params, lr=g.lr, weight_decay=0.0)
    if config.run.resume:
        # via the CPU: a checkpoint written on a GPU then loads anywhere, and
        # load_state_dict moves the moments to the parameters' device
        opt.load_state_dict(torch.load(os.path.join(ckpt.path, "optimizer.pt"),
                                       map_location="cpu"))
    return Learner(model, tok, opt, head, ref)


def save_final(learner: Learner, out_dir: str) -> None:
    """The trained model (and PPO's value head) in out_dir/final."""
    final = os.path.join(out_dir, "final")
    save_model(learner.model, learner.tok, final)
    if learner.head is not None:
        torch.save(learner.head.state_dict(), os.path.join(final, VALUE_HEAD_FILE))
