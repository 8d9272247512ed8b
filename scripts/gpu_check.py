#!/usr/bin/env python3
"""The trainer's device check (issue 5: `--device cuda` where a GPU exists).

    python scripts/gpu_check.py --device cuda --out DIR          # on a machine with a GPU
    python scripts/gpu_check.py --device cpu --quick --out DIR   # the CPU path (the test)

Exercises the code paths the trainer runs on the chosen device, with the demo's model:

  1. device   resolve_device(), the demo model built and moved there
  2. sft      trialbox.train.sft.sft for a few dozen steps on the demo's pairs; loss falls
  3. generate HFPolicy.generate (batched; temperature 1 and greedy; stop string "\\n"):
              the sampled log-probs against a recompute by update.token_logprobs (the
              trainer's first-epoch ratio), greedy output against a CPU copy
  4. update   policy_step (GRPO, two micro-batches, KL to a frozen reference) and
              ppo_step on trajectories built from those generations, on the device and
              on a CPU copy of the same weights: loss and gradient norm must agree.
              Rewards come from a deterministic rule on the sampled token ids (parity
              of their sum), NOT from the judge: this checks the device code path, not
              the learning or the judge.
  5. demo     the trainer end to end as `trialbox demo --smoke --device D` does it (SFT,
              held-out pass@1 through the real judge and sandboxes, GRPO, pass@1
              again), in a child process with a deadline. When the sandbox pool cannot
              start on the machine, the error is recorded as a finding (the device
              checks above do not need it) and the script does not fail on it.
  6. timing   SFT steps/s and generation tokens/s on the device and on this machine's
              CPU in the same run (and, with --big, for a ~25M-parameter shape).

Writes DIR/gpu_check.json (every figure and check) and DIR/demo.json (stage 5); prints
a summary table. Exit status 0 when every check of stages 1-4 (and 5, when the sandbox
started) passed, 1 otherwise. Imports only trialbox.train/rollout modules in the main
process (no service, no telemetry); stage 5 needs the trainer's full imports.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # runnable from a bare checkout (trialbox not installed)
    sys.path.insert(0, ROOT)

import torch  # noqa: E402

from trialbox.rollout.hf_policy import HFPolicy  # noqa: E402
from trialbox.rollout.policy import ByteTokenizer, Generation  # noqa: E402
from trialbox.train import demo_tasks  # noqa: E402
from trialbox.train.config import Algorithm, GRPOConfig  # noqa: E402
from trialbox.train.losses import Advantage, group_advantages, rewards_tensor  # noqa: E402
from trialbox.train.model import ModelConfig, build_model, n_params, resolve_device  # noqa: E402
from trialbox.train.ppo import ValueHead, ppo_step  # noqa: E402
from trialbox.train.sft import SFTConfig, sft  # noqa: E402
from trialbox.train.update import UpdateStats, batch_of, policy_step, token_logprobs  # noqa: E402
from trialbox.types import Trajectory, Turn  # noqa: E402

DEMO_SHAPE = ModelConfig(n_layer=3, n_embd=128, n_head=4, n_positions=256)
"""The demo's model (trialbox/train/demo.toml), ~0.66M parameters."""
BIG_SHAPE = ModelConfig(n_layer=8, n_embd=512, n_head=8, n_positions=256)
"""A larger shape for the timing table only (~25M parameters)."""

LOGPROB_TOL = 1e-3
"""Sampled vs recomputed log-probs (KV-cache steps vs one full forward, float32)."""
LOSS_ATOL, LOSS_RTOL = 1e-4, 1e-3
"""Device vs CPU loss / gradient norm of one update from the same weights."""


@dataclass(frozen=True)
class Sizes:
    """How much work each stage does (--quick shrinks it for CPU tests)."""

    sft_steps: int
    sft_batch: int
    gen_tasks: int
    """Prompts per generation batch; the update stage samples group_size per prompt."""
    group_size: int
    max_new: int
    time_sft_steps: int
    """Timed SFT steps per device (after a warm-up step)."""
    time_gen_batch: int
    demo_timeout_s: int


