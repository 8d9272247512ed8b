"""`trialbox bench fork`: snapshot and fork-8 latency by workspace size, against copying
the workspace into new sessions (docs/snapshots.md).

For each size (default 1, 50 and 500 MB: 1 MiB files plus 500 small ones, the shape of
a checked-out repository with data), one session is filled, then:

  snapshot   `sb.snapshot()` of the session (it carries on over what it froze)
  fork       `snap.fork(8)`: per fork, the time until the session is open (its files
             mounted), and the CPU time it took this process (`fork cpu`: what a loaded
             machine's wall clock hides); `fork+run` adds its first run (`true`: a
             cell taken and the workspace attached), the time until a fork's code runs
  copy       the baseline: a new session, then `cp -a` of the parent's files into it and
             `chown -R` to the new session's uid, per copy (and + its first run)

Goal (issue 17): fork p50 <= 10 ms per fork, flat in workspace size.

`--judge 8,32` adds the repository judge's use of it: one repository task whose tree is
`--judge-mb` MB (modules and data), N candidates' answers (each a different change of
one module; half right) graded on the trusted tier, `--judge-concurrency` at a time,
with the snapshot path (each attempt's two sessions fork the task's starting workspace
and get the answer's changes; the first attempt makes the snapshots) and with the
copying path (every file written into both sessions); per path the wall time of the N
grades, the p50 of one grade, the time a session of an attempt takes to be ready
(`ready`: what the snapshot path changes; the tests' run is the same on both), this
process's CPU time, and whether the verdicts agree answer by answer.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any

from trialbox.sandbox.namespace import NamespaceSandbox
from trialbox.sandbox.pool import CellPool, PoolConfig
from trialbox.types import ExecStatus, Limits

MiB = 1 << 20
SMALL_FILES = 500
GOAL_MS = 10.0


def add_parser(bsub: Any) -> None:
    p = bsub.add_parser("fork", help="snapshot + fork-8 latency by workspace size vs "
                        "copying the workspace")
    p.add_argument("--sizes", default="1,50,500",
                   help="workspace sizes in MB, comma-separated (1,50,500)")
    p.add_argument("--rounds", type=int, default=4,
                   help="snapshot + fork-8 rounds per size (4: 32 forks)")
    p.add_argument("--copies", type=int, default=3,
                   help="copies of the workspace per size for the baseline (3)")
    p.add_argument("--judge", default="",
                   help="also grade N answers of one repository task with the snapshot "
                   "path and the copying path, for each N listed (e.g. 8,32); "
                   "--sizes '' runs only this")
    p.add_argument("--judge-mb", type=int, default=20,
                   help="the repository task's tree size in MB for --judge (20)")
    p.add_argument("--judge-concurrency", type=int, default=8,
                   help="grades in flight at once for --judge (8)")
    p.add_argument("--json", action="store_true", help="print results as JSON")
    p.add_argument("--out", help="also write the JSON results to this file")
    p.set_defaults(handler=main)


def _p(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def _stats(xs: list[float]) -> dict[str, float]:
    return {"p50_ms": round(statistics.median(xs), 3), "p95_ms": round(_p(xs, 0.95), 3),
            "n": len(xs)}


async def _fill(sb: NamespaceSandbox, size_mb: int) -> None:
    block = bytes(range(256)) * (MiB // 256)
    for i in range(size_mb):
        await sb.write_file(f"data/blob{i:04d}.bin", block)
    for i in range(SMALL_FILES):
        await sb.write_file(f"src/pkg{i % 20}/mod{i}.py", f"X = {i}\n".encode() * 64)


async def _first_run(sb: NamespaceSandbox) -> None:
    r = await sb.exec(["true"])
    if r.status is not ExecStatus.OK:
        raise RuntimeError(f"bench fork: a run failed: {r.status.value} {r.message}")


async def _copy(pool: CellPool, parent: NamespaceSandbox, limits: Limits) -> tuple[float, float]:
    """A new session with a copy of the parent's files: (ms to copied, ms to first run)."""
    t0 = time.perf_counter()
    sb = await NamespaceSandbox.open(pool, limits)
    try:
        for cmd in (["cp", "-a", f"{parent.dir}/.", f"{sb.dir}/"],
                    ["chown", "-R", f"{sb.uid}:{sb.uid}", sb.dir]):
            proc = await asyncio.create_subprocess_exec(*cmd)
            if await proc.wait() != 0:
                raise RuntimeError(f"bench fork: {cmd[0]} failed")
        t1 = time.perf_counter()
        await _first_run(sb)
        t2 = time.perf_counter()
    finally:
        await sb.close()
    return (t1 - t0) * 1e3, (t2 - t0) * 1e3


