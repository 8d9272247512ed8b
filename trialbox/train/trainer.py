"""The trainer: supervised warm start, then GRPO (or PPO: `[grpo] algorithm = "ppo"`)
over multi-turn episodes judged in real sandboxes. `train()` reads top to bottom:

    setup ─► [SFT warm start] ─► held-out pass@1 ─► for each step:
        rollout (agent loop: generate ─► judge ─► feedback ─► …)   trialbox.rollout
        rewards ─► group advantages (None = excluded, counted)    losses.py
                   (PPO: values ─► GAE ─► whitened, in ppo_step)
        update epochs, gradient accumulation over micro-batches   (NaN ─► step skipped)
        log (metrics.jsonl, TensorBoard) ─► checkpoint
    ─► held-out pass@1 again

    result = asyncio.run(train(load_config("trialbox/train/demo.toml")))

A run directory holds `metrics.jsonl` (one line per step, plus `eval` and `sft` lines),
`tb/` (TensorBoard events), `checkpoint/` (model, optimizer, step, PPO's value head; `[run] resume =
true` continues from it) and `sft/` (the model after the warm start), `final/` (the trained model).
"""

from __future__ import annotations

import copy
import math
import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from trialbox import telemetry
from trialbox.errors import UsageError
from trialbox.rollout.agent import AgentConfig, RolloutBatch, rollout
from trialbox.rollout.hf_policy import HFPolicy
from trialbox.rollout.policy import ByteTokenizer
from trialbox.sandbox.pool import CellPool
from trialbox.train import demo_tasks
from trialbox.judge.reward import RewardSpec
from trialbox.train.config import Algorithm, GRPOConfig, RewardKind, TrainConfig
from trialbox.train.losses import (
    aggregate,
    aggregate_weight,
    clipped_pg_loss,
    clipped_value_loss,
    gae,
    group_advantages,
    is_finite,
    kl_k3,
    masked_whiten,
    rewards_tensor,
)
from trialbox.train.model import build_model, load_model, resolve_device, save_model
from trialbox.train.sft import sft
from trialbox.types import Outcome, Task, Trajectory

Progress = Callable[[str, dict[str, Any]], None]
"""(event, record): "sft" (every few SFT steps), "eval", "step", "skip", "stop"."""


@dataclass
class TrainResult:
    out_dir: str
    steps_done: int
    pass_before: float | None
    pass_after: float | None
    stopped: str = ""
    """Why training stopped early ("" when it ran every step)."""
    history: list[dict[str, Any]] = field(default_factory=list)
    sft_seconds: float = 0.0
    wall_s: float = 0.0


# --------------------------------------------------------------------------- plumbing

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


def train_tasks(config: TrainConfig, step: int) -> list[Task]:
    """The tasks of one GRPO step: a function of the seed and the step (so a resumed
    run sees the tasks it would have seen)."""
    return demo_tasks.make_tasks(demo_tasks.Split.TRAIN, config.grpo.tasks_per_step,
                                 seed=config.run.seed * 1_000_003 + step)


def agent_config(config: TrainConfig, *, max_turns: int | None = None,
                 temperature: float | None = None) -> AgentConfig:
    """The agent loop for the demo tasks: raw completions of the `return ` line,
    judge-only (no separate run: the visible tests' feedback says what failed)."""
    r = config.rollout
    spec = RewardSpec() if r.reward is RewardKind.BINARY else \
        RewardSpec(pass_rate=0.5, all_passed=0.5, binary=False)
    return AgentConfig(reward_spec=spec,
        max_turns=max_turns or r.max_turns, max_new_tokens=r.max_new_tokens,
        temperature=r.temperature if temperature is None else temperature,
        stop=("\n",), max_context_tokens=config.positions, turn_penalty=r.turn_penalty,
        execute=False, max_concurrent_env=r.env_workers,
        render_prompt=demo_tasks.render_prompt, render_feedback=demo_tasks.render_feedback)


