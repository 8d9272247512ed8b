"""`trialbox bench scheduler`: the scheduler's own cost at 10,000 simulated tasks, side by
side with a plain `asyncio.Semaphore` + `gather` baseline doing the same work.

    trialbox bench scheduler [--json] [--tasks 10000] [--active 1000] [--turns 3]
                             [--think-ms 200] [--exec-ms 20] [--out FILE]

Work (identical for both systems): each task is an episode of `--turns` turns; a turn is
a policy that sleeps `--think-ms` (jittered ±50%, seeded) and then a sandbox run that
sleeps `--exec-ms`. Sandboxes are `FakeSandbox`es whose handler sleeps (no isolation is
measured here: `bench sandbox` does that). At most `--active` episodes run at once.

* ``scheduler`` — `Scheduler` with a real SQLite WAL journal in a temporary directory:
  every transition journaled (group commit), each turn journaled, quotas, the creation
  rate limit (set high enough not to bind), the SchedulerLeaser (the sandbox is leased
  only around each run, parked while the policy thinks).
* ``baseline`` — `asyncio.gather` over all episodes, each `async with semaphore:` and
  holding its sandbox for the whole episode (what the simple version of this code does).
  No journal, no priorities, no recovery.

Figures:

1. CPU per transition: process CPU time of the scheduler run minus the baseline's (the
   same sleeps, the same fake sandboxes), over the scheduler's transitions — what the
   lifecycle, the journal and the queues cost per move. Goal ≤ 100 µs.
2. Dispatch latency p50/p99: from the moment a task could have had a slot (submitted to a
   free slot, or a slot freed by a finishing task) to its job's first instruction.
   Baseline: from a semaphore release to the next waiter's first instruction.
3. Memory per queued task: tracemalloc growth while N tasks are submitted to a scheduler
   that is not dispatching, over N (journal rows are on disk, not counted). Baseline: N
   `asyncio.Task`s blocked on a semaphore. Goal ≤ 5 KB.
4. Leased-but-idle: the share of sandbox-leased time in which no code ran.
5. Priority inversion: `--active` slots busy with low-priority tasks while high-priority
   ones arrive in waves. An inversion is a low task dispatched while a high one was
   waiting. Goal: zero (a high task waits at most for one preemption).
6. The real agent loop (`--agent-tasks`, default `--tasks`): that many episodes through
   `rollout.agent.Episodes` — a scripted policy (wrong, then right), `FakeProvider`
   sessions whose runs sleep `--exec-ms`, a scripted judge — each episode a scheduler
   task (journal, leases, the turn's quota slot: what `trialbox train` runs), against the
   same episodes under a `Semaphore(--active)` + `gather`. Overhead per transition = the
   CPU difference over the scheduler's transitions (goal ≤ 100 µs); memory per episode
   = tracemalloc peak growth with `--active` episodes in flight, over `--active`.

Output: a table on stdout; with --json the results as one JSON object on the last line;
--out FILE writes the same JSON to FILE. A missed goal is a measurement: exit 0 when
everything ran, 1 when some episode failed.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import math
import os
import random
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

from trialbox.bench import report
from trialbox.errors import UsageError
from trialbox.rollout.agent import AgentConfig, Episodes
from trialbox.rollout.policy import ScriptedPolicy
from trialbox.sandbox.fake import FakeProvider, FakeSandbox
from trialbox.schedule.lifecycle import TaskRecord
from trialbox.schedule.quotas import Capacity
from trialbox.schedule.scheduler import (
    Priority,
    Scheduler,
    SchedulerConfig,
    TaskContext,
    TaskSpec,
)
from trialbox.store.journal import Journal
from trialbox.types import (
    ExecResult,
    ExecStatus,
    Grade,
    Limits,
    Outcome,
    Task,
    TaskKind,
    TestCase,
    TestResult,
    Trajectory,
)

GOAL_US_PER_TRANSITION = 100.0
GOAL_BYTES_PER_QUEUED = 5 * 1024
SIM_LIMITS = Limits(cpus=0.5, memory_mb=256, disk_mb=64)
# A simulated machine big enough that quotas never bind: the benchmark measures the
# scheduler's overhead, not a resource shortage.
SIM_CAPACITY = Capacity(cpus=1e6, memory_mb=1 << 40, disk_mb=1 << 40)


def add_parser(bsub: Any) -> None:
    p = bsub.add_parser("scheduler", help="scheduler overhead at 10,000 simulated tasks vs "
                        "an asyncio.Semaphore + gather baseline")
    p.add_argument("--tasks", type=int, default=10_000, help="simulated tasks (10000)")
    p.add_argument("--active", type=int, default=1000, help="episodes at once (1000)")
    p.add_argument("--turns", type=int, default=3, help="turns per episode (3)")
    p.add_argument("--think-ms", type=float, default=200.0, help="policy sleep per turn (200)")
    p.add_argument("--exec-ms", type=float, default=20.0, help="sandbox sleep per run (20)")
    p.add_argument("--agent-tasks", type=int, default=None,
                   help="episodes through the real agent loop (default: --tasks)")
    report.add_output_arguments(p)
    p.set_defaults(handler=main)


class Sim:
    """The shared simulated world: seeded think times, sleeping sandboxes, busy time."""

    def __init__(self, turns: int, think_s: float, exec_s: float, seed: int = 0):
        self.turns, self.think_s, self.exec_s = turns, think_s, exec_s
        self.rng = random.Random(seed)
        self.busy_s = 0.0
        self.opened = 0

    def think(self) -> float:
        return self.think_s * (0.5 + self.rng.random())

    async def handler(self, argv: list[str], stdin: bytes,
                      files: dict[str, bytes]) -> ExecResult:
        t0 = time.monotonic()
        await asyncio.sleep(self.exec_s)
        self.busy_s += time.monotonic() - t0
        return ExecResult(ExecStatus.OK, exit_code=0, tier="fake", runtime="sim")

    async def opener(self, limits: Limits | None) -> FakeSandbox:
        self.opened += 1
        return FakeSandbox(self.handler, limits)


def _config(active: int, tasks: int) -> SchedulerConfig:
    return SchedulerConfig(max_active=active, max_queued=max(tasks, 1) * 2,
                           limits=SIM_LIMITS, capacity=SIM_CAPACITY,
                           sandbox_rate=1e9, sandbox_burst=1 << 30)


# ------------------------------------------------------------------ the two systems

async def run_scheduler(sim: Sim, n: int, active: int, tmp: str) -> dict[str, Any]:
    journal = Journal(os.path.join(tmp, "bench-journal.db"))

    async def job(ctx: TaskContext) -> float | None:
        for turn in range(len(ctx.turns), sim.turns):
            await asyncio.sleep(sim.think())
            async with ctx.lease() as sb:
                r = await sb.exec(["python3", "main.py"])
            ctx.observe(r)
            await ctx.record_turn({"turn": turn, "status": r.status.value})
        await ctx.grading()
        return 1.0

    sched = Scheduler(journal, "bench", job, _config(active, n), opener=sim.opener)
    gc.collect()
    cpu0, t0 = time.process_time(), time.monotonic()
    async with sched:
        await sched.submit([TaskSpec(f"t{i}") for i in range(n)])
        await sched.drain()
    cpu, wall = time.process_time() - cpu0, time.monotonic() - t0
    journal.close()
    lat = sched.stats.dispatch_latency_s
    leased = sched.leaser.stats.leased_s
    return {"cpu_s": cpu, "wall_s": wall, "transitions": sched.stats.transitions,
            "done": sched.stats.finals.get("done", 0), "commits": journal.commits,
            "dispatch_p50_ms": report.percentile(lat, 50) * 1e3,
            "dispatch_p99_ms": report.percentile(lat, 99) * 1e3,
            "leased_s": leased, "busy_s": sim.busy_s,
            "idle_fraction": 1 - sim.busy_s / leased if leased else math.nan,
            "sessions": sim.opened}


async def run_baseline(sim: Sim, n: int, active: int) -> dict[str, Any]:
    sem = asyncio.Semaphore(active)
    releases: list[float] = []   # times a slot was given back, not yet taken
    lat: list[float] = []
    leased = 0.0
    done = 0
    rel_i = 0

    async def episode(i: int) -> None:
        nonlocal leased, done, rel_i
        t_req = time.monotonic()
        async with sem:
            t = time.monotonic()
            if rel_i < len(releases):  # this slot came from a release: FIFO pairing
                lat.append(t - max(releases[rel_i], t_req))
                rel_i += 1
            else:
                lat.append(t - t_req)
            t_lease = time.monotonic()
            sb = await sim.opener(SIM_LIMITS)
            for _turn in range(sim.turns):
                await asyncio.sleep(sim.think())
                await sb.exec(["python3", "main.py"])
            await sb.close()
            leased += time.monotonic() - t_lease
            done += 1
            releases.append(time.monotonic())

    gc.collect()
    cpu0, t0 = time.process_time(), time.monotonic()
    await asyncio.gather(*(episode(i) for i in range(n)))
    cpu, wall = time.process_time() - cpu0, time.monotonic() - t0
    return {"cpu_s": cpu, "wall_s": wall, "done": done,
            "dispatch_p50_ms": report.percentile(lat, 50) * 1e3,
            "dispatch_p99_ms": report.percentile(lat, 99) * 1e3,
            "leased_s": leased, "busy_s": sim.busy_s,
            "idle_fraction": 1 - sim.busy_s / leased if leased else math.nan}


# ------------------------------------------------------------------ the real agent loop

AGENT_TASK = Task(task_id="square", kind=TaskKind.FUNCTION, entry_point="square",
                  prompt="def square(x):\n",
                  visible_tests=(TestCase("v", code="assert candidate(3) == 9"),))
WRONG, RIGHT = "    return x + x\n", "    return x * x\n"


async def _grade(task: Task, completion: str, seed: int | None = None) -> Grade:
    ok = "x * x" in completion
    return Grade(task.task_id, Outcome.PASSED if ok else Outcome.FAILED,
                 tests=(TestResult("v", ok, "" if ok else "assert failed", hidden=False),))


async def agent_loop(system: str, n: int, active: int, exec_s: float, tmp: str,
                     trace: bool = False) -> dict[str, Any]:
    """`n` two-turn episodes through `Episodes`: as scheduler tasks, or under a
    semaphore. `trace`: the tracemalloc peak growth per episode in flight."""
    sim = Sim(2, 0.0, exec_s)
    provider = FakeProvider(sim.handler)
    cfg = AgentConfig(max_new_tokens=64, max_context_tokens=1024,
                      max_concurrent_env=active)
    policy = ScriptedPolicy([WRONG, RIGHT], logprob=-0.5)
    done, transitions = 0, 0
    gc.collect()
    if trace:
        tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0] if trace else 0
    cpu0, t0 = time.process_time(), time.monotonic()
    if system == "scheduler":
        journal = Journal(os.path.join(tmp, f"bench-agent-{n}-{trace}.db"))
        holder: list[Episodes] = []

        async def job(ctx: TaskContext) -> float | None:
            tr = await holder[0].run(AGENT_TASK, ctx.task_id, ctx.task_id)
            await ctx.record_grade({"reward": tr.reward, "turns": len(tr.turns)})
            return tr.reward

        sched = Scheduler(journal, "agent", job, _config(active, n),
                          opener=provider.open)
        async with Episodes(policy, cfg, provider, leaser=sched.leaser,
                            env_slot=sched.leaser.slot, grader=_grade) as episodes:
            holder.append(episodes)
            async with sched:
                await sched.submit([TaskSpec(f"e{i}", priority=Priority.TRAIN)
                                    for i in range(n)])
                await sched.drain()
        done, transitions = sched.stats.finals.get("done", 0), sched.stats.transitions
        journal.close()
    else:
        sem = asyncio.Semaphore(active)
        async with Episodes(policy, cfg, provider, grader=_grade) as episodes:
            async def gated(i: int) -> Trajectory:
                async with sem:
                    return await episodes.run(AGENT_TASK, f"e{i}", f"e{i}")
            trajs = await asyncio.gather(*(gated(i) for i in range(n)))
        done = sum(t.passed for t in trajs)
    cpu, wall = time.process_time() - cpu0, time.monotonic() - t0
    peak = 0.0
    if trace:
        peak = (tracemalloc.get_traced_memory()[1] - before) / min(n, active)
        tracemalloc.stop()
    return {"cpu_s": cpu, "wall_s": wall, "done": done, "transitions": transitions,
            "gen_calls": len(policy.calls),
            "mean_batch": sum(policy.calls) / max(1, len(policy.calls)),
            **({"bytes_per_episode": peak} if trace else {})}


# ------------------------------------------------------------------ memory

async def memory_scheduler(n: int, tmp: str) -> float:
    journal = Journal(os.path.join(tmp, "bench-memory.db"))

    async def job(ctx: TaskContext) -> float | None:
        return 1.0

    sched = Scheduler(journal, "mem", job, _config(1, n))  # never started: all stay queued
    specs = [TaskSpec(f"t{i}") for i in range(n)]  # the caller's list: not the scheduler's
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    await sched.submit(specs)
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert len(sched.queue) == n
    await sched.close()
    journal.close()
    return (after - before) / n


async def memory_baseline(n: int) -> float:
    sem = asyncio.Semaphore(0)  # every task waits

    async def episode() -> None:
        async with sem:
            pass

    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    tasks = [asyncio.ensure_future(episode()) for _ in range(n)]
    await asyncio.sleep(0)  # each task runs up to its wait
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return (after - before) / n


# ------------------------------------------------------------------ priorities

def count_inversions(events: list[tuple[float, float, int]]) -> int:
    """events: (queued_at, dispatched_at, tier) per task. An inversion: a task of a less
    urgent tier dispatched while a more urgent one was queued and not yet dispatched."""
    inversions = 0
    highs = [(q, d) for q, d, tier in events if tier == 0]
    lows = sorted(d for q, d, tier in events if tier > 0)
    import bisect
    for q, d in highs:
        inversions += bisect.bisect_left(lows, d) - bisect.bisect_right(lows, q)
    return inversions


async def priority_scheduler(sim: Sim, active: int, lows: int, highs: int, waves: int,
                             tmp: str) -> dict[str, Any]:
    journal = Journal(os.path.join(tmp, "bench-priority.db"))
    events: list[tuple[float, float, int]] = []

    async def job(ctx: TaskContext) -> float | None:
        for _ in range(sim.turns):
            await asyncio.sleep(sim.think())
            async with ctx.lease() as sb:
                await sb.exec(["python3", "main.py"])
        return 1.0

    def on_dispatch(rec: TaskRecord) -> None:
        events.append((rec.queued_at, time.monotonic(), rec.priority))

    sched = Scheduler(journal, "prio", job, _config(active, lows + highs),
                      opener=sim.opener, on_dispatch=on_dispatch)
    async with sched:
        await sched.submit([TaskSpec(f"low{i}", priority=2) for i in range(lows)])
        for w in range(waves):
            await asyncio.sleep(sim.think_s * sim.turns / 2)
            await sched.submit([TaskSpec(f"high{w}.{i}", priority=0)
                                for i in range(highs // waves)])
        await sched.drain()
    journal.close()
    high_wait = [d - q for q, d, t in events if t == 0]
    return {"inversions": count_inversions(events), "preemptions": sched.stats.preemptions,
            "high_wait_p50_ms": report.percentile(high_wait, 50) * 1e3,
            "high_wait_p99_ms": report.percentile(high_wait, 99) * 1e3,
            "done": sched.stats.finals.get("done", 0), "finals": dict(sched.stats.finals)}


async def priority_baseline(sim: Sim, active: int, lows: int, highs: int,
                            waves: int) -> dict[str, Any]:
    sem = asyncio.Semaphore(active)
    events: list[tuple[float, float, int]] = []

    async def episode(tier: int) -> None:
        q = time.monotonic()
        async with sem:
            events.append((q, time.monotonic(), tier))
            sb = await sim.opener(SIM_LIMITS)
            for _ in range(sim.turns):
                await asyncio.sleep(sim.think())
                await sb.exec(["python3", "main.py"])

    tasks = [asyncio.ensure_future(episode(2)) for _ in range(lows)]
    for _w in range(waves):
        await asyncio.sleep(sim.think_s * sim.turns / 2)
        tasks += [asyncio.ensure_future(episode(0)) for _ in range(highs // waves)]
    await asyncio.gather(*tasks)
    high_wait = [d - q for q, d, t in events if t == 0]
    return {"inversions": count_inversions(events), "preemptions": 0,
            "high_wait_p50_ms": report.percentile(high_wait, 50) * 1e3,
            "high_wait_p99_ms": report.percentile(high_wait, 99) * 1e3, "done": len(events)}


# ------------------------------------------------------------------ report

def render_table(res: dict[str, Any]) -> str:
    m, p, s, b = res["machine"], res["params"], res["scheduler"], res["baseline"]
    pr = res["priority"]
    w = 22
    lines = [
        (f"trialbox bench scheduler — {m['nproc']} CPUs ({m['cpu_model'] or 'unknown'}), "
         f"{m['memory_gib']} GiB, Python {m['python']}, {m['date']}"),
        (f"{p['tasks']} tasks, {p['active']} at once, {p['turns']} turns of "
         f"{p['think_ms']} ms think + {p['exec_ms']} ms sandbox each; load average "
         f"{report.fmt(m['loadavg_start'][0])} at start"),
        "",
        f"{'':<34}{'scheduler':>{w}}{'baseline':>{w}}{'ratio':>12}",
    ]

    def row(name: str, a: Any, bb: Any, nd: int = 2, ratio: bool = True) -> None:
        rt = report.ratio(a, bb) if ratio and isinstance(a, float) and isinstance(bb, float) \
            else math.nan
        lines.append(f"{name:<34}{report.fmt(a, nd):>{w}}{report.fmt(bb, nd):>{w}}"
                     f"{(report.fmt(rt) + 'x') if math.isfinite(rt) else '-':>12}")

    row("wall time, s", s["wall_s"], b["wall_s"])
    row("process CPU, s", s["cpu_s"], b["cpu_s"])
    row("transitions journaled", float(s["transitions"]), math.nan, 0, False)
    row("journal commits", float(s["commits"]), math.nan, 0, False)
    row("dispatch latency p50, ms", s["dispatch_p50_ms"], b["dispatch_p50_ms"], 3)
    row("dispatch latency p99, ms", s["dispatch_p99_ms"], b["dispatch_p99_ms"], 3)
    row("memory per queued task, bytes", res["memory"]["scheduler_bytes"],
        res["memory"]["baseline_bytes"], 0)
    row("sandbox leased but idle, %", 100 * s["idle_fraction"], 100 * b["idle_fraction"], 1)
    row("sandbox leased time, s", s["leased_s"], b["leased_s"], 1)
    row("priority inversions", float(pr["scheduler"]["inversions"]),
        float(pr["baseline"]["inversions"]), 0, False)
    row("high-priority wait p50, ms", pr["scheduler"]["high_wait_p50_ms"],
        pr["baseline"]["high_wait_p50_ms"], 1)
    row("high-priority wait p99, ms", pr["scheduler"]["high_wait_p99_ms"],
        pr["baseline"]["high_wait_p99_ms"], 1)
    row("preemptions", float(pr["scheduler"]["preemptions"]), 0.0, 0, False)
    ag = res["agent_loop"]
    row(f"agent loop: {p['agent_tasks']} episodes, s", ag["scheduler"]["wall_s"],
        ag["baseline"]["wall_s"])
    row("agent loop: process CPU, s", ag["scheduler"]["cpu_s"], ag["baseline"]["cpu_s"])
    row("agent loop: transitions", float(ag["scheduler"]["transitions"]), math.nan, 0,
        False)
    row("agent loop: mean batch", ag["scheduler"]["mean_batch"], ag["baseline"]["mean_batch"],
        1)
    row("agent loop: bytes per episode", ag["scheduler"]["bytes_per_episode"],
        ag["baseline"]["bytes_per_episode"], 0)
    g = res["goals"]
    lines += ["", "Goals:",
              f"  overhead per transition {report.fmt(res['us_per_transition'], 1)} µs "
              f"(≤ {GOAL_US_PER_TRANSITION:.0f})  {report.met(g['us_per_transition'])}",
              f"  memory per queued task {report.fmt(res['memory']['scheduler_bytes'], 0)} B "
              f"(≤ {GOAL_BYTES_PER_QUEUED})  {report.met(g['bytes_per_queued'])}",
              f"  priority inversions {pr['scheduler']['inversions']} (0)  "
              f"{report.met(g['no_inversion'])}",
              f"  agent loop overhead per transition {report.fmt(ag['us_per_transition'], 1)} µs "
              f"(≤ {GOAL_US_PER_TRANSITION:.0f})  {report.met(g['agent_us_per_transition'])}",
              "", "Notes:"]
    for n in res["notes"]:
        lines += report.wrap(n, " - ", "   ")
    if res["problems"]:
        lines += ["", "PROBLEMS:"] + [f" ! {x}" for x in res["problems"]]
    return "\n".join(lines)


async def _run(p: dict[str, Any]) -> dict[str, Any]:
    n, active, turns = p["tasks"], p["active"], p["turns"]
    think, exe = p["think_ms"] / 1e3, p["exec_ms"] / 1e3
    with tempfile.TemporaryDirectory(prefix="trialbox-bench-sched-") as tmp:
        report.log(f"memory: {n} queued tasks")
        mem_s = await memory_scheduler(n, tmp)
        mem_b = await memory_baseline(n)
        report.log("baseline: semaphore + gather")
        base = await run_baseline(Sim(turns, think, exe), n, active)
        report.log("scheduler")
        sched = await run_scheduler(Sim(turns, think, exe), n, active, tmp)
        lows, highs = max(2 * active, 10), 4 * max(active // 20, 1)
        report.log(f"priorities: {lows} low, {highs} high in 4 waves")
        prio_s = await priority_scheduler(Sim(turns, think, exe), active, lows, highs, 4, tmp)
        prio_b = await priority_baseline(Sim(turns, think, exe), active, lows, highs, 4)
        na = p["agent_tasks"]
        report.log(f"the real agent loop: {na} episodes, semaphore + gather")
        agent_b = await agent_loop("baseline", na, active, exe, tmp)
        report.log(f"the real agent loop: {na} episodes as scheduler tasks")
        agent_s = await agent_loop("scheduler", na, active, exe, tmp)
        report.log(f"the real agent loop: memory with {active} episodes in flight")
        agent_s["bytes_per_episode"] = (await agent_loop(
            "scheduler", active, active, exe, tmp, trace=True))["bytes_per_episode"]
        agent_b["bytes_per_episode"] = (await agent_loop(
            "baseline", active, active, exe, tmp, trace=True))["bytes_per_episode"]
    us = (sched["cpu_s"] - base["cpu_s"]) / max(sched["transitions"], 1) * 1e6
    agent_us = (agent_s["cpu_s"] - agent_b["cpu_s"]) / max(agent_s["transitions"], 1) * 1e6
    problems = []
    if sched["done"] != n or base["done"] != n:
        problems.append(f"episodes done: scheduler {sched['done']}, baseline "
                        f"{base['done']}, of {n}")
    if agent_s["done"] != p["agent_tasks"] or agent_b["done"] != p["agent_tasks"]:
        problems.append(f"agent loop episodes passed: scheduler {agent_s['done']}, "
                        f"baseline {agent_b['done']}, of {p['agent_tasks']}")
    if prio_s["done"] != lows + highs:
        problems.append(f"priority run: {prio_s['done']} of {lows + highs} done")
    return {
        "params": p, "scheduler": sched, "baseline": base,
        "memory": {"scheduler_bytes": mem_s, "baseline_bytes": mem_b},
        "priority": {"scheduler": prio_s, "baseline": prio_b, "lows": lows,
                     "highs": highs},
        "us_per_transition": us,
        "agent_loop": {"scheduler": agent_s, "baseline": agent_b,
                       "us_per_transition": agent_us},
        "us_per_transition_all_in": sched["cpu_s"] / max(sched["transitions"], 1) * 1e6,
        "goals": {"us_per_transition": us <= GOAL_US_PER_TRANSITION,
                  "bytes_per_queued": mem_s <= GOAL_BYTES_PER_QUEUED,
                  "no_inversion": prio_s["inversions"] == 0,
                  "agent_us_per_transition": agent_us <= GOAL_US_PER_TRANSITION},
        "notes": [
            "CPU per transition = (scheduler CPU - baseline CPU) / transitions: both runs "
            "sleep the same simulated think and sandbox times, so the difference is the "
            "lifecycle, the SQLite journal (group commit, WAL, synchronous=NORMAL) and "
            "the queues; all-in scheduler CPU per transition is in the JSON.",
            "Dispatch latency: scheduler from slot free (or submission) to the job's first "
            "instruction, including the journal commits of the finishing task and of the "
            "dispatch; baseline from a semaphore release to the next waiter running.",
            "Leased-but-idle: the scheduler leases the sandbox only around each run (parked "
            "while the policy thinks); the baseline holds it for the whole episode.",
            "Memory: tracemalloc growth per queued task (scheduler: record, queue entry, "
            "id sets; baseline: an asyncio.Task blocked on a semaphore).",
            "Agent loop: the same two-turn episodes through rollout.agent.Episodes (one "
            "batcher: the scripted policy's calls are batched the same way in both); the "
            "scheduler side is what trialbox train runs per episode (journal, lease "
            "hooks, the turn's quota slot, a journaled grade), the baseline a semaphore.",
            "Priority run: 2x--active low-priority tasks, then high-priority tasks in 4 "
            "waves while every slot is busy; the baseline (a FIFO semaphore) has no "
            "priorities, so its inversions show what the tiers and preemption prevent.",
        ],
        "problems": problems,
    }


def _check(args: argparse.Namespace) -> dict[str, Any]:
    p = {"tasks": int(args.tasks), "active": int(args.active), "turns": int(args.turns),
         "think_ms": float(args.think_ms), "exec_ms": float(args.exec_ms),
         "agent_tasks": int(args.tasks if args.agent_tasks is None else args.agent_tasks)}
    for k in ("tasks", "active", "turns", "agent_tasks"):
        if p[k] < 1:
            raise UsageError(f"--{k} must be at least 1, got {p[k]}")
    for k in ("think_ms", "exec_ms"):
        if not (math.isfinite(p[k]) and p[k] >= 0):
            raise UsageError(f"--{k.replace('_', '-')} must be >= 0, got {p[k]}")
    return p


def main(args: argparse.Namespace, run: Callable[..., Any] = asyncio.run) -> int:
    p = _check(args)
    machine = report.machine_info()
    t0 = time.monotonic()
    res = run(_run(p))
    res["machine"] = machine
    res["duration_s"] = round(time.monotonic() - t0, 1)
    report.emit(res, args, render_table(res), nd=4)
    return 0 if not res["problems"] else 1
