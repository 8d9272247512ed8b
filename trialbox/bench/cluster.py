"""`trialbox bench cluster`: what the Ray backend costs against the local one, on the same
machine in the same run, and how the driver scales with the number of nodes.

    trialbox bench cluster [--json] [--workers 4] [--latency-runs 60] [--rounds 5] [--limit N]
                           [--nodes 1,2,4] [--episodes 10000] [--slots 64]
                           [--work-ms 20] [--out FILE]

Part 1, one node (this machine is the Ray head and the only trialbox node; the local
backend runs beside it, so both see the same background):

* added latency per judged attempt: `--latency-runs` attempts one after another (HumanEval
  canonical solutions), graded by an `Evaluator` on a local pool and by the same
  `Evaluator` on the node (`RayBackend.run`); p50 of each and the difference. Also the
  p50 of a no-op round trip through the backend (placement, the node's channel,
  fencing): the part of the difference that is trialbox.cluster, not judging noise —
  beside it the same no-op sent as a Ray actor call (`ClusterConfig.channel="ray"`,
  what every attempt cost before the direct channel); and
  the same attempts' time on the node itself (`Node.run_times`) and the transport's part
  of each (through Ray minus on the node), so a slower node shows apart from Ray.
  The load average is reported: on a shared machine it moves these figures more than
  anything measured.
  Goal: <= 1 ms added.
* throughput: every HumanEval task's canonical solution and one exploit (rotating through
  the catalogue of `bench/humaneval_mix.py`), `--workers` in flight, local and Ray
  alternating for `--rounds` rounds (which goes first alternates too), the median
  tasks/s of each and each round's ratio (on this 2-core machine one round's ratio
  swings by ±5 % with whatever else runs: two rounds, before session 12, were not
  enough to tell 0.88 from 0.95). Goal: Ray >= 0.9x local.
* verdicts: every attempt's outcome through Ray equals the local one (canonical pass,
  exploits do not) — `--backend ray` grades like one machine.
* an episode's turn in its own session (what `train --backend ray` does each turn:
  `write_file` solution.py, `exec python3 solution.py`, `park`), `--latency-runs` turns
  interleaved: in a local `CellPool` session, in a `RemoteSandbox` on the node, and in
  one checkpointed after every command (`RemoteProvider(checkpoints=...)`, to a
  directory store here: the snapshot, archive and write, without a network's upload);
  the p50 of each and the checkpoint's bytes.

Part 2, scale (fake sandboxes, `ray.cluster_utils.Cluster` with N raylets per `--nodes`,
each `--slots` slots): `--episodes` scheduler tasks through the journaled `Scheduler` on
the driver, each one `FakeWorkload` run of `--work-ms` on a node. Per N: wall time,
episodes/s against the ideal (slots x 1000 / work-ms), driver CPU per episode (what
placement, the Ray calls and the journal cost the driver) and driver memory growth.

Output: a table; --json prints the results as one JSON object on the last line; --out
writes it. Exit 0 when everything ran (a missed goal is a measurement), 1 when verdicts
differ or an episode failed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import tempfile
import time
from typing import Any

from trialbox.bench import report
from trialbox.bench.humaneval_mix import EXPLOITS, exploit_completion
from trialbox.errors import UsageError
from trialbox.types import EvalSample

GOAL_ADDED_MS = 1.0
GOAL_RATIO = 0.9


def add_parser(bsub: Any) -> None:
    p = bsub.add_parser("cluster", help="Ray backend vs local: added latency per judged "
                        "attempt, tasks/s, verdicts; driver scaling over N simulated nodes")
    p.add_argument("--workers", type=int, default=4, help="attempts in flight (4)")
    p.add_argument("--latency-runs", type=int, default=60,
                   help="sequential attempts for the latency figures (60)")
    p.add_argument("--rounds", type=int, default=5,
                   help="throughput rounds of each backend, alternating (5)")
    p.add_argument("--limit", type=int, default=None,
                   help="HumanEval tasks in the throughput/verdict part (all 164)")
    p.add_argument("--nodes", default="1,2,4", help="simulated node counts (1,2,4)")
    p.add_argument("--episodes", type=int, default=10_000, help="episodes per scale run")
    p.add_argument("--slots", type=int, default=64, help="slots per simulated node (64)")
    p.add_argument("--work-ms", type=float, default=20.0, help="fake work per episode (20)")
    report.add_output_arguments(p)
    p.set_defaults(handler=main)


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0



# ---------------------------------------------------------------------- part 1
async def _one_node(args: argparse.Namespace) -> dict[str, Any]:
    import ray

    from trialbox.cluster.backend import ClusterConfig, RayBackend
    from trialbox.cluster.evaljob import ClusterEvaluator
    from trialbox.cluster.node import FakeWorkload
    from trialbox.judge.evaluate import Evaluator
    from trialbox.judge.function import judge_pool_config
    from trialbox.sandbox.pool import CellPool
    from trialbox.store.tasks import index, load_humaneval

    tasks_list = load_humaneval()[: args.limit]
    tasks = index(tasks_list)
    samples: list[EvalSample] = []
    kinds: list[str] = []
    for i, t in enumerate(tasks_list):
        samples.append(EvalSample(t.task_id, t.canonical_solution))
        kinds.append("canonical")
        name = EXPLOITS[i % len(EXPLOITS)]
        samples.append(EvalSample(t.task_id, exploit_completion(name, t)))
        kinds.append(f"exploit:{name}")
    w = args.workers
    report.log("starting a one-node Ray cluster on this machine")
    # address="local": a cluster of its own, even when another one runs on this machine
    # (without it Ray joins the last one `ray start` or a test made, and refuses num_cpus)
    ray.init(address="local", num_cpus=os.cpu_count() or 1, include_dashboard=False,
             log_to_driver=False,
             configure_logging=False, namespace="trialbox-bench",
             resources={"trialbox_node": 1, "trialbox_slots": w,
                        "trialbox_tier_namespace": 1, "trialbox_tier_fake": 1})
    pool = await CellPool(judge_pool_config(warm=min(2 * w, 32))).start()
    local = Evaluator(tasks, pool, workers=w)
    await local.start(w)
    res: dict[str, Any] = {}
    try:
        async with RayBackend(ClusterConfig(address="auto", warm=min(2 * w, 32))) as be:
            remote = ClusterEvaluator(tasks, be, "bench", workers=w)
            await remote.start(w)
            await be.load("noop", FakeWorkload())
            # warm both (first attempts start cells, import the harness)
            for s in samples[:2 * w]:
                await local.attempt(s)
                await remote.attempt(s)
            seq = [s for s, k in zip(samples, kinds, strict=True)
                   if k == "canonical"][: args.latency_runs]
            lat: dict[str, list[float]] = {"local": [], "ray": [], "noop": []}
            load0 = report.load_average()
            actor = next(iter(be.members.values())).actor
            await actor.run_times.remote()  # forget the warm-up's
            for s in seq:  # interleaved: drift hits both alike
                for name, ev in (("local", local), ("ray", remote)):
                    # each from a quiet state: neither pool's refill after the previous
                    # attempt may land in the next one's time (the local pool refills in
                    # this process, the node's in its own)
                    await pool.settle()
                    await asyncio.sleep(0.05)
                    t0 = time.perf_counter()
                    await ev.attempt(s)
                    lat[name].append((time.perf_counter() - t0) * 1000)
            lat["node_side"] = await actor.run_times.remote()  # the same attempts' part
            transport = [r - n for r, n in zip(lat["ray"], lat["node_side"], strict=True)]
            member = next(iter(be.members.values()))
            direct = member.channel
            lat["noop_ray"] = []
            for i in range(max(100, args.latency_runs)):
                for key in ("noop", "noop_ray"):  # the direct channel, a Ray actor call
                    member.channel = direct if key == "noop" else None
                    t0 = time.perf_counter()
                    await be.run("noop", i, tier="fake")
                    lat[key].append((time.perf_counter() - t0) * 1000)
            member.channel = direct
            res["latency_ms"] = {k: round(report.median(v), 3) for k, v in lat.items()}
            res["latency_ms"]["transport"] = round(report.median(transport), 3)
            res["latency_ms"]["added"] = round(report.median(lat["ray"])
                                               - report.median(lat["local"]), 3)
            res["latency_ms"]["runs"] = len(seq)
            res["load_average"] = [load0, report.load_average()]
            report.log(f"latency p50: {res['latency_ms']}")

            async def throughput(ev: Evaluator) -> tuple[float, list[str]]:
                sem = asyncio.Semaphore(w)

                async def one(s: EvalSample) -> str:
                    async with sem:
                        g, _ = await ev.attempt(s)
                        return g.outcome.value
                t0 = time.perf_counter()
                outs = await asyncio.gather(*(one(s) for s in samples))
                return len(samples) / (time.perf_counter() - t0), list(outs)

            rates: dict[str, list[float]] = {"local": [], "ray": []}
            verdicts: dict[str, list[str]] = {}
            pair = [("local", local), ("ray", remote)]
            for _name, ev in pair:  # one whole round of each first, not counted: the
                await throughput(ev)  # node's first rounds read up to 20 % slower
            for r in range(args.rounds):
                # which goes first alternates: a drift within a round (the machine
                # slowing, a pool still refilling) does not always favour the same one
                for name, ev in (pair if r % 2 == 0 else pair[::-1]):
                    rate, outs = await throughput(ev)
                    rates[name].append(rate)
                    verdicts.setdefault(name, outs)
                    report.log(f"round {r + 1} {name}: {rate:.1f} attempts/s")
            lr, rr = report.median(rates["local"]), report.median(rates["ray"])
            res["throughput"] = {"attempts": len(samples), "workers": w,
                                 "local_per_s": round(lr, 2), "ray_per_s": round(rr, 2),
                                 "ratio": round(rr / lr, 3), "rounds": rates,
                                 "round_ratios": [round(b / a, 3) for a, b in zip(
                                     rates["local"], rates["ray"], strict=True)]}
            differ = [(s.task_id, k, verdicts["local"][i], verdicts["ray"][i])
                      for i, (s, k) in enumerate(zip(samples, kinds, strict=True))
                      if verdicts["local"][i] != verdicts["ray"][i]]
            passed = sum(1 for v in verdicts["ray"] if v == "passed")
            canon = sum(1 for k in kinds if k == "canonical")
            res["verdicts"] = {"attempts": len(samples), "same": not differ,
                               "differ": differ[:20], "ray_passed": passed,
                               "canonical": canon,
                               "exploits_passed": sum(
                                   1 for v, k in zip(verdicts["ray"], kinds, strict=True)
                                   if k != "canonical" and v == "passed")}
            res["session_turn_ms"] = await _session_turns(pool, be, max(20, args.latency_runs))
            report.log(f"session turn p50: {res['session_turn_ms']}")
    finally:
        await local.close()
        await pool.close()
        ray.shutdown()
    return res


TURN = b"import sys\nprint(sum(range(1000)), file=sys.stdout)\n"


async def _session_turns(pool: Any, be: Any, runs: int) -> dict[str, Any]:
    """p50 ms of one agent-loop turn (write, run, park) locally, on the node, and on the
    node with a checkpoint after the command (module docstring)."""
    from trialbox.cluster.sessions import RemoteProvider
    store = tempfile.mkdtemp(prefix="trialbox-bench-checkpoints-")
    plain = await RemoteProvider.start(be, "namespace")
    saved = await RemoteProvider.start(be, "namespace", checkpoints=store)
    sessions = {"local": await pool.open(), "ray": await plain.open(),
                "ray_checkpointed": await saved.open()}
    times: dict[str, list[float]] = {k: [] for k in sessions}
    try:
        for _ in range(3):  # warm: first runs start cells and fill the page cache
            for sb in sessions.values():
                await sb.write_file("solution.py", TURN)
                await sb.exec(["python3", "solution.py"])
                await sb.park()
        for _ in range(runs):
            for name, sb in sessions.items():
                await asyncio.sleep(0.02)
                t0 = time.perf_counter()
                await sb.write_file("solution.py", TURN)
                r = await sb.exec(["python3", "solution.py"])
                await sb.park()
                times[name].append((time.perf_counter() - t0) * 1000)
                if r.stdout.strip() != b"499500":
                    raise RuntimeError(f"bench session turn ({name}) ran wrong: {r}")
        size = sum(os.path.getsize(os.path.join(d, f))
                   for d, _, fs in os.walk(store) for f in fs)
    finally:
        for sb in sessions.values():
            await sb.close()
        shutil.rmtree(store, ignore_errors=True)
    out: dict[str, Any] = {k: round(report.median(v), 3) for k, v in times.items()}
    out["checkpoint_added"] = round(out["ray_checkpointed"] - out["ray"], 3)
    out["checkpoint_bytes"] = size
    out["runs"] = runs
    return out


# ---------------------------------------------------------------------- part 2
async def _scale_run(address: str, episodes: int, slots_total: int,
                     work_s: float) -> dict[str, Any]:
    from trialbox.cluster.backend import ClusterConfig, RayBackend
    from trialbox.cluster.node import FakeWorkload
    from trialbox.schedule.scheduler import Scheduler, SchedulerConfig, TaskSpec
    from trialbox.store.journal import Journal

    async with RayBackend(ClusterConfig(address=address, dead_after_s=60)) as be:
        await be.load("w", FakeWorkload(seconds=work_s))
        with tempfile.TemporaryDirectory() as d:
            journal = Journal(os.path.join(d, "j.db"))

            async def job(ctx: Any) -> float | None:
                await ctx.grading()
                await be.run("w", None, tier="fake")
                return 1.0

            config = SchedulerConfig(max_active=slots_total, preempt=False,
                                     max_queued=episodes + 1, sandbox_rate=1e9,
                                     sandbox_burst=1 << 30)
            rss0, cpu0, t0 = _rss_mb(), time.process_time(), time.perf_counter()
            peak = rss0
            async with Scheduler(journal, "scale", job, config) as s:
                await s.submit([TaskSpec(f"e{i}") for i in range(episodes)])
                while s.unfinished:
                    peak = max(peak, _rss_mb())
                    await asyncio.sleep(0.5)
                await s.drain()
            wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
            done = sum(1 for v in journal.results_of("scale").values() if v[0] == "done")
            journal.close()
    ideal = episodes * work_s / slots_total
    return {"episodes": episodes, "done": done, "slots": slots_total,
            "wall_s": round(wall, 2), "ideal_s": round(ideal, 2),
            "episodes_per_s": round(episodes / wall, 1),
            "ideal_per_s": round(slots_total / work_s, 1),
            "driver_cpu_us_per_episode": round(cpu / episodes * 1e6, 1),
            "driver_rss_growth_mb": round(peak - rss0, 1),
            "placed": be.placer.stats.placed}


def _scale(args: argparse.Namespace) -> list[dict[str, Any]]:
    import ray
    from ray.cluster_utils import Cluster
    out = []
    for n in [int(x) for x in args.nodes.split(",") if x.strip()]:
        report.log(f"scale: {n} node(s) x {args.slots} slots, {args.episodes} episodes")
        c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1,
                                                          "include_dashboard": False})
        try:
            for _ in range(n):
                c.add_node(num_cpus=1, resources={"trialbox_node": 1,
                                                  "trialbox_slots": args.slots,
                                                  "trialbox_tier_fake": 1})
            ray.init(address=c.address, log_to_driver=False, configure_logging=False,
                     namespace="trialbox-bench")
            r = asyncio.run(_scale_run(c.address, args.episodes, n * args.slots,
                                       args.work_ms / 1000))
            r["nodes"] = n
            report.log(f"  {r}")
            out.append(r)
        finally:
            ray.shutdown()
            c.shutdown()  # type: ignore[no-untyped-call]
    return out


def render(res: dict[str, Any]) -> str:
    lines = ["trialbox bench cluster"]
    one = res.get("one_node")
    if one:
        lat, thr, ver = one["latency_ms"], one["throughput"], one["verdicts"]
        lines += [
            f"  judged attempt p50: local {lat['local']:.2f} ms, ray {lat['ray']:.2f} ms, "
            f"added {lat['added']:+.2f} ms (goal <= {GOAL_ADDED_MS} ms); no-op round trip "
            f"{lat['noop']:.2f} ms (as a Ray actor call {lat.get('noop_ray', 0):.2f} ms); "
            f"of the Ray attempt, on the node {lat['node_side']:.2f} "
            f"ms, transport {lat['transport']:.2f} ms "
            f"(load average {one.get('load_average')})",
            f"  throughput ({thr['attempts']} attempts, {thr['workers']} in flight): local "
            f"{thr['local_per_s']}/s, ray {thr['ray_per_s']}/s = {thr['ratio']}x "
            f"(goal >= {GOAL_RATIO}x; per round {thr.get('round_ratios')})",
            f"  verdicts: same as local: {ver['same']}; passed {ver['ray_passed']} of "
            f"{ver['canonical']} canonical, exploits passed {ver['exploits_passed']}"]
        st = one.get("session_turn_ms")
        if st:
            lines.append(
                f"  session turn p50 (write, run, park): local {st['local']:.2f} ms, on the "
                f"node {st['ray']:.2f} ms, checkpointed after the run "
                f"{st['ray_checkpointed']:.2f} ms ({st['checkpoint_added']:+.2f} ms, "
                f"{st['checkpoint_bytes']} bytes kept)")
    for r in res.get("scale", []):
        lines.append(
            f"  scale N={r['nodes']}: {r['done']}/{r['episodes']} episodes in "
            f"{r['wall_s']} s ({r['episodes_per_s']}/s, ideal {r['ideal_per_s']}/s); "
            f"driver {r['driver_cpu_us_per_episode']} us CPU/episode, "
            f"+{r['driver_rss_growth_mb']} MB")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    try:
        import ray  # noqa: F401
    except ImportError as e:
        raise UsageError("bench cluster needs Ray: pip install 'trialbox[ray]'") from e
    if (args.workers < 1 or args.episodes < 1 or args.slots < 1 or args.rounds < 1
            or args.work_ms < 0):
        raise UsageError("--workers, --episodes, --slots and --rounds must be >= 1, "
                         "--work-ms >= 0")
    t0 = time.monotonic()
    res: dict[str, Any] = {"machine": report.machine_info()}
    res["one_node"] = asyncio.run(_one_node(args)) if args.latency_runs > 0 else None
    res["scale"] = _scale(args) if args.nodes else []
    res["duration_s"] = round(time.monotonic() - t0, 1)
    report.emit(res, args, render(res))
    one = res["one_node"]
    bad = (one is not None and not one["verdicts"]["same"]) or any(
        r["done"] != r["episodes"] for r in res["scale"])
    return 1 if bad else 0
