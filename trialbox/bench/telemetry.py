"""`trialbox bench telemetry`: what the instrumentation costs on the sandbox's hot path.

Two parts, each printed beside its baseline with medians and ratios:

* micro — per call, in a tight loop: the metric updates of one run (`record_exec`), a
  disabled `span()`, an enabled span (the dashboard's in-memory keeper listening);
* runs — real sandbox runs of `print(1)` in one session, in interleaved blocks:
  the undecorated `NamespaceSandbox.exec` (baseline: `exec.__wrapped__`, no metrics, no
  span), the decorated one with tracing off (what every caller pays), and with tracing
  on. Block order rotates so that drift on a shared machine hits every variant alike.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

from trialbox.bench import report
from trialbox.telemetry import tracing
from trialbox.telemetry.instrument import record_exec
from trialbox.telemetry.metrics import use_metrics
from trialbox.telemetry.tracing import RecentSpans, span
from trialbox.types import ExecResult, ExecStatus


def add_parser(bsub: Any) -> None:
    p = bsub.add_parser("telemetry", help="instrumentation overhead on sandbox runs vs "
                        "the undecorated exec")
    p.add_argument("--runs", type=int, default=300, help="sandbox runs per variant (300)")
    p.add_argument("--blocks", type=int, default=10, help="interleaved blocks (10)")
    report.add_output_arguments(p)
    p.set_defaults(handler=main)


def _per_call_us(fn: Callable[[], object], n: int = 20000, repeats: int = 7) -> float:
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        samples.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(samples)


def micro() -> dict[str, float]:
    result = ExecResult(status=ExecStatus.OK, wall_ms=3.0)
    out: dict[str, float] = {}
    out["empty_loop_us"] = _per_call_us(lambda: None)
    with use_metrics():
        out["record_exec_us"] = _per_call_us(lambda: record_exec(result))

    def one_span() -> None:
        with span("x"):
            pass

    saved = tracing._S.fanout.processors
    tracing._provider("trialbox")
    tracing._S.fanout.processors = ()
    try:
        out["span_disabled_us"] = _per_call_us(one_span)
        tracing._S.fanout.processors = (RecentSpans(1000),)
        out["span_enabled_us"] = _per_call_us(one_span, n=5000)
    finally:
        tracing._S.fanout.processors = saved
    return out


async def runs(n: int, blocks: int) -> dict[str, dict[str, float]]:
    from trialbox.sandbox import CellPool, NamespaceSandbox, PoolConfig

    pool = await CellPool(PoolConfig(warm=2)).start()
    bare = NamespaceSandbox.exec.__wrapped__  # type: ignore[attr-defined]
    argv = ["python3", "-c", "print(1)"]
    saved = tracing._S.fanout.processors
    tracing._provider("trialbox")
    keeper = RecentSpans(5000)
    times: dict[str, list[float]] = {"baseline": [], "tracing off": [], "tracing on": []}
    try:
        async with await NamespaceSandbox.open(pool) as sb:
            variants: dict[str, Callable[[], Awaitable[ExecResult]]] = {
                "baseline": lambda: bare(sb, argv),
                "tracing off": lambda: sb.exec(argv),
                "tracing on": lambda: sb.exec(argv),
            }
            for _ in range(20):  # warm up the cell and the interpreter's caches
                await sb.exec(argv)
            names = list(variants)
            per_block = max(1, n // blocks)
            with use_metrics():
                for b in range(blocks):
                    order = names[b % 3:] + names[:b % 3]
                    for name in order:
                        tracing._S.fanout.processors = (keeper,) if name == "tracing on" \
                            else ()
                        fn = variants[name]
                        for _ in range(per_block):
                            t0 = time.perf_counter()
                            r = await fn()
                            times[name].append((time.perf_counter() - t0) * 1e6)
                            if r.status is not ExecStatus.OK:
                                raise RuntimeError(f"benchmark run failed: {r.status} "
                                                   f"{r.message}")
    finally:
        tracing._S.fanout.processors = saved
        await pool.close()
    base = statistics.median(times["baseline"])
    out = {}
    for name, xs in times.items():
        xs.sort()
        med = statistics.median(xs)
        out[name] = {"runs": len(xs), "median_us": med, "p95_us": xs[int(0.95 * len(xs))],
                     "delta_us": med - base, "ratio": med / base}
    return out


def render(results: dict[str, Any], blocks: int) -> str:
    """The overheads for people: per call, then per sandbox run."""
    m, r = results["micro_us"], results["runs"]
    lines = ["telemetry overhead (µs per call; medians)",
             f"  {'empty loop iteration':<34}{m['empty_loop_us']:>9.3f}",
             f"  {'record_exec (counter+histogram)':<34}{m['record_exec_us']:>9.3f}",
             f"  {'span() while tracing is off':<34}{m['span_disabled_us']:>9.3f}",
             f"  {'span() with a listener':<34}{m['span_enabled_us']:>9.3f}",
             "",
             f"sandbox runs of print(1), one session, {blocks} interleaved blocks",
             f"  {'variant':<14}{'runs':>6}{'median µs':>12}{'p95 µs':>10}{'Δ µs':>9}"
             f"{'ratio':>8}"]
    for name, v in r.items():
        lines.append(f"  {name:<14}{v['runs']:>6}{v['median_us']:>12.1f}{v['p95_us']:>10.1f}"
                     f"{v['delta_us']:>9.1f}{v['ratio']:>8.3f}")
    lines.append("  baseline = NamespaceSandbox.exec undecorated (no metrics, no span)")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    results = {"micro_us": micro(), "runs": asyncio.run(runs(args.runs, args.blocks))}
    report.emit(results, args, render(results, args.blocks))
    return 0
