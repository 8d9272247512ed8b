"""Fill the disk while the scheduler writes its journal (run with RLIMIT_FSIZE set by the
test, SIGXFSZ ignored, so writes past the limit fail with EFBIG as on a full disk).

    python -m tests.schedule.fulldisk_worker JOURNAL

Prints the error it stopped with and exits 3 on a JournalError, 0 if it never failed.
"""

from __future__ import annotations

import asyncio
import sys

from trialbox.sandbox.fake import FakeSandbox
from trialbox.schedule.quotas import Capacity
from trialbox.schedule.scheduler import Scheduler, SchedulerConfig, TaskContext, TaskSpec
from trialbox.store.journal import Journal, JournalError


async def opener(limits):
    return FakeSandbox(limits=limits)


async def job(ctx: TaskContext) -> float | None:
    for turn in range(len(ctx.turns), 3):
        await ctx.record_turn({"turn": turn, "output": "x" * 20_000})
    return 1.0


async def main(db: str) -> int:
    cfg = SchedulerConfig(max_active=8, capacity=Capacity(64, 1 << 20, 1 << 20))
    with Journal(db) as j:
        async with Scheduler(j, "big", job, cfg, opener=opener) as s:
            try:
                await s.submit([TaskSpec(f"b{i}") for i in range(200)])
                await s.drain()
            except JournalError as e:
                print(f"JournalError: {e}", flush=True)
                return 3
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1])))
