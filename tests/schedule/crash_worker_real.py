"""A scheduler run over the real namespace tier, for the kill -9 test.

    python -m tests.schedule.crash_worker_real JOURNAL N

Starts its own CellPool (whose start reaps what dead pools left), prints
"READY <pool id> <reaped counts as JSON>", runs N two-turn episodes (each turn a real
program in the episode's sandbox) until all are final, prints FINISHED.
"""

from __future__ import annotations

import asyncio
import json
import sys

from trialbox.sandbox import CellPool, NamespaceSandbox, PoolConfig, run_code
from trialbox.schedule.quotas import Capacity
from trialbox.schedule.scheduler import Scheduler, SchedulerConfig, TaskContext, TaskSpec
from trialbox.store.journal import Journal
from trialbox.types import ExecStatus, Limits


async def main(db: str, n: int) -> None:
    pool = await CellPool(PoolConfig(warm=2)).start()
    try:
        async def opener(limits):
            return await NamespaceSandbox.open(pool, limits)

        async def job(ctx: TaskContext) -> float | None:
            for turn in range(len(ctx.turns), 2):
                async with ctx.lease() as sb:
                    r = await run_code(sb, f"import time; time.sleep(0.15); print({turn})")
                if r.status is ExecStatus.INFRA:
                    return None
                ctx.observe(r)
                await ctx.record_turn({"turn": turn, "stdout": r.stdout_text})
            return 1.0

        cfg = SchedulerConfig(max_active=3, limits=Limits(wall_s=10, cpus=0.3),
                              capacity=Capacity(2, 8192, 8192))
        with Journal(db) as j:
            async with Scheduler(j, "real-crash", job, cfg, opener=opener) as s:
                print(f"READY {pool.id} {json.dumps(pool.reaped)}", flush=True)
                await s.submit([TaskSpec(f"e{i}") for i in range(n)])
                await s.drain()
    finally:
        await pool.close()
    print("FINISHED", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
