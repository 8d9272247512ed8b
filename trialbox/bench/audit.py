"""What the sandbox audit log (sandbox/audit.py) costs per run and per session.

    python -m trialbox.bench.audit [--runs 300]

Three paired measurements, audited against plain: the fake provider's `exec` (the added
work alone, 7 × 20000 calls, median), a fake session (open, one exec, close: the record
is queued at close), and the namespace tier's `/bin/true` in a warm session (`--runs`
per variant in 10 interleaved blocks, so load drifts hit both alike).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from typing import Any

from trialbox.sandbox import CellPool, PoolConfig
from trialbox.sandbox.audit import AuditConfig, AuditLog, audited
from trialbox.sandbox.fake import FakeProvider
from trialbox.types import Limits


async def _per_exec_us(provider: Any, n: int) -> float:
    async with await provider.open() as sb:
        t = time.perf_counter()
        for _ in range(n):
            await sb.exec(["true"])
        return (time.perf_counter() - t) / n * 1e6


async def _per_session_us(provider: Any, n: int) -> float:
    t = time.perf_counter()
    for _ in range(n):
        sb = await provider.open()
        await sb.exec(["true"])
        await sb.close()
    return (time.perf_counter() - t) / n * 1e6


async def bench(runs: int) -> dict[str, float]:
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as d, AuditLog(
            AuditConfig(os.path.join(d, "audit.jsonl"))) as log:
        fake = FakeProvider()
        for name, fn, n, k in (("exec", _per_exec_us, 20000, 7),
                               ("session", _per_session_us, 5000, 5)):
            plain, aud = [], []
            for _ in range(k):
                plain.append(await fn(fake, n))
                aud.append(await fn(audited(fake, log), n))
            out[f"fake_{name}_plain_us"] = statistics.median(plain)
            out[f"fake_{name}_audited_us"] = statistics.median(aud)
        pool = await CellPool(PoolConfig(warm=2)).start()
        try:
            variants = {"plain": pool, "audited": audited(pool, log)}
            ms: dict[str, list[float]] = {k: [] for k in variants}
            for block in range(10):
                order = list(variants) if block % 2 == 0 else list(reversed(variants))
                for name in order:
                    async with await variants[name].open(Limits(wall_s=5)) as sb:
                        for _ in range(max(1, runs // 10)):
                            t = time.perf_counter()
                            r = await sb.exec(["/bin/true"])
                            ms[name].append((time.perf_counter() - t) * 1e3)
                            if not r.ok:
                                raise RuntimeError(f"a benchmark run failed: {r}")
            for name, v in ms.items():
                v.sort()
                out[f"namespace_{name}_p50_ms"] = v[len(v) // 2]
                out[f"namespace_{name}_p95_ms"] = v[int(len(v) * 0.95)]
                out[f"namespace_{name}_mean_ms"] = statistics.mean(v)
        finally:
            await pool.close()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trialbox.bench.audit", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=300,
                   help="namespace-tier runs per variant (300)")
    args = p.parse_args(argv)
    for k, v in asyncio.run(bench(args.runs)).items():
        print(f"{k:32s} {v:10.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
