"""The scheduler over the real namespace tier: an episode's files survive between its
leases, the session is parked (no cell held) while the policy thinks, the runtime hash
of what ran is journaled, and nothing leaks."""

from __future__ import annotations

import asyncio
import sqlite3

from tests.sandbox.conftest import no_leaks
from tests.schedule.journal_checks import check_journal
from trialbox.sandbox import NamespaceSandbox, run_code
from trialbox.schedule.quotas import Capacity
from trialbox.schedule.scheduler import Scheduler, SchedulerConfig, TaskContext, TaskSpec
from trialbox.store.journal import Journal
from trialbox.types import ExecStatus, Limits


def test_scheduler_leases_real_sandboxes_only_while_code_runs(runner, tmp_path):
    db = str(tmp_path / "j.db")
    parked_while_thinking: list[bool] = []

    async def opener(limits):
        return await NamespaceSandbox.open(runner.pool, limits)

    async def job(ctx: TaskContext) -> float | None:
        async with ctx.lease() as sb:
            r = await run_code(sb, f"open('s.txt', 'w').write({ctx.task_id!r})")
            assert r.status is ExecStatus.OK, r.stderr
        ctx.observe(r)
        assert isinstance(sb, NamespaceSandbox)
        parked_while_thinking.append(sb.parked)
        await asyncio.sleep(0.01)  # the model thinks
        async with ctx.lease() as sb:
            r = await run_code(sb, "print(open('s.txt').read())")
        ctx.observe(r)
        await ctx.record_turn({"stdout": r.stdout_text})
        await ctx.grading()
        return 1.0 if r.stdout_text.strip() == ctx.task_id else 0.0

    async def body():
        with Journal(db) as j:
            cfg = SchedulerConfig(max_active=3, limits=Limits(wall_s=5, cpus=0.5),
                                  capacity=Capacity(2, 8192, 8192))
            async with Scheduler(j, "real", job, cfg, opener=opener) as s:
                await s.submit([TaskSpec(f"ep{i}") for i in range(4)])
                await s.drain()
                assert s.leaser.open_sessions == 0  # every session closed at the end

    runner.run(body())
    assert check_journal(db, "real") == {f"ep{i}": ("done", 1.0) for i in range(4)}
    assert parked_while_thinking == [True] * 4
    runtimes = {r[0] for r in sqlite3.connect(db).execute(
        "SELECT runtime FROM transitions WHERE new='grading'")}
    assert len(runtimes) == 1 and "@sha256:" in runtimes.pop()
    no_leaks(runner)