FULL = Sizes(sft_steps=40, sft_batch=32, gen_tasks=8, group_size=4, max_new=24,
             time_sft_steps=20, time_gen_batch=32, demo_timeout_s=180)
QUICK = Sizes(sft_steps=12, sft_batch=8, gen_tasks=2, group_size=4, max_new=8,
              time_sft_steps=2, time_gen_batch=4, demo_timeout_s=240)


def close(a: float, b: float) -> bool:
    return abs(a - b) <= LOSS_ATOL + LOSS_RTOL * abs(b)


# --------------------------------------------------------------------------- stages

def stage_device(device: torch.device, tok: ByteTokenizer) -> tuple[dict[str, Any], Any]:
    """1: the device resolves and the demo model lives on it."""
    model = build_model(DEMO_SHAPE, tok, seed=0).to(device)
    where = {str(p.device) for p in model.parameters()}
    info: dict[str, Any] = {"device": str(device), "params": n_params(model),
                            "param_devices": sorted(where)}
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["capability"] = list(torch.cuda.get_device_capability(device))
    info["ok"] = where == {str(torch.device(device.type, device.index or 0))
                           if device.type == "cuda" else "cpu"}
    return info, model


def demo_pairs(n: int, seed: int = 7) -> list[tuple[str, str]]:
    return demo_tasks.sft_pairs(demo_tasks.make_tasks(demo_tasks.Split.TRAIN, n, seed),
                                seed=seed)


