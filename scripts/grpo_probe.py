"""A fast probe for tuning the demo's GRPO recipe (not part of trialbox's product).

    .venv/bin/python scripts/grpo_probe.py --sft 300 --steps 60 --lr 3e-4 --temp 0.7
    .venv/bin/python scripts/grpo_probe.py --sft 100 --only-sft     # just the start's figures

Why it exists: a real demo step spends ~3 of its ~5 s in the sandboxes and the judge,
so trying a recipe costs minutes. This probe keeps everything of the demo's single-turn
GRPO — the model (`train/model.py`), the SFT warm start (`train/sft.py`), the task
family (`train/demo_tasks.py`), sampling (`HFPolicy`), group advantages
(`train/losses.py`), a clipped token-mean surrogate — and replaces only the reward: an
output scores 1 when its text is one of the DSL's own programs (of the task's input
kind) that agrees with the task's program on every hidden input. **No model output is
ever run**: only the DSL's trusted expressions are evaluated. An output that is correct
but not written as a DSL program (`3 + x`) scores 0 here and would pass the real judge,
so the probe's pass rates are a slight underestimate; the figures it prints are for
comparing recipes, not for reporting — the demo's figures come from `trialbox demo`.

Printed, one JSON object per line: the start's and every `--eval-every` steps'
held-out greedy pass@1 (the demo's split: 200 tasks, seed 12345), held-out mean pass
and pass@4 at temperature 1, and "iid" greedy pass@1 on 200 fresh tasks of the training
programs (seed 777); each step's batch pass rate. SFT starts are cached in `--cache`.
Findings: docs/training.md, "What was tried".
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import time
from typing import Any

import torch

from trialbox.rollout.hf_policy import HFPolicy
from trialbox.rollout.policy import ByteTokenizer, Generation
from trialbox.train import demo_tasks as D
from trialbox.train.losses import Advantage, group_advantages, rewards_tensor
from trialbox.train.model import ModelConfig, build_model, load_model, save_model
from trialbox.train.sft import SFTConfig, sft
from trialbox.types import Task


def reward(task: Task, text: str) -> float:
    """1.0 when the first line of `text` is a DSL program equal to the task's on every
    hidden input (compared by running the DSL's expressions, never the text)."""
    expr = " ".join(text.split("\n", 1)[0].split())
    truth = D._program_of(task)
    if truth is None:
        raise ValueError(f"{task.task_id}: not a demo task")
    hidden = [ast.literal_eval(t.code.split("candidate(", 1)[1].split(") == ", 1)[0])
              for t in task.hidden_tests]
    for p in D._by_arg(truth.arg):
        if p.expr == expr:
            return float(all(p(x) == truth(x) and type(p(x)) is type(truth(x))
                             for x in hidden))
    return 0.0


def generate(policy: HFPolicy, prompts: list[str], temperature: float) -> list[Generation]:
    out: list[Generation] = []
    for i in range(0, len(prompts), 256):
        out += policy._generate([policy.tokenizer.encode(p) for p in prompts[i:i + 256]],
                                24, temperature, ["\n"])
    return out


def pass_rates(policy: HFPolicy, split: D.Split, seed: int, temperature: float,
               samples: int = 1, n: int = 200) -> tuple[float, float]:
    """(mean pass over all samples, share of tasks with at least one pass)."""
    tasks = D.make_tasks(split, n, seed)
    outs = generate(policy, [t.prompt for t in tasks for _ in range(samples)], temperature)
    r = [reward(tasks[i // samples], o.text) for i, o in enumerate(outs)]
    any_pass = sum(max(r[j * samples:(j + 1) * samples]) for j in range(len(tasks)))
    return round(sum(r) / len(r), 3), round(any_pass / len(tasks), 3)


def report(policy: HFPolicy, tag: str, t0: float, n: int) -> None:
    torch.manual_seed(0)
    print(json.dumps({
        "at": tag,
        "heldout_greedy": pass_rates(policy, D.Split.HELDOUT, 12345, 0.0, n=n)[0],
        "heldout_t1_mean_pass4": pass_rates(policy, D.Split.HELDOUT, 12345, 1.0, 4, n),
        "iid_greedy": pass_rates(policy, D.Split.TRAIN, 777, 0.0, n=n)[0],
        "s": round(time.monotonic() - t0, 1)}), flush=True)


def start_model(a: argparse.Namespace) -> tuple[Any, ByteTokenizer]:
    path = os.path.join(a.cache, f"sft{a.sft}_{a.layers}x{a.embd}_seed{a.seed}"
                        f"_teacher{a.teacher_error}")
    if os.path.isdir(path):
        return load_model(path)
    tok = ByteTokenizer()
    model = build_model(ModelConfig(n_layer=a.layers, n_embd=a.embd), tok, seed=a.seed)
    pairs = D.sft_pairs(D.make_tasks(D.Split.TRAIN, max(2000, a.sft * 32), a.seed), a.seed,
                        retry_share=0.0, teacher_error=a.teacher_error)
    sft(model, tok, pairs, SFTConfig(steps=a.sft, seed=a.seed))
    save_model(model, tok, path)
    return model, tok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sft", type=int, default=300, help="SFT steps of the start")
    ap.add_argument("--steps", type=int, default=30, help="GRPO steps")
    ap.add_argument("--tasks", type=int, default=16, help="tasks per step")
    ap.add_argument("--group", type=int, default=8, help="samples per task")
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--warmup", type=int, default=0, help="steps of linear lr warm-up")
    ap.add_argument("--temp", type=float, default=1.0, help="sampling temperature")
    ap.add_argument("--epochs", type=int, default=1, help="clipped updates per batch")
    ap.add_argument("--positive-only", action="store_true",
                    help="clamp advantages at 0 (self-imitation of the passing samples)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--teacher-error", type=float, default=0.0,
                    help="the SFT teacher's bug rate (demo_tasks.TEACHER_BUGS)")
    ap.add_argument("--eval-every", type=int, default=25)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--embd", type=int, default=128)
    ap.add_argument("--eval-tasks", type=int, default=200, help="tasks per figure")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cache", default=".bench/probe")
    ap.add_argument("--only-sft", action="store_true", help="report the start and stop")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    t0 = time.monotonic()
    model, tok = start_model(a)
    policy = HFPolicy(model, tok, seed=a.seed)
    report(policy, "start", t0, a.eval_tasks)
    if a.only_sft:
        return
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.0)
    for step in range(a.steps):
        tasks = D.make_tasks(D.Split.TRAIN, a.tasks, a.seed * 1_000_003 + step)
        prompts = [t.prompt for t in tasks for _ in range(a.group)]
        outs = generate(policy, prompts, a.temp)
        rewards = [reward(tasks[i // a.group], o.text) for i, o in enumerate(outs)]
        values, valid = rewards_tensor(rewards)
        adv = group_advantages(values.view(-1, a.group), valid.view(-1, a.group),
                               Advantage.GRPO).view(-1)                         # (B,)
        if a.positive_only:
            adv = adv.clamp(min=0)
        rows = [tok.encode(p) + list(o.token_ids) for p, o in zip(prompts, outs, strict=True)]
        width = max(map(len, rows))
        ids = torch.full((len(rows), width), tok.pad_id)                       # (B, T)
        attn = torch.zeros((len(rows), width), dtype=torch.long)
        mask = torch.zeros((len(rows), width))
        for i, (r, o) in enumerate(zip(rows, outs, strict=True)):
            ids[i, :len(r)] = torch.tensor(r)
            attn[i, :len(r)] = 1
            mask[i, len(r) - len(o.token_ids):len(r)] = 1
        mask = mask[:, 1:]                                                      # (B, T-1)
        for g in opt.param_groups:
            g["lr"] = a.lr * min(1.0, (step + 1) / max(1, a.warmup))
        model.train()
        logp_old = None
        for _ in range(a.epochs):
            logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
            logp = torch.log_softmax(logits / a.temp, -1).gather(
                2, ids[:, 1:, None]).squeeze(2)                                 # (B, T-1)
            if logp_old is None:
                logp_old = logp.detach()
            ratio = torch.exp(logp - logp_old)
            pg = -torch.min(ratio * adv[:, None], ratio.clamp(0.8, 1.2) * adv[:, None])
            loss = (pg * mask).sum() / mask.sum()
            opt.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
        model.eval()
        print(json.dumps({"step": step + 1, "batch_pass": round(sum(rewards) / len(rewards), 3)}),
              flush=True)
        if (step + 1) % a.eval_every == 0:
            report(policy, f"step {step + 1}", t0, a.eval_tasks)


if __name__ == "__main__":
    main()
