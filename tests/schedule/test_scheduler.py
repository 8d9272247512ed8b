"""The scheduler on the fake sandbox: the lifecycle a task really goes through, leases
only while code runs, retries only for infrastructure failures, timeouts, preemption
with turns and files kept, cancellation, backpressure, recovery after a stop."""

from __future__ import annotations

import asyncio
import os
import sqlite3

import pytest

from tests.schedule.journal_checks import check_journal
from trialbox.errors import InfraError, SandboxStartError, UsageError
from trialbox.sandbox.fake import FakeSandbox
from trialbox.schedule.queues import QueueFull
from trialbox.schedule.quotas import Capacity
from trialbox.schedule.scheduler import Scheduler, SchedulerConfig, TaskContext, TaskSpec
from trialbox.store.journal import Journal
from trialbox.telemetry.metrics import use_metrics
from trialbox.types import ExecResult, ExecStatus, Limits

BIG = Capacity(cpus=64, memory_mb=1 << 20, disk_mb=1 << 20)


def config(**kw) -> SchedulerConfig:
    base = dict(max_active=4, capacity=BIG, backoff_s=0.001, backoff_max_s=0.002,
                sandbox_rate=1e6, sandbox_burst=1000)
    base.update(kw)
    return SchedulerConfig(**base)


class World:
    """Fake sandboxes that record what happens to them."""

    def __init__(self) -> None:
        self.opened: list[FakeSandbox] = []
        self.running = 0

    async def handler(self, argv, stdin, files):
        self.running += 1
        await asyncio.sleep(0.002)
        self.running -= 1
        return ExecResult(ExecStatus.OK, exit_code=0, runtime="py3@sha256:feed", tier="fake")

    async def opener(self, limits):
        sb = FakeSandbox(self.handler, limits)
        self.opened.append(sb)
        return sb


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


async def two_turns(ctx: TaskContext) -> float | None:
    for turn in range(len(ctx.turns), 2):
        await asyncio.sleep(0.001)  # the policy thinks: no sandbox held
        async with ctx.lease() as sb:
            await sb.write_file(f"turn{turn}.py", b"print(1)")
            r = await sb.exec(["python3", f"turn{turn}.py"])
        ctx.observe(r)
        await ctx.record_turn({"turn": turn, "status": r.status.value})
    await ctx.grading()
    await ctx.record_grade({"outcome": "passed"})
    return 1.0


def test_a_run_journals_every_move_and_one_reward_per_task(tmp_path):
    db = str(tmp_path / "j.db")
    world = World()

    async def body():
        with Journal(db) as j:
            async with Scheduler(j, "r1", two_turns, config(), opener=world.opener) as s:
                assert await s.submit([TaskSpec(f"t{i}") for i in range(20)]) == 20
                assert await s.submit([TaskSpec("t3"), TaskSpec("t20")]) == 1  # idempotent
                await s.drain()
                return s.stats

    with use_metrics() as metrics:
        stats = run(body())
    # /metrics and the dashboard count tasks by state from the scheduler's moves
    assert {k: v for k, v in metrics.tasks.items() if v} == {"done": 21}
    finals = check_journal(db, "r1", {f"t{i}" for i in range(21)})
    assert set(finals.values()) == {("done", 1.0)}
    assert stats.finals == {"done": 21} and stats.preemptions == 0
    c = sqlite3.connect(db)
    # the path, in order, for one task
    path = [r[0] for r in c.execute("SELECT new FROM transitions WHERE task_id='t0' "
                                    "ORDER BY seq")]
    assert path == ["pending", "queued", "generating", "executing", "generating",
                    "executing", "generating", "grading", "done"]
    sandbox, runtime = c.execute("SELECT sandbox, runtime FROM transitions WHERE "
                                 "task_id='t0' AND new='grading'").fetchone()
    assert sandbox.startswith("fake:") and runtime == "py3@sha256:feed"
    assert c.execute("SELECT count(*) FROM turns").fetchone()[0] == 42
    assert c.execute("SELECT count(*) FROM grades").fetchone()[0] == 21
    assert c.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    # one session per task, parked after each of its two leases, closed at the end
    assert len(world.opened) == 21
    assert all(sb.parks == 2 and sb.closed for sb in world.opened)


