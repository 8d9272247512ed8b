"""`trialbox demo`: a tiny model learns to write code by trial and error, on CPU.

Build a ~0.7M-parameter byte-level transformer, warm-start it with a short supervised
phase on generated programs written by an unverified teacher (it has twelve classic
bugs, `demo_tasks.TEACHER_BUGS`, which imitation learns too), measure pass@1 on the test
split (held-out prompts no tuning looked at, none sharing examples with a training
prompt; greedy, graded by the trusted judge in real sandboxes), train it with GRPO over
two-turn episodes (the judge's feedback on the visible examples between turns), measure
again, and report: pass@1 before/after with 95% intervals, the rise with its paired
interval (what it measures: the policy unlearning the teacher's bugs from sandbox
rewards), the reward curve (PNG), where the records and TensorBoard logs are.

The recipe is `trialbox/train/demo.toml`; `--smoke` shrinks it to a few seconds of work
(used by the test suite: it checks the plumbing, not the learning).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import warnings
from importlib import resources
from typing import Any

from trialbox.errors import UsageError
from trialbox.train.config import TrainConfig, load_config, with_changes
from trialbox.train.trainer import TrainResult, train

RECIPE = str(resources.files("trialbox.train").joinpath("demo.toml"))

SMOKE = {"model": {"n_layer": 1, "n_embd": 32, "n_head": 2},
         "sft": {"steps": 10, "batch_size": 8},
         "grpo": {"steps": 2, "tasks_per_step": 2, "group_size": 4, "micro_batch": 8},
         "rollout": {"max_new_tokens": 12},
         "eval": {"tasks": 8}}
"""--smoke: every phase runs, on a budget of seconds."""


def demo_config(seed: int | None, out: str | None, smoke: bool,
                device: str | None) -> TrainConfig:
    config = load_config(RECIPE, SMOKE if smoke else None)
    seed = config.run.seed if seed is None else seed
    changes: dict[str, Any] = {"seed": seed,
                               "out_dir": out or f"runs/demo{'-smoke' if smoke else ''}"
                               f"-seed{seed}"}
    if device is not None:
        changes["device"] = device
    return with_changes(config, run=changes)


class _Live:
    """Live progress in the terminal: one line per phase and per GRPO step."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.tty = sys.stdout.isatty()
        self.recent: list[float] = []
        self.evals: dict[str, dict[str, Any]] = {}

    def __call__(self, event: str, r: dict[str, Any]) -> None:
        t = f"[{time.monotonic() - self.t0:6.1f}s]"
        if event == "sft":
            line = f"{t} supervised warm start  step {r['step']:>4}/{r['steps']}  " \
                   f"loss {r['loss']:.3f}"
            if self.tty and r["step"] < r["steps"]:
                print("\r" + line, end="", flush=True)
            elif r["step"] == r["steps"] or r["step"] % 50 == 0:
                print(("\r" if self.tty else "") + line, flush=True)
        elif event == "eval":
            lo, hi = r["ci95"]
            print(f"{t} {r['split']} pass@1 {r['when']:<6} {_pct(r['pass1'])}  "
                  f"[95% CI {100 * lo:.1f}-{100 * hi:.1f}]  "
                  f"({r['passed']}/{r['graded']} {r['split']} tasks, greedy, excluded "
                  f"{r['excluded']}; {r['teacher_bugs']} answers are the teacher's bug; "
                  f"judged in {r['wall_s']:.1f}s)", flush=True)
            self.evals[r["when"]] = r
        elif event == "step":
            # each step draws new tasks, so one step's pass rate is noisy: show the mean
            # of the last 5 beside it
            self.recent = (self.recent + [r["pass_rate"]])[-5:]
            avg = sum(self.recent) / len(self.recent)
            print(f"{t} GRPO step {r['step']:>3}/{r['steps']}  reward {r['reward']:+.3f}  "
                  f"pass {r['pass_rate']:.2f} (turn 1 {r['pass_turn1']:.2f}, last-5 mean "
                  f"{avg:.2f})  "
                  f"{r['episodes_per_s']:5.1f} episodes/s  {r['tokens_per_s']:6.0f} tok/s  "
                  f"generation {r['gen_s']:4.1f}s / sandboxes {r['env_wall_s']:4.1f}s / "
                  f"update {r['update_s']:4.1f}s", flush=True)
        elif event == "skip":
            print(f"{t} GRPO step {r['step']} SKIPPED: {r['skipped']}", flush=True)
        elif event == "stop":
            print(f"{t} training stopped: {r['reason']}", flush=True)