async def evaluate_pass1(policy: HFPolicy, config: TrainConfig, pool: CellPool) -> \
        dict[str, Any]:
    """Held-out pass@1: one single-turn sample per unseen task, graded by the judge.
    Excluded (infra) episodes leave the denominator and are counted."""
    tasks = demo_tasks.make_tasks(demo_tasks.Split.HELDOUT, config.eval.tasks,
                                  config.eval.seed)
    batch = await rollout(policy, tasks, group_size=1, pool=pool,
                          config=agent_config(config, max_turns=1,
                                              temperature=config.eval.temperature))
    graded = batch.stats.episodes - batch.stats.excluded
    outcomes: dict[str, int] = {}
    for t in batch.trajectories:
        key = t.grade.outcome.value if t.grade is not None else "none"
        outcomes[key] = outcomes.get(key, 0) + 1
    return {"pass1": batch.stats.passed / graded if graded else None,
            "outcomes": outcomes,
            "passed": batch.stats.passed, "graded": graded,
            "excluded": batch.stats.excluded, "tasks": len(tasks),
            "temperature": config.eval.temperature, "wall_s": batch.stats.wall_s}


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


def _clip_fraction(logp: torch.Tensor, logp_old: torch.Tensor, mask: torch.Tensor,
                   g: GRPOConfig) -> float:
    """Share of the masked tokens whose ratio is outside the clip range."""
    ratio = torch.exp(logp.detach() - logp_old)
    out = (ratio < 1 - g.clip_eps_low) | (ratio > 1 + g.clip_eps_high)
    return float((out.float() * mask).sum() / mask.sum().clamp(min=1))


