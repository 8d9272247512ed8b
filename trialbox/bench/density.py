"""`trialbox bench density`: how many live sessions one node holds, and what each costs.

Opens N namespace-tier sessions on one pool whose capacity is configured to N, runs one
command in each (a Python one-liner whose output is checked) and keeps every session
open, holding its cell (namespaces, cgroup, init and the candidate forked ahead), so at
the end all N are live at once. Then it reports:

- host memory per live session, from just before the first session to when all N are
  live, over N: "pss_kernel" (the headline) = the growth of the summed PSS of every
  process in the pool's cells (smaps_rollup: shared pages split among sharers) + the
  growth of the kernel's own memory in /proc/meminfo (slab, page tables, kernel stacks,
  per-cpu, tmpfs: namespaces, mounts, cgroups, sockets, workspaces) + the supervisor's
  RSS growth; beside it the drop in MemAvailable ("memavailable": everything, but moved
  by every other process on the host too) and the cells' cgroup charge ("cgroup");
- descriptors the supervisor holds per live session, and the RLIMIT_NOFILE in force;
- the node's derived capacity (capacity.py) next to N;
- that every live session can still run: with all N open, a second command in each
  reads the file its first wrote (with --park, each takes a cell again and parks);
- capacity queueing: with all N open, `--extra` more openers wait (none fails); as many
  sessions close, they get in, run, and their wait is reported; one more with a short
  deadline gets `Unavailable` naming what to change.

Any command that does not print what it was asked to, any opener that fails, makes the
exit status 1. Machine-wide figures (MemAvailable) move with whatever else the host does:
run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import sys
import time
from typing import Any

from trialbox.bench import report
from trialbox.errors import Unavailable
from trialbox.sandbox.capacity import derive_capacity
from trialbox.sandbox.namespace import NamespaceSandbox
from trialbox.sandbox.pool import CellPool, PoolConfig
from trialbox.types import ExecStatus, Limits

MiB = 1 << 20


def add_parser(bsub: Any) -> None:
    p = bsub.add_parser("density", help="live sessions on one node: N opened, a command in "
                        "each, memory and descriptors per session, capacity queueing")
    p.add_argument("--sessions", type=int, default=10_000, help="live sessions (10000)")
    p.add_argument("--concurrency", type=int, default=32,
                   help="sessions being opened and run at once (32)")
    p.add_argument("--extra", type=int, default=32,
                   help="openers past capacity that must wait, not fail (32)")
    p.add_argument("--park", action="store_true",
                   help="park each session after its command (it keeps its files, hands "
                   "its cell back): the cost of a session while the model thinks")
    report.add_output_arguments(p)
    p.set_defaults(handler=main)


def mem_available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


KERNEL_FIELDS = ("SUnreclaim", "PageTables", "KernelStack", "Percpu", "Shmem")
"""/proc/meminfo fields that grow with live cells outside any process's PSS: slab
(namespaces, mounts, cgroups, sockets), page tables, kernel stacks, per-cpu cgroup
statistics, and tmpfs pages (the sessions' workspaces)."""


def meminfo(fields: tuple[str, ...]) -> int:
    total = 0
    with open("/proc/meminfo") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name in fields:
                total += int(rest.split()[0]) * 1024
    return total


def cells_pss(pool: CellPool) -> tuple[int, int]:
    """(processes, summed PSS in bytes) of every process in the pool's cells: each
    shared page counted once over its sharers (the zygote's share stays the zygote's)."""
    root = pool.cgroups.roots["pids"]
    top = os.path.join(root, "trialbox", pool.id)
    pids: set[int] = set()
    for d, _dirs, files in os.walk(top):
        if "cgroup.procs" in files:
            try:
                with open(os.path.join(d, "cgroup.procs")) as f:
                    pids.update(int(x) for x in f.read().split())
            except OSError:
                pass
    pss = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        pss += int(line.split()[1]) * 1024
                        break
        except OSError:
            pass
    return len(pids), pss


def _rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def pool_cgroup_bytes(pool: CellPool) -> int:
    """Memory charged to the pool's cgroup (all its cells, hierarchically)."""
    root = pool.cgroups.roots["memory"]
    name = "memory.usage_in_bytes" if pool.cgroups.version == 1 else "memory.current"
    try:
        with open(os.path.join(root, "trialbox", pool.id, name)) as f:
            return int(f.read())
    except (OSError, ValueError):
        return 0


async def _open_and_run(pool: CellPool, i: int, park: bool) -> tuple[NamespaceSandbox, float]:
    t0 = time.monotonic()
    sb = await NamespaceSandbox.open(pool, Limits(wall_s=30))
    try:
        r = await sb.exec(["python3", "-c",
                           f"print(open('n.txt', 'w').write(str({i} * 7)) and {i} * 7)"])
        if r.status is not ExecStatus.OK or r.stdout != f"{i * 7}\n".encode():
            raise RuntimeError(f"session {i}: {r.status.value} {r.message!r} "
                               f"stdout={r.stdout[:80]!r}")
        if park:
            await sb.park()
    except BaseException:
        await sb.close()
        raise
    return sb, (time.monotonic() - t0) * 1e3


async def _run_again(sb: NamespaceSandbox, i: int) -> None:
    """The session's second command: reads the file its first one wrote (a parked
    session takes a cell again, with its workspace), then parks or holds as before."""
    parked = sb.parked
    r = await sb.exec(["python3", "-c", "print(open('n.txt').read())"])
    if r.status is not ExecStatus.OK or r.stdout != f"{i * 7}\n".encode():
        raise RuntimeError(f"session {i}, second command: {r.status.value} "
                           f"{r.message!r} stdout={r.stdout[:80]!r}")
    if parked:
        await sb.park()


async def run_density(n: int, concurrency: int = 32, extra: int = 32,
                      park: bool = False) -> dict[str, Any]:
    """The measurement (see the module docstring); raises on any failed session."""
    if n < 1 or concurrency < 1 or extra < 0:
        raise ValueError("need sessions >= 1, concurrency >= 1, extra >= 0")
    pool = await CellPool(PoolConfig(capacity=n, capacity_wait_s=600)).start()
    sessions: list[NamespaceSandbox] = []
    out: dict[str, Any] = {"sessions": n, "concurrency": concurrency, "parked": park}
    try:
        await pool.settle(5)
        host = derive_capacity(None, pool.config.session_memory_mb, pool.config.uid_count,
                               pool.config.dense_after)
        out["derived_capacity"] = {"sessions": host.sessions, "limit": host.limit,
                                   "bounds": host.bounds}
        out["fd_limit"] = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        mem0, rss0, fd0, cg0 = mem_available(), _rss(), _fds(), pool_cgroup_bytes(pool)
        k0, (_procs0, pss0) = meminfo(KERNEL_FIELDS), cells_pss(pool)

        # -- N sessions, one command each, all kept open
        t0 = time.monotonic()
        latencies: list[float] = []
        errors: list[str] = []
        next_i = iter(range(n))
        number: dict[int, int] = {}

        async def worker() -> None:
            for i in next_i:
                try:
                    sb, ms = await _open_and_run(pool, i, park)
                except Exception as e:  # counted, reported, and the run fails
                    errors.append(f"{type(e).__name__}: {e}")
                    continue
                sessions.append(sb)
                number[id(sb)] = i
                latencies.append(ms)

        await asyncio.gather(*(worker() for _ in range(min(concurrency, n))))
        out["open_and_run_s"] = round(time.monotonic() - t0, 2)
        out["failed"] = len(errors)
        out["errors"] = errors[:5]
        await asyncio.sleep(1.0)  # background work of the last opens settles
        mem1, rss1, fd1, cg1 = mem_available(), _rss(), _fds(), pool_cgroup_bytes(pool)
        k1, (procs1, pss1) = meminfo(KERNEL_FIELDS), cells_pss(pool)
        out["cell_processes"] = procs1
        live = len(sessions)
        out["live"] = live
        out["open_and_run_ms"] = {
            "p50": round(statistics.median(latencies), 2) if latencies else None,
            "p99": round(sorted(latencies)[int(0.99 * (len(latencies) - 1))], 2)
            if latencies else None}
        out["memory_per_session_mib"] = {
            "pss_kernel": round((pss1 - pss0 + k1 - k0 + rss1 - rss0) / max(1, live) / MiB, 3),
            "cells_pss": round((pss1 - pss0) / max(1, live) / MiB, 3),
            "kernel": round((k1 - k0) / max(1, live) / MiB, 3),
            "memavailable": round((mem0 - mem1) / max(1, live) / MiB, 3),
            "cgroup": round((cg1 - cg0) / max(1, live) / MiB, 3),
            "supervisor_rss": round((rss1 - rss0) / max(1, live) / MiB, 3)}
        out["fds_per_session"] = round((fd1 - fd0) / max(1, live), 2)
        out["cells_live"] = len(pool._live)

        # -- every live session can still run: a second command in each, all N open
        t1, again_errors = time.monotonic(), []
        todo = iter(list(sessions))

        async def again() -> None:
            for sb in todo:
                try:
                    await _run_again(sb, number[id(sb)])
                except Exception as e:
                    again_errors.append(f"{type(e).__name__}: {e}")
        await asyncio.gather(*(again() for _ in range(min(concurrency, n))))
        out["second_command"] = {"ran": live - len(again_errors),
                                 "failed": len(again_errors), "errors": again_errors[:5],
                                 "s": round(time.monotonic() - t1, 2)}

        # -- past capacity: openers wait, then get in as sessions close
        assert pool.admission is not None
        queue: dict[str, Any] = {"extra": extra}
        if live == n and extra:
            waiters = [asyncio.ensure_future(_open_and_run(pool, n + k, False))
                       for k in range(extra)]
            await asyncio.sleep(0.5)
            queue["waiting_after_0.5s"] = pool.admission.waiting
            queue["started_while_full"] = sum(w.done() for w in waiters)
            try:  # one with a short deadline: a clear error, not an infra result
                await pool.admission.enter(timeout=0.2)
                pool.admission.leave()
                queue["deadline_error"] = None
            except Unavailable as e:
                queue["deadline_error"] = str(e)
            t1 = time.monotonic()
            for sb in sessions[:extra]:
                await sb.close()
            del sessions[:extra]
            got = await asyncio.gather(*waiters, return_exceptions=True)
            queue["failed"] = [repr(g) for g in got if isinstance(g, BaseException)]
            queue["served_after_close_s"] = round(time.monotonic() - t1, 3)
            sessions.extend(g[0] for g in got if not isinstance(g, BaseException))
        out["queue"] = queue
        out["peak_open"] = pool.admission.peak
    finally:
        t2 = time.monotonic()
        for k in range(0, len(sessions), 256):
            await asyncio.gather(*(sb.close() for sb in sessions[k:k + 256]))
        await pool.close()
        out["close_s"] = round(time.monotonic() - t2, 2)
    q = out["queue"]
    out["ok"] = (out["failed"] == 0 and out["live"] == n
                 and out.get("second_command", {}).get("failed", 1) == 0
                 and (extra == 0 or (q.get("waiting_after_0.5s") == extra
                                     and q.get("started_while_full") == 0
                                     and not q.get("failed")
                                     and q.get("deadline_error") is not None)))
    return out


def render(out: dict[str, Any]) -> str:
    """The summary for people: sessions, memory and descriptors each, capacity."""
    lines: list[str] = []
    m = out["memory_per_session_mib"]
    q = out["queue"]
    lines.append(f"{out['live']:,}/{out['sessions']:,} sessions live, {out['failed']} failed; "
                 f"opened+ran in {out['open_and_run_s']} s (p50 {out['open_and_run_ms']['p50']} "
                 f"ms each at {out['concurrency']} at once)")
    lines.append(f"host memory per live session: {m['pss_kernel']} MiB (cells' PSS "
                 f"{m['cells_pss']} + kernel {m['kernel']} + supervisor RSS "
                 f"{m['supervisor_rss']}); MemAvailable drop {m['memavailable']} MiB; "
                 f"cgroup charge {m['cgroup']} MiB; "
                 f"{out['fds_per_session']} descriptors each (RLIMIT_NOFILE {out['fd_limit']:,})")
    d = out["derived_capacity"]
    a = out.get("second_command")
    if a:
        lines.append(f"then a second command in every live session (it reads the file "
                     f"the first wrote): {a['ran']:,} ran, {a['failed']} failed, in "
                     f"{a['s']} s")
    lines.append(f"derived node capacity: {d['sessions']:,} sessions ({d['limit']}: "
                 f"{d['bounds']})")
    if q.get("extra"):
        lines.append(f"past capacity: {q.get('waiting_after_0.5s')}/{q['extra']} waiting, "
                     f"{q.get('started_while_full')} started while full, served "
                     f"{q.get('served_after_close_s')} s after as many closed, "
                     f"{len(q.get('failed', []))} failed; a short deadline: "
                     f"{(q.get('deadline_error') or 'NO ERROR')[:100]}")
    lines.append(f"closed in {out['close_s']} s; {'OK' if out['ok'] else 'FAILED'}")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    out = asyncio.run(run_density(args.sessions, args.concurrency, args.extra, args.park))
    report.emit(out, args, render(out))
    if not out["ok"]:
        print(f"density: FAILED: {out['errors'] or out['queue']}", file=sys.stderr)
    return 0 if out["ok"] else 1