def test_only_infrastructure_failures_are_retried(tmp_path):
    db = str(tmp_path / "j.db")
    calls: dict[str, int] = {}

    async def job(ctx: TaskContext) -> float | None:
        calls[ctx.task_id] = calls.get(ctx.task_id, 0) + 1
        kind = ctx.payload
        if kind == "flaky" and ctx.attempt < 3:
            raise SandboxStartError("the pool could not start a cell")
        if kind == "broken-infra":
            return None  # e.g. the judge's sandbox kept failing: reward excluded
        if kind == "bug":
            raise ValueError("a bug in the job")
        return 0.0  # a wrong answer is a reward, not a failure

    async def body():
        with Journal(db) as j:
            async with Scheduler(j, "r", job, config(max_retries=2)) as s:
                await s.submit([TaskSpec(k, payload=k) for k in
                                ("flaky", "broken-infra", "bug", "wrong")])
                await s.drain()

    run(body())
    finals = check_journal(db, "r", {"flaky", "broken-infra", "bug", "wrong"})
    assert finals == {"flaky": ("done", 0.0), "broken-infra": ("failed", None),
                      "bug": ("failed", None), "wrong": ("done", 0.0)}
    assert calls == {"flaky": 3, "broken-infra": 3, "bug": 1, "wrong": 1}
    c = sqlite3.connect(db)
    causes = c.execute("SELECT task_id, cause, count(*) FROM transitions WHERE "
                       "new='retrying' GROUP BY task_id").fetchall()
    assert sorted(causes) == [("broken-infra", "infra", 2), ("flaky", "infra", 2)]
    msg = c.execute("SELECT message FROM results JOIN transitions USING (run_id, task_id) "
                    "WHERE task_id='bug' AND new='failed'").fetchone()[0]
    assert "ValueError: a bug in the job" in msg
    attempt = c.execute("SELECT attempt FROM results WHERE task_id='flaky'").fetchone()[0]
    assert attempt == 3
    from trialbox.store.records import Records
    with Records(db) as r:
        # 4 infra failures (2 flaky + 3 broken - the last one is FAILED: also infra) over
        # 3 + 3 + 1 + 1 attempts
        assert r.infra_failure_rate("r") == pytest.approx(5 / 8)


def test_turn_and_task_timeouts(tmp_path):
    db = str(tmp_path / "j.db")

    async def job(ctx: TaskContext) -> float | None:
        for _ in range(ctx.payload["turns"]):
            await asyncio.sleep(ctx.payload["think"])
            async with ctx.lease():
                pass
        return 1.0

    async def body():
        with Journal(db) as j:
            cfg = config(turn_timeout_s=0.2, task_timeout_s=0.5)
            async with Scheduler(j, "r", job, cfg, opener=World().opener) as s:
                await s.submit([
                    TaskSpec("quick", {"turns": 3, "think": 0.01}),
                    TaskSpec("slow-turn", {"turns": 1, "think": 5}),
                    # every turn is within the turn limit; together they are not
                    TaskSpec("long-task", {"turns": 8, "think": 0.1}),
                ])
                await s.drain()

    run(body())
    finals = check_journal(db, "r")
    assert finals == {"quick": ("done", 1.0), "slow-turn": ("timed_out", None),
                      "long-task": ("timed_out", None)}


def test_preemption_keeps_turns_and_files(tmp_path):
    """One slot. A low-priority episode is mid-way; urgent work arrives: the episode is
    preempted (PREEMPTED -> QUEUED), the urgent task runs, then the episode resumes from
    its journaled turns in the same (parked) session, its files intact."""
    db = str(tmp_path / "j.db")
    world = World()
    seen: dict[str, list] = {}
    order: list[str] = []
    low_started = asyncio.Event()

    async def job(ctx: TaskContext) -> float | None:
        seen.setdefault(ctx.task_id, []).append(list(ctx.turns))
        for turn in range(len(ctx.turns), 3):
            async with ctx.lease() as sb:
                if turn > 0:  # the file written in the previous turn is still there
                    assert await sb.read_file(f"t{turn - 1}") == b"x"
                await sb.write_file(f"t{turn}", b"x")
            await ctx.record_turn({"turn": turn})
            if ctx.task_id == "low":
                low_started.set()
                await asyncio.sleep(0.3)  # thinking: this is when it gets preempted
        order.append(ctx.task_id)
        return 1.0

    async def body():
        with Journal(db) as j:
            async with Scheduler(j, "r", job, config(max_active=1),
                                 opener=world.opener) as s:
                await s.submit([TaskSpec("low", priority=2)])
                await low_started.wait()
                await s.submit([TaskSpec("urgent", priority=0)])
                await s.drain()
                return s.stats

    stats = run(body())
    check_journal(db, "r", {"low", "urgent"})
    assert order == ["urgent", "low"] and stats.preemptions == 1
    assert seen["low"][0] == [] and seen["low"][1] == [{"turn": 0}]
    assert len(world.opened) == 2  # one session each: low resumed in its parked session
    c = sqlite3.connect(db)
    path = [r[0] for r in c.execute("SELECT new FROM transitions WHERE task_id='low' "
                                    "ORDER BY seq")]
    i = path.index("preempted")
    assert path[i - 1] == "generating" and path[i + 1] == "queued"
    from trialbox.store.records import Records
    with Records(db) as r:
        assert r.history("low")[0].preemptions == 1