def _clip_and_step(opt: torch.optim.Optimizer, params: Any, g: GRPOConfig,
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


def policy_step(model: Any, opt: torch.optim.Optimizer, trajs: list[Trajectory],
                adv: torch.Tensor, valid: torch.Tensor, g: GRPOConfig, *,
                ref: Any = None, temperature: float = 1.0, max_tokens: int | None = None,
                pad_id: int = 0, device: torch.device | None = None) -> UpdateStats:
    """`g.epochs` optimizer steps on one round's trajectories: the clipped surrogate
    (plus `g.kl_coef` x k3 KL to `ref`), aggregated as `g.aggregation`, gradients
    accumulated over micro-batches of `g.micro_batch` so the result equals one big
    batch. A non-finite loss or gradient norm skips the step: its gradients are dropped
    and that epoch (and any later one) applies nothing.
    `adv` (B,), `valid` (B,): excluded samples (reward None) are not trained on."""
    device = device or torch.device("cpu")
    stats = UpdateStats()
    keep = [i for i in range(len(trajs)) if valid[i] and adv[i] != 0]
    stats.trained_on = len(keep)
    if not keep:
        return stats
    model.train()
    full_mask = batch_of([trajs[i] for i in keep], pad_id, device)["mask"]
    losses: list[float] = []
    kls: list[float] = []
    clipped: list[float] = []
    for _ in range(g.epochs):
        opt.zero_grad(set_to_none=True)
        for lo in range(0, len(keep), g.micro_batch):
            part = keep[lo:lo + g.micro_batch]
            mb = batch_of([trajs[i] for i in part], pad_id, device)
            a = adv[part].to(device)[:, None]                                   # (b, 1)
            logp = token_logprobs(model, mb["ids"], mb["attn"], temperature)    # (b, T)
            per_tok = clipped_pg_loss(logp, mb["logp_old"], a, g.clip_eps_low,
                                      g.clip_eps_high)                          # (b, T)
            if ref is not None and g.kl_coef > 0:
                with torch.no_grad():
                    logp_ref = token_logprobs(ref, mb["ids"], mb["attn"], temperature)
                kl = kl_k3(logp, logp_ref)
                per_tok = per_tok + g.kl_coef * kl
                kls.append(float(aggregate(kl.detach(), mb["mask"], g.aggregation)))
            loss = aggregate(per_tok, mb["mask"], g.aggregation, max_tokens=max_tokens)
            if not is_finite(loss):
                opt.zero_grad(set_to_none=True)  # skipped: nothing is applied
                stats.skipped = True
                return stats
            w = aggregate_weight(mb["mask"], full_mask, g.aggregation)
            (loss * w).backward()  # type: ignore[no-untyped-call]
            losses.append(float(loss.detach()))
            clipped.append(_clip_fraction(logp, mb["logp_old"], mb["mask"], g))
        if not _clip_and_step(opt, model.parameters(), g, stats):
            return stats
    stats.loss = sum(losses) / len(losses)
    stats.kl = sum(kls) / len(kls) if kls else 0.0
    stats.clip_frac = sum(clipped) / len(clipped)
    return stats


# --------------------------------------------------------------------------- PPO

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
    """`g.epochs` PPO optimizer steps on one round's trajectories, built like
    `policy_step` (micro-batch accumulation, optional k3 KL, the NaN guard):

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
    losses: list[float] = []
    vlosses: list[float] = []
    kls: list[float] = []
    clipped: list[float] = []
    params = list(model.parameters()) + list(head.parameters())
    for _ in range(g.epochs):
        opt.zero_grad(set_to_none=True)
        for lo, hi in spans:
            ids, attn, mask = rows("ids", lo, hi), rows("attn", lo, hi), rows("mask", lo, hi)
            width = ids.shape[1]
            logp_old = rows("logp_old", lo, hi)
            logp, v = logprobs_and_values(model, head, ids, attn, temperature)  # (b, T)
            pg = clipped_pg_loss(logp, logp_old, adv[lo:hi, :width], g.clip_eps_low,
                                 g.clip_eps_high)
            vl = clipped_value_loss(v, values_old[lo:hi, :width],
                                    returns[lo:hi, :width], g.value_clip)
            per_tok = pg + g.value_coef * vl
            if ref is not None and g.kl_coef > 0:
                with torch.no_grad():
                    logp_ref = token_logprobs(ref, ids, attn, temperature)
                kl = kl_k3(logp, logp_ref)
                per_tok = per_tok + g.kl_coef * kl
                kls.append(float(aggregate(kl.detach(), mask, g.aggregation)))
            loss = aggregate(per_tok, mask, g.aggregation, max_tokens=max_tokens)
            if not is_finite(loss):
                opt.zero_grad(set_to_none=True)  # skipped: nothing is applied
                stats.skipped = True
                return stats
            w = aggregate_weight(mask, full["mask"], g.aggregation)
            (loss * w).backward()  # type: ignore[no-untyped-call]
            losses.append(float(loss.detach()))
            vlosses.append(float(aggregate(vl.detach(), mask, g.aggregation,
                                           max_tokens=max_tokens)))
            clipped.append(_clip_fraction(logp, logp_old, mask, g))
        if not _clip_and_step(opt, params, g, stats):
            return stats
    stats.loss = sum(losses) / len(losses)
    stats.value_loss = sum(vlosses) / len(vlosses)
    stats.kl = sum(kls) / len(kls) if kls else 0.0
    stats.clip_frac = sum(clipped) / len(clipped)
    return stats


class _Checkpoint:
    """out_dir/checkpoint: the model (save_pretrained), the optimizer and the trainer's
    state, replaced atomically (written beside, then renamed)."""

    def __init__(self, out_dir: str):
        self.path = os.path.join(out_dir, "checkpoint")

    def save(self, model: Any, tok: ByteTokenizer, opt: torch.optim.Optimizer,
             state: dict[str, Any], head: ValueHead | None = None) -> None:
        tmp = self.path + ".tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        save_model(model, tok, tmp)
        torch.save(opt.state_dict(), os.path.join(tmp, "optimizer.pt"))
        if head is not None:
            torch.save(head.state_dict(), os.path.join(tmp, VALUE_HEAD_FILE))
        with open(os.path.join(tmp, "state.json"), "w") as f:
            json.dump(state, f)
        old = self.path + ".old"
        shutil.rmtree(old, ignore_errors=True)
        if os.path.exists(self.path):
            os.rename(self.path, old)
        os.rename(tmp, self.path)
        shutil.rmtree(old, ignore_errors=True)

    def load_state(self) -> dict[str, Any]:
        try:
            with open(os.path.join(self.path, "state.json")) as f:
                state: dict[str, Any] = json.load(f)
        except FileNotFoundError as e:
            raise UsageError(f"[run] resume = true but {self.path} holds no checkpoint; "
                             "set resume = false to start afresh") from e
        return state


class _Log:
    """metrics.jsonl and TensorBoard, side by side."""

    def __init__(self, out_dir: str, append: bool):
        from torch.utils.tensorboard import SummaryWriter
        self.jsonl = open(os.path.join(out_dir, "metrics.jsonl"), "a" if append else "w")
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


# --------------------------------------------------------------------------- the loop

async def train(config: TrainConfig, pool: CellPool | None = None,
                progress: Progress | None = None) -> TrainResult:
    """Run the whole recipe of `config`; see the module docstring."""
    say: Progress = progress or (lambda event, record: None)
    t_start = time.monotonic()
    run, g = config.run, config.grpo

    # ---- setup -----------------------------------------------------------------------
    device = resolve_device(run.device)
    if run.threads:
        torch.set_num_threads(run.threads)
    os.makedirs(run.out_dir, exist_ok=True)
    ckpt = _Checkpoint(run.out_dir)
    tok = ByteTokenizer()
    state: dict[str, Any] = {"step": 0, "pass_before": None, "bad_in_a_row": 0,
                             "history": []}
    model: Any
    if run.resume:
        state = ckpt.load_state()
        model, _ = load_model(ckpt.path)
    elif config.model.path:
        model, _ = load_model(config.model.path)
    else:
        model = build_model(config.model.shape, tok, seed=run.seed)
    model.to(device)
    log = _Log(run.out_dir, append=run.resume)
    own_pool = pool is None
    if pool is None:
        from trialbox.judge.function import judge_pool_config
        pool = await CellPool(judge_pool_config(warm=2 * config.rollout.env_workers)).start()
    result = TrainResult(run.out_dir, 0, None, None)
    try:
        # ---- supervised warm start (fresh runs only) -----------------------------------
        if not run.resume and config.sft.steps:
            pairs = demo_tasks.sft_pairs(demo_tasks.make_tasks(
                demo_tasks.Split.TRAIN, max(2000, config.sft.steps * config.sft.batch_size
                                            // 4), seed=run.seed + 7), seed=run.seed)
            stats = sft(model, tok, pairs, config.sft, device=device, progress=lambda s, loss:
                        say("sft", {"step": s, "steps": config.sft.steps, "loss": loss})
                        if s % 10 == 0 or s == config.sft.steps else None)
            result.sft_seconds = stats.seconds
            save_model(model, tok, os.path.join(run.out_dir, "sft"))
            log.write("sft", 0, {"loss": stats.final_loss, "seconds": stats.seconds,
                                 "steps": stats.steps})
        policy = HFPolicy(model, tok, seed=run.seed)
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
            if run.resume:
                head_file = os.path.join(ckpt.path, VALUE_HEAD_FILE)
                if not os.path.exists(head_file):
                    raise UsageError(f"[grpo] algorithm = 'ppo' but {ckpt.path} holds no "
                                     f"{VALUE_HEAD_FILE} (a GRPO checkpoint?); resume it "
                                     "with algorithm = 'grpo' or start afresh")
                head.load_state_dict(torch.load(head_file, map_location=device))
            params += list(head.parameters())
        opt = torch.optim.AdamW(params, lr=g.lr, weight_decay=0.0)
        if run.resume:
            opt.load_state_dict(torch.load(os.path.join(ckpt.path, "optimizer.pt")))

        if not run.resume and config.eval.tasks:
            before = await evaluate_pass1(policy, config, pool)
            state["pass_before"] = before["pass1"]
            log.write("eval", 0, {"when": 0, **before})
            say("eval", {"when": "before", **before})
        result.pass_before = state["pass_before"]

        # ---- GRPO ---------------------------------------------------------------------
        run_id = os.path.basename(os.path.normpath(run.out_dir))
        while state["step"] < g.steps:
            step = state["step"]
            t0 = time.monotonic()

            # One trace per iteration: its episodes (model output, sandbox runs, grading,
            # reward) and its training step nest under it (docs/observability.md).
            with telemetry.span("train.iteration", {"run.id": run_id, "train.step": step + 1}):
                # rollout: multi-turn episodes through the agent loop and the real judge
                batch: RolloutBatch = await rollout(policy, train_tasks(config, step),
                                                    group_size=g.group_size, pool=pool,
                                                    config=agent_config(config))
                t_rollout = time.monotonic() - t0
                trajs = batch.trajectories

                # rewards -> advantages, (G, K): a task's K samples side by side
                # (PPO: per-token GAE advantages, computed inside ppo_step)
                values, valid = rewards_tensor([t.reward for t in trajs])
                max_tokens = config.rollout.max_turns * config.rollout.max_new_tokens

                # update epochs, gradient accumulation over micro-batches
                t1 = time.monotonic()
                with telemetry.train_step(run_id, step + 1, episodes=len(trajs)):
                    if head is not None:
                        upd = ppo_step(model, head, opt, trajs, valid, g, ref=ref,
                                       temperature=config.rollout.temperature,
                                       max_tokens=max_tokens, pad_id=tok.pad_id,
                                       device=device)
                    else:
                        adv = group_advantages(values.view(-1, g.group_size),
                                               valid.view(-1, g.group_size),
                                               g.advantage).view(-1)
                        upd = policy_step(model, opt, trajs, adv, valid, g, ref=ref,
                                          temperature=config.rollout.temperature,
                                          max_tokens=max_tokens, pad_id=tok.pad_id,
                                          device=device)
                bad = upd.skipped
                t_update = time.monotonic() - t1

            # log
            graded = [t for t in trajs if t.reward is not None]
            first = [t for t in graded if t.turns and t.turns[0].outcome is Outcome.PASSED]
            s = batch.stats
            record: dict[str, Any] = {
                "reward": sum(t.reward for t in graded if t.reward is not None)
                / max(1, len(graded)),
                "pass_rate": sum(t.passed for t in graded) / max(1, len(graded)),
                "pass_turn1": len(first) / max(1, len(graded)),
                "excluded": s.excluded, "episodes": s.episodes, "turns": s.turns,
                "trained_on": upd.trained_on, "loss": upd.loss, "kl": upd.kl,
                "clip_frac": upd.clip_frac, "grad_norm": upd.grad_norm,
                "gen_s": s.gen_s, "env_wall_s": s.env_wall_s, "rollout_s": t_rollout,
                "update_s": t_update, "model_tokens": s.model_tokens,
                "episodes_per_s": s.episodes / max(1e-9, time.monotonic() - t0),
                "tokens_per_s": s.model_tokens / max(1e-9, time.monotonic() - t0),
                "step_s": time.monotonic() - t0,
            }
            if head is not None:
                record["value_loss"] = upd.value_loss
            state["step"] = step + 1
            scalars = {k: float(record[k]) for k in ("pass_rate", "loss", "kl")
                       if isinstance(record[k], (int, float)) and math.isfinite(record[k])}
            telemetry.record_train_step(run_id, step + 1, reward_mean=record["reward"],
                                        **scalars)
            if bad:
                state["bad_in_a_row"] += 1
                record["skipped"] = "non-finite loss"
                log.write("skip", step + 1, record)
                say("skip", {"step": step + 1, **record})
                if state["bad_in_a_row"] >= g.max_bad_steps:
                    result.stopped = (f"{state['bad_in_a_row']} steps in a row had a "
                                      f"non-finite loss (max_bad_steps = {g.max_bad_steps})")
                    say("stop", {"reason": result.stopped})
                    break
            else:
                state["bad_in_a_row"] = 0
                log.write("step", step + 1, record)
                say("step", {"step": step + 1, "steps": g.steps, **record})
            state["history"].append({"step": step + 1, "reward": record["reward"],
                                     "pass_rate": record["pass_rate"],
                                     "pass_turn1": record["pass_turn1"]})

            # checkpoint
            if state["step"] % run.checkpoint_every == 0 or state["step"] == g.steps:
                ckpt.save(model, tok, opt, state, head)

        # ---- the end: held-out pass@1 again, the final model ---------------------------
        result.steps_done = state["step"]
        if config.eval.tasks:
            after = await evaluate_pass1(policy, config, pool)
            result.pass_after = after["pass1"]
            log.write("eval", state["step"], {"when": state["step"], **after})
            say("eval", {"when": "after", **after})
        save_model(model, tok, os.path.join(run.out_dir, "final"))
        if head is not None:
            torch.save(head.state_dict(), os.path.join(run.out_dir, "final",
                                                       VALUE_HEAD_FILE))
        result.history = list(state["history"])
        result.wall_s = time.monotonic() - t_start
        with open(os.path.join(run.out_dir, "config.json"), "w") as f:
            json.dump(asdict(config), f, default=str, indent=1)
    finally:
        log.close()
        if own_pool:
            await pool.close()
    return result