async def _round(parent: NamespaceSandbox, limits: Limits, k: int,
                 m: dict[str, list[float]]) -> int:
    """One snapshot of `parent` and 8 forks of it (each run once, then closed)."""
    await parent.write_file(f"round{k}", b"k")  # a new state to freeze
    t0 = time.perf_counter()
    snap = await parent.snapshot()
    m["snapshot"].append((time.perf_counter() - t0) * 1e3)
    async with snap:
        forks, opened = [], []
        t0 = time.perf_counter()
        for _ in range(8):
            t, c = time.perf_counter(), time.process_time()
            forks.append(await snap.open(limits))
            opened.append((time.perf_counter() - t) * 1e3)
            m["fork_cpu"].append((time.process_time() - c) * 1e3)
        m["fork8_total"].append((time.perf_counter() - t0) * 1e3)
        m["fork"] += opened
        for f, open_ms in zip(forks, opened, strict=True):
            t = time.perf_counter()
            await _first_run(f)
            m["fork_to_first_run"].append(open_ms + (time.perf_counter() - t) * 1e3)
        for f in forks:
            await f.close()
        return snap.used_bytes


async def bench(sizes: list[int], rounds: int, copies: int) -> dict[str, Any]:
    """Every size's parent is filled first; then the copies; then `rounds` rounds that
    each snapshot and fork every size in turn (sizes interleaved: a drift in the
    machine's load hits them all alike)."""
    pool = await CellPool(PoolConfig(warm=8, max_warm=16)).start()
    keys = ("snapshot", "fork", "fork_cpu", "fork8_total", "fork_to_first_run", "copy",
            "copy_to_first_run")
    m: dict[int, dict[str, list[float]]] = {s: {k: [] for k in keys} for s in sizes}
    used: dict[int, int] = {}
    parents: dict[int, tuple[NamespaceSandbox, Limits]] = {}
    try:
        for s in sizes:
            limits = Limits(wall_s=10, cpu_s=10, memory_mb=256, disk_mb=s + 64)
            parents[s] = (await NamespaceSandbox.open(pool, limits), limits)
            await _fill(parents[s][0], s)
            await _first_run(parents[s][0])
        for s in sizes:
            for _ in range(copies):
                c, r = await _copy(pool, *parents[s])
                m[s]["copy"].append(c)
                m[s]["copy_to_first_run"].append(r)
        for k in range(rounds):
            for s in sizes:
                used[s] = await _round(*parents[s], k, m[s])
    finally:
        for sb, _ in parents.values():
            await sb.close()
        await pool.close()
    out: list[dict[str, Any]] = [
        {"size_mb": s, "frozen_bytes": used[s], **{k: _stats(m[s][k]) for k in keys}}
        for s in sizes]
    forks = [r["fork"]["p50_ms"] for r in out]
    return {"sizes": out, "goal_fork_p50_ms": GOAL_MS,
            "fork_p50_max_ms": max(forks),
            "fork_flat_ratio": round(max(forks) / min(forks), 2),
            "goal_met": max(forks) <= GOAL_MS}


# ------------------------------------------------------------ the repository judge