def template_table(before: dict[str, Any], after: dict[str, Any]) -> str:
    """Held-out passes by program template, before and after GRPO; `*` marks the
    templates the warm start's teacher writes with a bug."""
    from trialbox.train.demo_tasks import TEACHER_BUGS

    rows = [" by template (passed/graded; * = the teacher has a bug for it):"]
    cells = []
    for name, (p0, n0) in before["by_template"].items():
        p1, n1 = after["by_template"].get(name, (0, 0))
        mark = "*" if name in TEACHER_BUGS else " "
        cells.append(f"{mark}{name:<15}{p0:>3}/{n0:<3}-> {p1:>3}/{n1:<3}")
    for i in range(0, len(cells), 3):
        rows.append("   " + "  ".join(cells[i:i + 3]))
    rows.append(f" answers that are exactly the teacher's bug: {before['teacher_bugs']} -> "
                f"{after['teacher_bugs']}")
    return "\n".join(rows)


def summary(result: TrainResult, split: str) -> str:
    """The run's figure: pass@1 before -> after on the eval split, each with its 95%
    interval, the paired rise with its own, and what the split left out."""
    before, after = result.eval_before, result.eval_after
    if before is None or after is None:
        return f" {split} pass@1: not measured ([eval] tasks = 0)"
    lines = [f" {split} pass@1 (greedy, {after['graded']} tasks never trained on, none "
             "used to tune the recipe):" if split == "test" else
             f" {split} pass@1 (greedy, {after['graded']} tasks; the recipe was tuned on "
             "this split: report the test split):",
             f"   after the warm start {_ci(before['pass1'], before['ci95'])}",
             f"   after GRPO           {_ci(after['pass1'], after['ci95'])}"]
    if result.rise is not None:
        mean, lo, hi = result.rise
        lines.append(f"   rise                 {_ci(mean, [lo, hi], sign=True)} points "
                     "(paired over the same tasks)")
    if after.get("note"):
        lines.append(f"   {after['note']}")
    return "\n".join(lines)


def _ci(x: float | None, ci: list[float] | None, sign: bool = False) -> str:
    if x is None:
        return "n/a"
    fmt = "+.1f" if sign else ".1f"
    head = f"{100 * x:{fmt}}" + ("" if sign else "%")
    return head if not ci else f"{head} [{100 * ci[0]:{fmt}}, {100 * ci[1]:{fmt}}]"


def _pct(x: float | None) -> str:
    return "  n/a " if x is None else f"{100 * x:5.1f}%"