def test_cancel_queued_and_running_tasks(tmp_path):
    db = str(tmp_path / "j.db")
    started = asyncio.Event()

    async def job(ctx: TaskContext) -> float | None:
        started.set()
        await asyncio.sleep(30)
        return 1.0

    async def body():
        with Journal(db) as j:
            async with Scheduler(j, "r", job, config(max_active=1)) as s:
                await s.submit([TaskSpec("running"), TaskSpec("waiting")])
                await started.wait()
                assert await s.cancel("waiting") is True
                assert await s.cancel("running") is True
                await s.drain()
                assert await s.cancel("running") is False  # already final
                with pytest.raises(UsageError, match="no task 'nope'"):
                    await s.cancel("nope")

    run(body())
    assert check_journal(db, "r") == {"running": ("cancelled", None),
                                      "waiting": ("cancelled", None)}


def test_backpressure_refuses_a_batch_that_does_not_fit(tmp_path):
    db = str(tmp_path / "j.db")

    async def job(ctx: TaskContext) -> float | None:
        await asyncio.sleep(10)
        return 1.0

    async def body():
        with Journal(db) as j:
            s = Scheduler(j, "r", job, config(max_active=1, max_queued=3))
            async with s:
                await s.submit([TaskSpec("a0")])
                await asyncio.sleep(0.01)  # a0 takes the slot
                await s.submit([TaskSpec(f"a{i}") for i in range(1, 4)])  # 3 wait
                with pytest.raises(QueueFull, match="max_queued=3"):
                    await s.submit([TaskSpec("b0"), TaskSpec("b1")])
                with pytest.raises(UsageError, match="priority 7"):
                    await s.submit([TaskSpec("c", priority=7)])
                assert s.unfinished == 4

    run(body())
    c = sqlite3.connect(db)
    assert c.execute("SELECT count(*) FROM tasks").fetchone()[0] == 4  # nothing of b


def test_bad_configuration_says_what_to_change():
    with pytest.raises(UsageError, match="max_active"):
        SchedulerConfig(max_active=0)
    with pytest.raises(UsageError, match="turn_timeout_s"):
        SchedulerConfig(turn_timeout_s=0)

    async def job(ctx):
        return 1.0

    with pytest.raises(UsageError, match="exceeds this machine's usable cpus"):
        Scheduler(None, "r", job, SchedulerConfig(  # type: ignore[arg-type]
            capacity=Capacity(cpus=2, memory_mb=1 << 20, disk_mb=1 << 20),
            limits=Limits.reference()))


def test_a_stopped_scheduler_resumes_from_the_journal(tmp_path):
    """close() mid-run leaves tasks in flight in the journal, as a crash does; the next
    scheduler retries them (cause 'crash', turns kept) and runs the rest, each once."""
    db = str(tmp_path / "j.db")
    resumed_with: dict[str, int] = {}
    phase = {"first": True}
    turn_one: list[str] = []

    async def job(ctx: TaskContext) -> float | None:
        resumed_with[ctx.task_id] = len(ctx.turns)
        for turn in range(len(ctx.turns), 2):
            await ctx.record_turn({"turn": turn})
            if phase["first"]:
                turn_one.append(ctx.task_id)
                await asyncio.sleep(30)  # stopped here, mid-episode
        return 1.0

    async def first():
        with Journal(db) as j:
            async with Scheduler(j, "r", job, config(max_active=3)) as s:
                await s.submit([TaskSpec(f"t{i}") for i in range(8)])
                while len(turn_one) < 3:
                    await asyncio.sleep(0.01)

    async def second():
        phase["first"] = False
        with Journal(db) as j:
            async with Scheduler(j, "r", job, config(max_active=3)) as s:
                await s.submit([TaskSpec(f"t{i}") for i in range(8)])  # nothing new
                assert s.stats.recovered == 8
                await s.drain()

    run(first())
    check_journal(db, "r", all_final=False)
    run(second())
    assert set(check_journal(db, "r", {f"t{i}" for i in range(8)}).values()) == {
        ("done", 1.0)}
    assert sorted(resumed_with.values()) == [0] * 5 + [1] * 3  # 3 resumed after turn 0
    c = sqlite3.connect(db)
    assert c.execute("SELECT count(*) FROM transitions WHERE cause='crash'").fetchone()[0] > 0
    assert c.execute("SELECT count(*) FROM turns").fetchone()[0] == 16  # none repeated