def _repo_task(tree_mb: int) -> Any:
    from trialbox.types import Task, TaskKind
    files = [("calc/__init__.py", b""),
             ("calc/ops.py", b"def add(a, b):\n    raise NotImplementedError\n")]
    files += [(f"calc/gen/m{i:03d}.py", f"V{i} = {i}\n".encode() * 64) for i in range(300)]
    files += [("calc/gen/__init__.py", b"")]
    block = bytes(range(256)) * (MiB // 256)
    files += [(f"data/blob{i:03d}.bin", block) for i in range(tree_mb)]
    return Task("bench-repo", TaskKind.REPO, prompt="Implement calc.ops.add.",
                files=tuple(files), test_files=(("tests/test_ops.py", (
                    b"from calc.ops import add\n\n\ndef test_add():\n"
                    b"    assert add(2, 3) == 5\n")),),
                hidden_test_files=(("tests/test_hidden.py", (
                    b"from calc.ops import add\n\n\ndef test_neg():\n"
                    b"    assert add(-2, -3) == -5\n")),),
                test_command=("pytest",))


def _answers(n: int) -> list[dict[str, str]]:
    """N different answers: even ones right, odd ones wrong (each its own source)."""
    return [{"calc/ops.py": f"# candidate {i}\ndef add(a, b):\n    return a "
             f"{'+' if i % 2 == 0 else '-'} b\n"} for i in range(n)]


async def _grade_all(task: Any, answers: list[dict[str, str]], pool: CellPool, config: Any,
                     gate: asyncio.Semaphore) -> tuple[list[str], list[float]]:
    """Every answer's outcome, and each grade's wall time (ms)."""
    from trialbox.judge import repo
    times: list[float] = []

    async def one(answer: dict[str, str]) -> str:
        async with gate:
            t = time.perf_counter()
            g = await repo.judge_repo(task, answer, pool, config)
            times.append((time.perf_counter() - t) * 1e3)
            return g.outcome.value
    return list(await asyncio.gather(*(one(a) for a in answers))), times


class _Timed:
    """Times the judge's `_open` (a session of an attempt made ready: a fork with the
    answer's changes, or every file written) — the part the snapshot path changes; the
    rest of a grade is the tests' run, the same on both paths."""

    def __init__(self) -> None:
        from trialbox.judge import repo
        self.repo, self.inner = repo, repo._open
        self.ms: list[float] = []

    async def __call__(self, *args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        sb = await self.inner(*args, **kwargs)
        self.ms.append((time.perf_counter() - t) * 1e3)
        return sb

    def __enter__(self) -> _Timed:
        self.repo._open = self
        return self

    def __exit__(self, *exc: object) -> None:
        self.repo._open = self.inner


async def bench_judge(ns: list[int], tree_mb: int, concurrency: int) -> dict[str, Any]:
    """Grade N answers with each path in turn (snapshot first, then copying, per N)."""
    from trialbox.judge.function import judge_pool_config
    from trialbox.judge.repo import RepoJudgeConfig
    from trialbox.judge.repo_snapshot import release_trees, snapshots_for
    task = _repo_task(tree_mb)
    lim = Limits(wall_s=30, cpu_s=30, memory_mb=512, disk_mb=tree_mb + 32)
    configs = {"snapshot": RepoJudgeConfig(limits=lim, retries=0),
               "copy": RepoJudgeConfig(limits=lim, retries=0, snapshots=False)}
    pool = await CellPool(judge_pool_config(warm=8)).start()
    gate = asyncio.Semaphore(concurrency)
    out: list[dict[str, Any]] = []
    try:
        for n in ns:
            answers = _answers(n)
            row: dict[str, Any] = {"n": n, "tree_mb": tree_mb}
            verdicts: dict[str, list[str]] = {}
            for path, config in configs.items():
                await release_trees(pool)  # the snapshot path pays its first snapshot
                t0, c0 = time.perf_counter(), time.process_time()
                with _Timed() as opens:
                    verdicts[path], times = await _grade_all(task, answers, pool, config,
                                                             gate)
                row[path] = {"total_s": round(time.perf_counter() - t0, 3),
                             "cpu_s": round(time.process_time() - c0, 3),
                             "grade": _stats(times), "session_ready": _stats(opens.ms)}
                if path == "snapshot":
                    trees = snapshots_for(pool)
                    row[path]["forked_sessions"] = trees.forked if trees else 0
            row["verdicts_equal"] = verdicts["snapshot"] == verdicts["copy"]
            row["passed"] = verdicts["snapshot"].count("passed")
            out.append(row)
    finally:
        await release_trees(pool)
        await pool.close()
    return {"judge": out}


def _print_judge(res: dict[str, Any]) -> None:
    print("repository judge: N answers of one task, snapshot path vs copying path "
          "(trusted tier)")
    print(f"  {'N':>4}{'tree':>7}{'path':>10}{'total s':>10}{'grade p50 ms':>14}"
          f"{'ready p50 ms':>14}{'ready p95 ms':>14}{'cpu s':>8}  verdicts")
    for r in res["judge"]:
        for path in ("snapshot", "copy"):
            x = r[path]
            print(f"  {r['n']:>4}{str(r['tree_mb']) + ' MB':>7}{path:>10}"
                  f"{x['total_s']:>10.2f}{x['grade']['p50_ms']:>14.1f}"
                  f"{x['session_ready']['p50_ms']:>14.1f}"
                  f"{x['session_ready']['p95_ms']:>14.1f}{x['cpu_s']:>8.2f}  "
                  f"{'equal' if r['verdicts_equal'] else 'DIFFER'} ({r['passed']} passed)")


def main(args: argparse.Namespace) -> int:
    sizes = [int(s) for s in str(args.sizes).split(",") if s.strip()]
    judge_ns = [int(s) for s in str(args.judge).split(",") if s.strip()]
    if (not sizes and not judge_ns) or min(sizes or [1]) < 1 or args.rounds < 1 \
            or args.copies < 1:
        raise SystemExit("bench fork: --sizes must list sizes >= 1 MB (or be empty with "
                         "--judge); --rounds and --copies must be >= 1")
    if judge_ns and (min(judge_ns) < 1 or args.judge_mb < 0 or args.judge_concurrency < 1):
        raise SystemExit("bench fork: --judge must list counts >= 1, --judge-mb >= 0 and "
                         "--judge-concurrency >= 1")
    res: dict[str, Any] = asyncio.run(bench(sizes, args.rounds, args.copies)) \
        if sizes else {}
    if judge_ns:
        res.update(asyncio.run(bench_judge(judge_ns, args.judge_mb,
                                           args.judge_concurrency)))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=2)
    if args.json:
        print(json.dumps(res, separators=(",", ":")))  # one line, like every bench
        return 0
    if judge_ns:
        _print_judge(res)
    if not sizes:
        return 0
    print("snapshot + fork-8 vs copying the workspace (ms; p50 / p95)")
    print(f"  {'size':>7}{'snapshot':>16}{'fork':>16}{'fork cpu':>16}{'fork-8 total':>16}"
          f"{'fork+run':>16}{'copy':>18}{'copy+run':>18}")
    def cell(r: dict[str, Any], k: str, w: int = 16) -> str:
        return f"{r[k]['p50_ms']:.2f} / {r[k]['p95_ms']:.2f}".rjust(w)

    for r in res["sizes"]:
        print(f"  {str(r['size_mb']) + ' MB':>7}{cell(r, 'snapshot')}{cell(r, 'fork')}"
              f"{cell(r, 'fork_cpu')}"
              f"{cell(r, 'fork8_total')}{cell(r, 'fork_to_first_run')}"
              f"{cell(r, 'copy', 18)}{cell(r, 'copy_to_first_run', 18)}")
    print(f"  goal: fork p50 <= {GOAL_MS} ms per fork, flat in size: max p50 "
          f"{res['fork_p50_max_ms']:.2f} ms, largest/smallest {res['fork_flat_ratio']}x "
          f"({'met' if res['goal_met'] else 'NOT met'})")
    return 0