def reward_curve(result: TrainResult, path: str, title: str) -> str:
    """The reward and pass-rate curve (and pass@1 before/after) as a PNG."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [h.step for h in result.history]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    ax.plot(steps, [h.reward for h in result.history], label="mean reward (train)")
    ax.plot(steps, [h.pass_rate for h in result.history], label="pass rate (train)")
    ax.plot(steps, [h.pass_turn1 for h in result.history], label="pass at turn 1",
            linestyle=":")
    # each step draws 16 new tasks, so one step's pass rate swings: the trend is the
    # mean of the last 5 steps
    rates = [h.pass_rate for h in result.history]
    windows = [rates[max(0, i - 4):i + 1] for i in range(len(rates))]
    trend = [sum(w) / len(w) for w in windows]
    ax.plot(steps, trend, label="pass rate, mean of last 5 steps", linewidth=2.5)
    if result.pass_before is not None and result.pass_after is not None:
        last = steps[-1] if steps else 1
        ax.scatter([0, last], [result.pass_before, result.pass_after], color="black",
                   zorder=3, label="held-out pass@1 (greedy)")
    ax.set_xlabel("GRPO step")
    ax.set_ylim(-0.55, 1.05)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


async def _one(config: TrainConfig) -> dict[str, Any]:
    from trialbox.judge.function import judge_pool_config
    from trialbox.sandbox.pool import CellPool
    from trialbox.train.model import build_model, n_params

    params = n_params(build_model(config.model.shape))
    print(f"trialbox demo — seed {config.run.seed}: a {params / 1e6:.2f}M-parameter "
          f"byte-level transformer ({config.model.shape.n_layer} layers, width "
          f"{config.model.shape.n_embd}) learns to write Python functions from examples.\n"
          f"  warm start: {config.sft.steps} supervised steps; then GRPO: "
          f"{config.grpo.steps} steps x {config.grpo.tasks_per_step} tasks x "
          f"{config.grpo.group_size} episodes of up to {config.rollout.max_turns} turns, "
          "each turn graded by the trusted judge in fresh sandboxes.\n"
          f"  {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start\n",
          flush=True)
    pool = await CellPool(judge_pool_config(warm=2 * config.rollout.env_workers)).start()
    live = _Live()
    try:
        result = await train(config, pool, live)
    finally:
        await pool.close()
    png = reward_curve(result, os.path.join(config.run.out_dir, "reward_curve.png"),
                       f"trialbox demo, seed {config.run.seed}")
    rise = None if result.rise is None else result.rise[0]
    print("\n" + summary(result, config.eval.split.value))
    if "before" in live.evals and "after" in live.evals:
        print(template_table(live.evals["before"], live.evals["after"]))
    if result.stopped:
        print(f" stopped early: {result.stopped}")
    d = config.run.out_dir
    print(f" wall time {result.wall_s:.0f}s (warm start {result.sft_seconds:.0f}s); load "
          f"average now {os.getloadavg()[0]:.1f}\n"
          f" reward curve:      {png}\n"
          f" step records:      {os.path.join(d, 'metrics.jsonl')}\n"
          f" TensorBoard:       tensorboard --logdir {os.path.join(d, 'tb')}\n"
          f" models:            {os.path.join(d, 'sft')} (warm start), "
          f"{os.path.join(d, 'final')} (after GRPO)", flush=True)
    before, after = result.eval_before or {}, result.eval_after or {}
    return {"seed": config.run.seed, "split": config.eval.split.value,
            "pass_before": result.pass_before, "pass_after": result.pass_after,
            "ci95_before": before.get("ci95"), "ci95_after": after.get("ci95"),
            "rise": rise, "rise_ci95": None if result.rise is None else
            list(result.rise[1:]), "eval_tasks": after.get("graded"),
            "removed": after.get("removed"), "steps": result.steps_done,
            "stopped": result.stopped, "wall_s": round(result.wall_s, 1),
            "sft_s": round(result.sft_seconds, 1), "out_dir": d,
            "load_avg_end": os.getloadavg()[0]}


def main(args: argparse.Namespace) -> int:
    if args.what == "sandbox":
        from trialbox.train.showcase import main as showcase
        return showcase()
    # The judge's static scan parses model-written code; a tiny model's odd literals
    # make Python warn ("invalid decimal literal"), which says nothing about the run.
    warnings.filterwarnings("ignore", category=SyntaxWarning)
    seeds: list[int | None] = [args.seed]
    if args.seeds:
        try:
            seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
        except ValueError as e:
            raise UsageError(f"--seeds must be comma-separated integers, got "
                             f"{args.seeds!r}") from e
        if args.out and len(seeds) > 1:
            raise UsageError("--out names one run directory; with several --seeds leave "
                             "it out (each seed gets runs/demo-seed<N>)")
    rows = []
    for seed in seeds:
        config = demo_config(seed, args.out, args.smoke, args.device)
        rows.append(asyncio.run(_one(config)))
    if len(rows) > 1:
        print(f"\n {rows[0]['split']} pass@1 per seed (95% CI):")
        print(" seed   before               after                rise                 "
              "wall s")
        for r in rows:
            print(f" {r['seed']:>4}   {_ci(r['pass_before'], r['ci95_before']):<19}  "
                  f"{_ci(r['pass_after'], r['ci95_after']):<19}  "
                  f"{_ci(r['rise'], r['rise_ci95'], sign=True):<19}  {r['wall_s']:6.0f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"runs": rows}, f, indent=1)
    return 0
