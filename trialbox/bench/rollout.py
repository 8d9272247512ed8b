"""`trialbox bench rollout`: the agent loop's batching, measured. The same episodes run
with one `generate` call per turn for every waiting episode (`batched`, the default) and
with one call per episode-turn (`per-episode`, `AgentConfig(max_batch=1)`: what a loop
that drives each episode on its own does), side by side in the same run.

    trialbox bench rollout [--json] [--out FILE] [--tasks 4] [--group 4] [--turns 2]
                           [--max-new-tokens 48] [--rounds 3] [--layers 2] [--width 64]

Work (identical for both systems): a tiny GPT-2-shaped model built from a config with
the byte tokenizer (seeded; no download), greedy decoding (temperature 0, so both
systems generate the same tokens and run and judge the same code), `--tasks` function
tasks × `--group` episodes × `--turns` turns, each turn's code run in the episode's
session and graded by the trusted judge in real sandboxes. A random model's code always
fails, so every episode runs all its turns.

Figures per system (medians over `--rounds`, systems interleaved): wall time,
episodes/s, generated tokens/s, generate calls and mean batch, time in generate, wall
time with a turn in the environment, and the share of wall time the policy was not
generating (waiting on environments or on other episodes). The ratio column is batched
over per-episode (for times: per-episode / batched, so > 1 means batched is faster).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import time
from dataclasses import replace
from typing import Any

from trialbox.bench import report
from trialbox.errors import UsageError
from trialbox.rollout.agent import AgentConfig, RolloutBatch, rollout
from trialbox.types import Task, TaskKind, TestCase

SYSTEMS = ("batched", "per-episode")


def add_parser(bsub: Any) -> None:
    p = bsub.add_parser("rollout", help="agent-loop throughput: batched generation across "
                        "episodes vs one generate call per episode")
    p.add_argument("--tasks", type=int, default=4, help="function tasks (4, at most 4)")
    p.add_argument("--group", type=int, default=4, help="episodes per task (4)")
    p.add_argument("--turns", type=int, default=2, help="turns per episode (2)")
    p.add_argument("--max-new-tokens", type=int, default=48, help="tokens per turn (48)")
    p.add_argument("--rounds", type=int, default=3, help="timed rounds per system (3)")
    p.add_argument("--layers", type=int, default=2, help="model layers (2)")
    p.add_argument("--width", type=int, default=64, help="model width (64)")
    report.add_output_arguments(p)
    p.set_defaults(handler=main)


def bench_tasks(n: int) -> list[Task]:
    specs = [("square", "x * x", [(3, 9)], [(7, 49), (-2, 4)]),
             ("inc", "x + 1", [(1, 2)], [(41, 42), (-1, 0)]),
             ("double", "2 * x", [(2, 4)], [(50, 100), (0, 0)]),
             ("negate", "-x", [(5, -5)], [(-8, 8), (0, 0)])]
    return [Task(task_id=f"bench/{name}", kind=TaskKind.FUNCTION, entry_point=name,
                 prompt=f'def {name}(x):\n    """Return {body}."""\n',
                 visible_tests=tuple(TestCase(f"v{i}", f"assert candidate({a}) == {b}")
                                     for i, (a, b) in enumerate(vis)),
                 hidden_tests=tuple(TestCase(f"h{i}", f"assert candidate({a}) == {b}")
                                    for i, (a, b) in enumerate(hid)))
            for name, body, vis, hid in specs[:n]]


def _check(args: argparse.Namespace) -> dict[str, Any]:
    p = {"tasks": args.tasks, "group": args.group, "turns": args.turns,
         "max_new_tokens": args.max_new_tokens, "rounds": args.rounds,
         "layers": args.layers, "width": args.width}
    for k, v in p.items():
        if v < 1:
            raise UsageError(f"bench rollout: --{k.replace('_', '-')} must be >= 1, got {v}")
    if p["tasks"] > 4:
        raise UsageError("bench rollout: --tasks is at most 4 (the built-in tasks)")
    if p["width"] % 2:
        raise UsageError("bench rollout: --width must be even (2 attention heads)")
    return p


def _figures(batch: RolloutBatch) -> dict[str, Any]:
    s = batch.stats
    return {"wall_s": s.wall_s, "episodes_per_s": s.episodes / s.wall_s,
            "tokens_per_s": s.model_tokens / s.wall_s, "gen_calls": float(s.gen_calls),
            "mean_batch": sum(s.batch_sizes) / max(1, len(s.batch_sizes)),
            "gen_s": s.gen_s, "env_wall_s": s.env_wall_s,
            "policy_idle_share": 1.0 - s.gen_s / s.wall_s,
            "turns": float(s.turns), "model_tokens": float(s.model_tokens),
            "excluded": float(s.excluded)}


async def _run(p: dict[str, Any], pool: Any = None) -> dict[str, Any]:
    """Both systems, interleaved round by round, on `pool` (default: a judge pool of its
    own, closed at the end)."""
    import torch
    from transformers import GPT2Config

    from trialbox.judge.function import judge_pool_config
    from trialbox.rollout.hf_policy import HFPolicy
    from trialbox.rollout.policy import ByteTokenizer
    from trialbox.sandbox import CellPool

    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=258, n_positions=2048, n_embd=p["width"],
                     n_layer=p["layers"], n_head=2, bos_token_id=256, eos_token_id=256)
    policy = HFPolicy.from_config(cfg, ByteTokenizer(), seed=0)
    tasks = bench_tasks(p["tasks"])
    base = AgentConfig(max_new_tokens=p["max_new_tokens"], temperature=0.0,
                       max_context_tokens=2048)
    configs = {"batched": base, "per-episode": replace(base, max_batch=1)}
    own_pool = pool is None
    if own_pool:
        pool = await CellPool(judge_pool_config()).start()
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in SYSTEMS}
    tokens: dict[str, list[tuple[int, ...]]] = {}
    problems: list[str] = []
    try:
        await rollout(policy, tasks[:1], group_size=1, max_turns=1, config=base, pool=pool)
        for r in range(p["rounds"]):
            order = SYSTEMS if r % 2 == 0 else tuple(reversed(SYSTEMS))
            for name in order:
                batch = await rollout(policy, tasks, group_size=p["group"],
                                      max_turns=p["turns"], config=configs[name], pool=pool)
                runs[name].append(_figures(batch))
                tokens.setdefault(name, [t.token_ids for t in batch.trajectories])
                if batch.stats.excluded:
                    problems.append(f"{name} round {r}: {batch.stats.excluded} episodes "
                                    "excluded (infrastructure failures)")
    finally:
        if own_pool:
            await pool.close()
    same = tokens.get("batched") == tokens.get("per-episode")
    med = {name: {k: report.median([x[k] for x in runs[name]]) for k in runs[name][0]}
           for name in SYSTEMS}
    notes = [
        "Greedy decoding: both systems generate the same tokens, so they run and judge "
        "the same code; identical trajectories in both systems: "
        + ("yes." if same else "NO (float differences between batch sizes flipped a "
           "greedy choice; the work differs slightly)."),
        "policy idle share = 1 - time in generate / wall time: the share of the run in "
        "which no generate call was running (the model waited on environments). "
        "Per-episode, environments overlap other episodes' calls, so it is low, but each "
        "call serves one prompt.",
        "CPU-only, shared machine: quote the ratios, not the absolute figures."]
    return {"params": p, "systems": med, "rounds": runs, "identical": same,
            "ratio_episodes_per_s": med["batched"]["episodes_per_s"]
            / med["per-episode"]["episodes_per_s"],
            "notes": notes, "problems": problems}


def render_table(res: dict[str, Any]) -> str:
    m, p, s = res["machine"], res["params"], res["systems"]
    b, e = s["batched"], s["per-episode"]
    w = 16
    lines = [
        (f"trialbox bench rollout — {m['nproc']} CPUs ({m['cpu_model'] or 'unknown'}), "
         f"{m['memory_gib']} GiB, Python {m['python']}, {m['date']}"),
        (f"{p['tasks']} tasks x {p['group']} episodes x {p['turns']} turns, "
         f"{p['max_new_tokens']} new tokens per turn, GPT-2-shaped {p['layers']}x"
         f"{p['width']} model (CPU, greedy); median of {p['rounds']} rounds; load "
         f"average {report.fmt(m.get('loadavg_start', [math.nan])[0])} at start"),
        "",
        f"{'':<36}{'batched':>{w}}{'per-episode':>{w}}{'ratio':>10}",
    ]

    def row(name: str, key: str, nd: int = 2, invert: bool = False,
            ratio: bool = True) -> None:
        a, bb = b[key], e[key]
        rt = (bb / a if invert else a / bb) if a and bb and ratio else math.nan
        lines.append(f"{name:<36}{report.fmt(a, nd):>{w}}{report.fmt(bb, nd):>{w}}"
                     f"{(report.fmt(rt) + 'x') if math.isfinite(rt) else '-':>10}")

    row("wall time, s", "wall_s", invert=True)
    row("episodes/s", "episodes_per_s")
    row("generated tokens/s", "tokens_per_s", 1)
    row("generate calls", "gen_calls", 0)
    row("mean batch", "mean_batch", 1)
    row("time in generate, s", "gen_s", invert=True)
    row("wall with a turn in the env, s", "env_wall_s", invert=True)
    row("policy idle share", "policy_idle_share", 3, ratio=False)
    return "\n".join(lines + report.notes_and_problems(res))


def main(args: argparse.Namespace) -> int:
    p = _check(args)
    machine = report.machine_info()
    t0 = time.monotonic()
    res = asyncio.run(_run(p))
    res["machine"] = machine
    res["duration_s"] = round(time.monotonic() - t0, 1)
    report.emit(res, args, render_table(res))
    return 0 if not res["problems"] else 1