def stage_sft(model: Any, tok: ByteTokenizer, device: torch.device,
              sizes: Sizes) -> dict[str, Any]:
    """2: the supervised warm start on the device; the loss must fall."""
    losses: list[float] = []
    cfg = SFTConfig(steps=sizes.sft_steps, batch_size=sizes.sft_batch, lr=2e-3,
                    warmup=max(1, sizes.sft_steps // 4))
    stats = sft(model, tok, demo_pairs(2000), cfg, device=device,
                progress=lambda step, loss: losses.append(loss))
    k = max(1, len(losses) // 5)
    first, last = sum(losses[:k]) / k, sum(losses[-k:]) / k
    return {"steps": stats.steps, "seconds": round(stats.seconds, 3),
            "loss_first": round(first, 4), "loss_last": round(last, 4),
            "losses": [round(x, 4) for x in losses], "ok": last < 0.9 * first}


def prompts_of(n: int, tok: ByteTokenizer, seed: int = 12345) -> list[list[int]]:
    tasks = demo_tasks.make_tasks(demo_tasks.Split.HELDOUT, n, seed)
    return [tok.encode(demo_tasks.render_prompt(t)) for t in tasks]


def generate(policy: HFPolicy, prompts: list[list[int]], max_new: int, temperature: float,
             stop: list[str] | None) -> list[Generation]:
    return asyncio.run(policy.generate(prompts, max_new_tokens=max_new,
                                       temperature=temperature, stop=stop))


def trajectories(prompts: list[list[int]], gens: list[Generation], group_size: int,
                 reward: bool = True) -> list[Trajectory]:
    """Single-turn trajectories, prompt i's samples adjacent (group i // group_size).
    Reward: parity of the sum of the sampled ids: deterministic, uncorrelated with
    correctness, and varied within a group, so advantages are non-zero (this checks the
    device code path of the update, not the judge)."""
    out = []
    for i, (p, g) in enumerate(zip(prompts, gens, strict=True)):
        turn = Turn(g.text, g.token_ids, g.logprobs)
        out.append(Trajectory(
            task_id=f"t{i // group_size}", episode_id=f"t{i // group_size}#{i}",
            prompt_ids=tuple(p), turns=(turn,), token_ids=tuple(p) + g.token_ids,
            loss_mask=(0,) * len(p) + (1,) * len(g.token_ids),
            old_logprobs=(0.0,) * len(p) + g.logprobs,
            reward=float(sum(g.token_ids) % 2) if reward else None,
            group_id=f"t{i // group_size}"))
    return out


def logprob_gap(model: Any, trajs: list[Trajectory], temperature: float, pad_id: int,
                device: torch.device) -> float:
    """Max |sampled log-prob - token_logprobs recompute| over the model tokens: what
    the trainer's first-epoch ratio exp(logp - logp_old) departs from 1 by."""
    mb = batch_of(trajs, pad_id, device)
    with torch.no_grad():
        logp = token_logprobs(model, mb["ids"], mb["attn"], temperature)       # (B, T)
    return float(((logp - mb["logp_old"]).abs() * mb["mask"]).max())


def stage_generate(model: Any, tok: ByteTokenizer, device: torch.device,
                   sizes: Sizes) -> tuple[dict[str, Any], list[list[int]], list[Generation]]:
    """3: batched sampling on the device, log-probs consistent with the trainer's."""
    base = prompts_of(sizes.gen_tasks, tok)
    prompts = [p for p in base for _ in range(sizes.group_size)]
    policy = HFPolicy(model, tok, seed=0)
    out: dict[str, Any] = {"policy_device": str(policy.device), "batch": len(prompts)}
    ok = policy.device.type == device.type
    sampled: list[Generation] = []
    for temperature in (1.0, 0.0):
        gens = generate(policy, prompts, sizes.max_new, temperature, ["\n"])
        trajs = trajectories(prompts, gens, sizes.group_size)
        gap = logprob_gap(model, trajs, temperature, tok.pad_id, device)
        reasons: dict[str, int] = {}
        for g in gens:
            reasons[g.finish_reason] = reasons.get(g.finish_reason, 0) + 1
        # a "stop" generation ends exactly at its stop string; "eos" ends with eos
        ends_ok = all(g.text.endswith("\n") for g in gens if g.finish_reason == "stop") \
            and all(g.token_ids[-1] == tok.eos_id for g in gens if g.finish_reason == "eos")
        key = "t1" if temperature else "greedy"
        out[key] = {"tokens": sum(len(g.token_ids) for g in gens), "finish": reasons,
                    "max_abs_logprob_diff": gap, "ends_ok": ends_ok,
                    "sample": [g.text for g in gens[:3]]}
        ok = ok and gap <= LOGPROB_TOL and ends_ok and all(g.token_ids for g in gens)
        if temperature:
            sampled = gens
        else:
            cpu_policy = HFPolicy(copy.deepcopy(model).to("cpu"), tok, seed=0)
            cpu = generate(cpu_policy, prompts, sizes.max_new, 0.0, ["\n"])
            same = sum(a.token_ids == b.token_ids for a, b in zip(gens, cpu, strict=True))
            out["greedy"]["same_as_cpu"] = f"{same}/{len(gens)}"
    out["ok"] = ok
    return out, prompts, sampled


def step_pair(model: Any, trajs: list[Trajectory], device: torch.device, tok: ByteTokenizer,
              ppo: bool) -> dict[str, Any]:
    """One update on the device and one on a CPU copy of the same weights."""
    g = GRPOConfig(group_size=trajs_group(trajs), tasks_per_step=len(trajs)
                   // trajs_group(trajs), micro_batch=max(1, len(trajs) // 2), lr=3e-4,
                   kl_coef=0.05, algorithm=Algorithm.PPO if ppo else Algorithm.GRPO)
    cpu_model = copy.deepcopy(model).to("cpu")
    results: dict[str, UpdateStats] = {}
    after: dict[str, dict[str, torch.Tensor]] = {}
    for name, m, dev in (("device", copy.deepcopy(model).to(device), device),
                         ("cpu", cpu_model, torch.device("cpu"))):
        ref = copy.deepcopy(m).train(False)
        for p in ref.parameters():
            p.requires_grad_(False)
        values, valid = rewards_tensor([t.reward for t in trajs])
        if ppo:
            head = ValueHead(m.config.n_embd).to(dev)
            opt = torch.optim.AdamW(list(m.parameters()) + list(head.parameters()),
                                    lr=g.lr, weight_decay=0.0)
            results[name] = ppo_step(m, head, opt, trajs, valid, g, ref=ref,
                                     temperature=1.0, max_tokens=None,
                                     pad_id=tok.pad_id, device=dev)
        else:
            adv = group_advantages(values.view(-1, g.group_size),
                                   valid.view(-1, g.group_size), Advantage.GRPO).view(-1)
            opt = torch.optim.AdamW(m.parameters(), lr=g.lr, weight_decay=0.0)
            results[name] = policy_step(m, opt, trajs, adv, valid, g, ref=ref,
                                        temperature=1.0, pad_id=tok.pad_id, device=dev)
        after[name] = {k: v.detach().float().cpu() for k, v in m.state_dict().items()}
    d, c = results["device"], results["cpu"]
    moved = max(float((after["device"][k] - model.state_dict()[k].float().cpu()).abs().max())
                for k in after["device"])
    param_gap = max(float((after["device"][k] - after["cpu"][k]).abs().max())
                    for k in after["device"])
    out: dict[str, Any] = {
        "trained_on": d.trained_on, "skipped": d.skipped or c.skipped,
        "loss_device": d.loss, "loss_cpu": c.loss,
        "grad_norm_device": d.grad_norm, "grad_norm_cpu": c.grad_norm,
        "kl_device": d.kl, "clip_frac_device": d.clip_frac,
        "max_param_change": moved, "max_param_diff_device_vs_cpu": param_gap}
    if ppo:
        out["value_loss_device"], out["value_loss_cpu"] = d.value_loss, c.value_loss
    out["ok"] = (d.trained_on > 0 and not out["skipped"] and moved > 0
                 and close(d.loss, c.loss) and close(d.grad_norm, c.grad_norm)
                 and (not ppo or close(d.value_loss, c.value_loss)))
    return out


def trajs_group(trajs: list[Trajectory]) -> int:
    return sum(t.group_id == trajs[0].group_id for t in trajs)


def stage_update(model: Any, tok: ByteTokenizer, device: torch.device, prompts: list[list[int]],
                 gens: list[Generation], sizes: Sizes) -> dict[str, Any]:
    """4: GRPO's policy_step and PPO's ppo_step on the device agree with the CPU."""
    trajs = trajectories(prompts, gens, sizes.group_size)
    rewards = [t.reward for t in trajs]
    out: dict[str, Any] = {"trajectories": len(trajs), "reward_rule": "sum(ids) % 2",
                           "mean_reward": sum(r or 0.0 for r in rewards) / len(rewards),
                           "grpo": step_pair(model, trajs, device, tok, ppo=False),
                           "ppo": step_pair(model, trajs, device, tok, ppo=True)}
    out["ok"] = out["grpo"]["ok"] and out["ppo"]["ok"]
    return out


def timed_sft(shape: ModelConfig, tok: ByteTokenizer, device: torch.device, steps: int,
              batch: int) -> float:
    """SFT steps/s of a fresh model of `shape` (one warm-up step not counted)."""
    model = build_model(shape, tok, seed=0)
    pairs = demo_pairs(batch * (steps + 1))
    sft(model, tok, pairs, SFTConfig(steps=1, batch_size=batch, warmup=1), device=device)
    stats = sft(model, tok, pairs, SFTConfig(steps=steps, batch_size=batch, warmup=1),
                device=device)
    return steps / stats.seconds


def timed_generate(shape: ModelConfig, tok: ByteTokenizer, device: torch.device, batch: int,
                   max_new: int) -> float:
    """Sampled tokens/s at temperature 1, no stop string, one batch (after a warm-up)."""
    model = build_model(shape, tok, seed=0).to(device)
    policy = HFPolicy(model, tok, seed=0)
    prompts = prompts_of(batch, tok)
    generate(policy, prompts[:2], 4, 1.0, None)
    t0 = time.perf_counter()
    gens = generate(policy, prompts, max_new, 1.0, None)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return sum(len(g.token_ids) for g in gens) / (time.perf_counter() - t0)


def stage_timing(tok: ByteTokenizer, device: torch.device, sizes: Sizes,
                 big: bool) -> dict[str, Any]:
    """6: the same work timed on the device and on this machine's CPU."""
    shapes = [("demo", DEMO_SHAPE)] + ([("big", BIG_SHAPE)] if big else [])
    rows = []
    for name, shape in shapes:
        for dev in ([device, torch.device("cpu")] if device.type != "cpu" else [device]):
            # the large shape on CPU: fewer steps (seconds each), same batch
            steps = sizes.time_sft_steps if name == "demo" or dev.type != "cpu" \
                else max(2, sizes.time_sft_steps // 5)
            rows.append({"shape": name, "params": n_params(build_model(shape, tok)),
                         "device": str(dev), "sft_batch": sizes.sft_batch,
                         "sft_steps_timed": steps,
                         "sft_steps_per_s": round(timed_sft(shape, tok, dev, steps,
                                                            sizes.sft_batch), 3),
                         "gen_batch": sizes.time_gen_batch, "gen_max_new": sizes.max_new,
                         "gen_tokens_per_s": round(timed_generate(
                             shape, tok, dev, sizes.time_gen_batch, sizes.max_new), 1)})
    return {"rows": rows, "cpu_threads": torch.get_num_threads(),
            "big": big or "not run (pass --big)", "ok": True}


# --------------------------------------------------------------------------- stage 5

def machine_facts() -> dict[str, Any]:
    """What decides whether the namespace sandbox can start here."""
    facts: dict[str, Any] = {"kernel": platform.release(),
                             "system_python3": os.path.exists("/usr/bin/python3"),
                             "uid": os.getuid()}
    try:
        out = subprocess.run(["stat", "-f", "-c", "%T", "/sys/fs/cgroup"],
                             capture_output=True, text=True, timeout=5)
        facts["cgroup_fs"] = out.stdout.strip() or out.stderr.strip()
    except (OSError, subprocess.SubprocessError) as e:
        facts["cgroup_fs"] = repr(e)
    try:
        with open("/proc/self/cgroup") as f:
            facts["proc_self_cgroup"] = f.read().strip()[:300]
    except OSError as e:
        facts["proc_self_cgroup"] = repr(e)
    return facts


async def demo_stage(device: str, out_dir: str, smoke_dir: str) -> dict[str, Any]:
    """Stage 5, its result also written to out_dir/demo.json."""
    res: dict[str, Any] = {"facts": machine_facts()}
    await demo_run(device, smoke_dir, res)
    with open(os.path.join(out_dir, "demo.json"), "w") as f:
        json.dump(res, f, indent=1, default=str)
    return res


async def demo_run(device: str, smoke_dir: str, res: dict[str, Any]) -> None:
    """The trainer end to end, as `trialbox demo --smoke --device D` does it."""
    try:
        from trialbox.judge.function import judge_pool_config
        from trialbox.sandbox.pool import CellPool
        from trialbox.train.config import RolloutMode, with_changes
        from trialbox.train.demo_run import demo_config
        from trialbox.train.trainer import train
    except Exception as e:  # e.g. opentelemetry missing where the trainer is imported
        res.update(sandbox_ok=False, ok=False, error=f"import: {type(e).__name__}: {e}")
        return
    t0 = time.monotonic()
    try:
        pool = await asyncio.wait_for(CellPool(judge_pool_config(warm=2)).start(), 90)
    except Exception as e:  # any failure to start is the finding
        res.update(sandbox_ok=False, ok=None, sandbox_error=f"{type(e).__name__}: {e}",
                   traceback=traceback.format_exc()[-3000:],
                   sandbox_start_s=round(time.monotonic() - t0, 2))
        return
    res.update(sandbox_ok=True, sandbox_start_s=round(time.monotonic() - t0, 2), runs={})
    try:
        sync = demo_config(0, os.path.join(smoke_dir, "sync"), True, device)
        # the async mode too: weight copies for the producer live on the device as well
        runs = {"sync": sync, "async": with_changes(
            sync, run={"out_dir": os.path.join(smoke_dir, "async")},
            rollout={"mode": RolloutMode.ASYNC, "max_staleness": 1})}
        for mode, config in runs.items():
            run: dict[str, Any] = {"ok": False}
            res["runs"][mode] = run
            r = await train(config, pool)
            with open(os.path.join(config.run.out_dir, "metrics.jsonl")) as f:
                records = [json.loads(x) for x in f]
            run.update(pass_before=r.pass_before, pass_after=r.pass_after,
                       steps=r.steps_done, stopped=r.stopped, wall_s=round(r.wall_s, 2),
                       sft_s=round(r.sft_seconds, 2), records=records,
                       ok=r.steps_done == config.grpo.steps and not r.stopped
                       and r.pass_before is not None and r.pass_after is not None)
        res["ok"] = all(run["ok"] for run in res["runs"].values())
    except Exception as e:
        res.update(ok=False, error=f"{type(e).__name__}: {e}",
                   traceback=traceback.format_exc()[-3000:])
    finally:
        await pool.close()


def run_demo_child(device: str, out_dir: str, timeout_s: int) -> dict[str, Any]:
    """Stage 5 in a child process: a sandbox that hangs cannot hang the check, and the
    recipe's torch thread setting does not leak into the timings."""
    with tempfile.TemporaryDirectory(prefix="gpu-check-demo-") as smoke_dir:
        cmd = [sys.executable, os.path.abspath(__file__), "--stage", "demo", "--device",
               device, "--out", out_dir, "--smoke-dir", smoke_dir]
        t0 = time.monotonic()
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired as e:
            tail = (e.stdout or b"")[-2000:]
            return {"ok": None, "sandbox_ok": None,
                    "error": f"timed out after {timeout_s}s", "stdout_tail": str(tail)}
        path = os.path.join(out_dir, "demo.json")
        if os.path.exists(path):
            with open(path) as f:
                res: dict[str, Any] = json.load(f)
        else:
            res = {"ok": False, "error": f"child exited {p.returncode} with no demo.json"}
        res["child_wall_s"] = round(time.monotonic() - t0, 1)
        res["stderr_tail"] = p.stderr[-2000:]
        return res


# --------------------------------------------------------------------------- main

def run_stage(name: str, report: dict[str, Any], out_path: str, fn: Any, *args: Any) -> Any:
    """Run one stage, record its result (or its error) and rewrite the report, so a
    check cut short by a deadline still leaves what it measured."""
    print(f"[gpu_check] {name} ...", flush=True)
    t0 = time.monotonic()
    value: Any = None
    try:
        value = fn(*args)
        result = value[0] if isinstance(value, tuple) else value
    except Exception as e:
        result = {"ok": False, "error": f"{type(e).__name__}: {e}",
                  "traceback": traceback.format_exc()[-3000:]}
    result["stage_s"] = round(time.monotonic() - t0, 2)
    report["stages"][name] = result
    print(f"[gpu_check] {name}: ok={result.get('ok')} ({result['stage_s']}s)", flush=True)
    with open(out_path, "w") as f:
        json.dump(report, f, indent=1, default=str)
    return value if "error" not in result else None


def summary(report: dict[str, Any]) -> str:
    lines = [f"device {report['device']}  torch {report['torch']}  "
             f"transformers {report['transformers']}"]
    for name, r in report["stages"].items():
        lines.append(f"  {name:<9} ok={r.get('ok')}" + (f"  {r['error']}" if 'error' in r
                                                        else ""))
    st = report["stages"]
    if "generate" in st and "t1" in st["generate"]:
        g = st["generate"]
        lines.append(f"  log-prob gap: t=1 {g['t1']['max_abs_logprob_diff']:.2e}, greedy "
                     f"{g['greedy']['max_abs_logprob_diff']:.2e}; greedy same as CPU "
                     f"{g['greedy'].get('same_as_cpu')}")
    for algo in ("grpo", "ppo"):
        u = st.get("update", {}).get(algo)
        if u:
            lines.append(f"  {algo}: loss device {u['loss_device']:.6f} cpu "
                         f"{u['loss_cpu']:.6f}; grad norm {u['grad_norm_device']:.6f} / "
                         f"{u['grad_norm_cpu']:.6f}")
    if "demo" in st:
        d = st["demo"]
        if d.get("sandbox_ok") is False:
            lines.append(f"  demo: sandbox could not start: {d.get('sandbox_error')}")
        for mode, r in d.get("runs", {}).items():
            lines.append(f"  demo ({mode}): ok={r['ok']} pass@1 {r.get('pass_before')} -> "
                         f"{r.get('pass_after')}, {r.get('steps')} GRPO steps, "
                         f"{r.get('wall_s')}s")
    if "timing" in st and "rows" in st["timing"]:
        lines.append("  | shape | params | device | SFT steps/s | gen tokens/s |")
        lines.append("  |---|---|---|---|---|")
        for r in st["timing"]["rows"]:
            lines.append(f"  | {r['shape']} | {r['params'] / 1e6:.2f}M | {r['device']} | "
                         f"{r['sft_steps_per_s']} | {r['gen_tokens_per_s']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu")
    ap.add_argument("--out", required=True, help="directory for gpu_check.json")
    ap.add_argument("--quick", action="store_true", help="small sizes (CPU tests)")
    ap.add_argument("--big", action="store_true",
                    help="also time a ~25M-parameter shape")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch CPU threads (0: torch's default); 1 is fastest on a "
                         "shared, loaded CPU")
    ap.add_argument("--skip-demo", action="store_true",
                    help="do not run stage 5 (recorded as skipped)")
    ap.add_argument("--stage", default="all", choices=["all", "demo"], help=argparse.SUPPRESS)
    ap.add_argument("--smoke-dir", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    if args.stage == "demo":
        res = asyncio.run(demo_stage(args.device, args.out, args.smoke_dir))
        return 0 if res.get("ok") is not False else 1

    sizes = QUICK if args.quick else FULL
    if args.threads:
        torch.set_num_threads(args.threads)
    import transformers
    report: dict[str, Any] = {
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "device": args.device, "torch": torch.__version__,
        "transformers": transformers.__version__, "python": platform.python_version(),
        "cpus": os.cpu_count(), "load_avg_start": os.getloadavg(),
        "cuda_available": torch.cuda.is_available(), "sizes": sizes.__dict__,
        "stages": {}}
    out_path = os.path.join(args.out, "gpu_check.json")
    tok = ByteTokenizer()
    torch.manual_seed(0)

    got = run_stage("device", report, out_path, lambda: stage_device(
        resolve_device(args.device), tok))
    if got is not None:
        device, model = torch.device(args.device), got[1]
        run_stage("sft", report, out_path, stage_sft, model, tok, device, sizes)
        gen = run_stage("generate", report, out_path, stage_generate, model, tok, device,
                        sizes)
        if gen is not None:
            run_stage("update", report, out_path, stage_update, model, tok, device,
                      gen[1], gen[2], sizes)
        run_stage("timing", report, out_path, stage_timing, tok, device, sizes, args.big)
    if args.skip_demo:
        report["stages"]["demo"] = {"ok": None, "skipped": "--skip-demo"}
    else:
        run_stage("demo", report, out_path, run_demo_child, args.device, args.out,
                  sizes.demo_timeout_s)
    report["load_avg_end"] = os.getloadavg()
    with open(out_path, "w") as f:
        json.dump(report, f, indent=1, default=str)
    print(summary(report), flush=True)
    # stage 5's sandbox failing to start is a finding about the machine (ok None), not a
    # failure of the trainer's device path
    failed = [n for n, r in report["stages"].items() if r.get("ok") is False]
    if failed:
        print(f"[gpu_check] FAILED: {', '.join(failed)}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