def test_the_leaser_grants_quota_and_rate_limits_creation(tmp_path):
    """Two-CPU quota per lease on a 4-CPU machine with no reserve: at most two sandboxes
    run at once, whatever the number of slots."""
    world = World()
    peak = 0

    async def handler(argv, stdin, files):
        nonlocal peak
        world.running += 1
        peak = max(peak, world.running)
        await asyncio.sleep(0.01)
        world.running -= 1
        return ExecResult(ExecStatus.OK, exit_code=0)

    async def opener(limits):
        return FakeSandbox(handler, limits)

    async def job(ctx: TaskContext) -> float | None:
        async with ctx.lease(Limits(cpus=2)) as sb:
            await sb.exec(["true"])
        return 1.0

    async def body():
        with Journal(str(tmp_path / "j.db")) as j:
            cfg = config(max_active=8, capacity=Capacity(cpus=4, memory_mb=1 << 20,
                                                         disk_mb=1 << 20), reserve=0.0)
            async with Scheduler(j, "r", job, cfg, opener=opener) as s:
                await s.submit([TaskSpec(f"t{i}") for i in range(8)])
                await s.drain()
                return s.resources.peak_cpus

    assert run(body()) == 4 and peak == 2


def test_infra_error_from_the_opener_is_retried(tmp_path):
    db = str(tmp_path / "j.db")
    fails = [2]

    async def opener(limits):
        if fails[0]:
            fails[0] -= 1
            raise InfraError("no cell available")
        return FakeSandbox(limits=limits)

    async def body():
        with Journal(db) as j:
            async with Scheduler(j, "r", two_turns, config(), opener=opener) as s:
                await s.submit([TaskSpec("t")])
                await s.drain()

    run(body())
    assert check_journal(db, "r") == {"t": ("done", 1.0)}
    assert os.path.exists(db)


def test_cancel_while_the_submission_commits(tmp_path):
    """A task cancelled between its QUEUED move and that move's commit is never queued:
    the queue's count stays right and the journal shows pending -> queued -> cancelled."""
    db = str(tmp_path / "j.db")

    async def job(ctx: TaskContext) -> float | None:
        return 1.0

    async def body():
        with Journal(db) as j:
            async with Scheduler(j, "r", job, config(max_active=1)) as s:
                blocker = asyncio.Event()

                async def slow_job(ctx):
                    await blocker.wait()
                    return 1.0
                s.job = slow_job
                await s.submit([TaskSpec("busy")])  # takes the only slot
                sub = asyncio.ensure_future(s.submit([TaskSpec("x")]))
                await asyncio.sleep(0)  # submit has staged x's QUEUED move, not committed
                assert await s.cancel("x") is True
                await sub
                assert len(s.queue) == 0
                blocker.set()
                await s.drain()

    run(body())
    assert check_journal(db, "r") == {"busy": ("done", 1.0), "x": ("cancelled", None)}
    path = [r[0] for r in sqlite3.connect(db).execute(
        "SELECT new FROM transitions WHERE task_id='x' ORDER BY seq")]
    assert path == ["pending", "queued", "cancelled"]


def test_cancel_right_after_dispatch(tmp_path):
    """Cancelled after it took a free slot but before its asyncio task first ran: its job
    never starts, its slot is given back, it ends CANCELLED."""
    db = str(tmp_path / "j.db")
    ran: list[str] = []

    async def job(ctx: TaskContext) -> float | None:
        ran.append(ctx.task_id)
        return 1.0

    async def body():
        with Journal(db) as j:
            async with Scheduler(j, "r", job, config(max_active=1)) as s:
                await s.submit([TaskSpec("x")])  # dispatched: a task created, not run
                assert await s.cancel("x") is True
                await s.submit([TaskSpec("y")])
                await s.drain()

    run(body())
    assert ran == ["y"]
    assert check_journal(db, "r") == {"x": ("cancelled", None), "y": ("done", 1.0)}
