"""A scheduler run for the crash test, run as a separate process and killed with SIGKILL.

    python -m tests.schedule.crash_worker JOURNAL N EFFECTS

Submits tasks t0..t{N-1} (idempotently: a restart submits them all again), prints READY
once recovery is done, and runs until every task is final. Each job appends
"start TASK ATTEMPT" to EFFECTS when it begins, so the test can check that no job ever
started without its GENERATING move being in the journal first.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import sys

from trialbox.sandbox.fake import FakeSandbox
from trialbox.schedule.quotas import Capacity
from trialbox.schedule.scheduler import Scheduler, SchedulerConfig, TaskContext, TaskSpec
from trialbox.store.journal import Journal
from trialbox.types import ExecResult, ExecStatus


def reward_of(task_id: str) -> float:
    return hashlib.sha256(task_id.encode()).digest()[0] / 255


async def handler(argv, stdin, files):
    await asyncio.sleep(0.003)
    return ExecResult(ExecStatus.OK, exit_code=0, runtime="sim@sha256:0")


async def opener(limits):
    return FakeSandbox(handler, limits)


async def main(db: str, n: int, effects: str) -> None:
    fd = os.open(effects, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    rng = random.Random()

    async def job(ctx: TaskContext) -> float | None:
        os.write(fd, f"start {ctx.task_id} {ctx.attempt}\n".encode())
        for turn in range(len(ctx.turns), 2):
            await asyncio.sleep(0.01 + 0.02 * rng.random())
            async with ctx.lease() as sb:
                r = await sb.exec(["python3", "main.py"])
            ctx.observe(r)
            await ctx.record_turn({"turn": turn, "attempt": ctx.attempt})
        await ctx.grading()
        return reward_of(ctx.task_id)

    cfg = SchedulerConfig(max_active=16, capacity=Capacity(64, 1 << 20, 1 << 20),
                          sandbox_rate=1e6, sandbox_burst=1000)
    with Journal(db) as j:
        async with Scheduler(j, "crash", job, cfg, opener=opener) as s:
            print(f"READY recovered={s.stats.recovered}", flush=True)
            await s.submit([TaskSpec(f"t{i}") for i in range(n)])
            await s.drain()
    print("FINISHED", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3]))
