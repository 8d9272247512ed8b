"""HumanEval's 164 canonical solutions judged on a built image, plus the image's
verification costs (issue 17). Usage (root):

    python scripts/image_check.py IMAGE_DIR [--repeat N]

Prints one JSON line: pass@1 and outcomes by environment over all 164, the pool-start
full re-hash's seconds, a full re-hash's seconds, and the before-task check's cost (the
inotify read, per call, and the build seal's lstat walk for comparison).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

from trialbox.judge.evaluate import evaluate
from trialbox.judge.function import JudgeConfig, judge_pool_config
from trialbox.sandbox import CellPool
from trialbox.sandbox import image as img
from trialbox.sandbox import image_manifest as im
from trialbox.store.tasks import load_humaneval
from trialbox.types import Limits


async def main(args: argparse.Namespace) -> dict[str, object]:
    image = img.load_image(args.image)
    tasks = {t.task_id: t for t in load_humaneval()}
    samples = [{"task_id": t.task_id, "completion": t.canonical_solution}
               for t in tasks.values()]
    lim = Limits(wall_s=20, cpu_s=10, memory_mb=256, disk_mb=16)
    config = JudgeConfig(candidate_limits=lim, harness_limits=lim)
    t0 = time.monotonic()
    pool = await CellPool(judge_pool_config(warm=4, image=image.dir)).start()
    start_s = time.monotonic() - t0
    try:
        t0 = time.monotonic()
        rows, summary = await evaluate(tasks, samples, pool, repeat=args.repeat, workers=4,
                                       config=config)
        eval_s = time.monotonic() - t0
        guard = pool.image_guard
        assert guard is not None
        n = 10_000
        t0 = time.perf_counter()
        for _ in range(n):
            guard.cheap()
        watch_us = (time.perf_counter() - t0) / n * 1e6
        t0 = time.monotonic()
        guard.full()
        full_s = time.monotonic() - t0
        seal = image.seal()
        t0 = time.perf_counter()
        im.check_seal(image.rootfs, seal)
        seal_ms = (time.perf_counter() - t0) * 1e3
        counts = dict(guard.counts)
    finally:
        await pool.close()
    return {"image": image.id, "tasks": len(rows), "pass@1": summary["pass@1"],
            "outcomes_by_environment": summary["outcomes_by_environment"],
            "eval_s": round(eval_s, 1), "pool_start_s_with_full_check": round(start_s, 2),
            "full_rehash_s": round(full_s, 2), "cheap_watch_us_per_check": round(watch_us, 2),
            "cheap_lstat_seal_ms": round(seal_ms, 1), "files": len(seal),
            "checks": counts}


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("image")
    p.add_argument("--repeat", type=int, default=1)
    print(json.dumps(asyncio.run(main(p.parse_args()))))
