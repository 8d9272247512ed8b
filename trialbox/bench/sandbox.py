"""`trialbox bench sandbox`: start latency and throughput of the namespace tier, measured
side by side with four baselines in the same run.

    trialbox bench sandbox [--json] [--runs N] [--seconds S] [--concurrency 1,2,4,8]
                           [--out FILE]
    trialbox bench sandbox --tiers namespace,container,gvisor   # the tiers: bench/tiers.py

Systems:

* ``trialbox`` — the namespace tier, multi-turn: ``sb.exec(["python3", "-c", SNIPPET])``
  in an open session. The session takes a cell (namespaces + cgroup) from the warm pool
  at its first run and keeps it until it closes; each run forks a fresh candidate process
  in that cell (Python starts warm, forked from the pool's zygote). One session per
  worker, opened before the clock starts.
* ``trialbox-1shot`` — the namespace tier, one-shot: every run opens a new session
  (``await NamespaceSandbox.open(pool)``), runs the snippet once and closes it, so every
  run takes a fresh cell from the pool — the cost a one-shot judge pays. It shares the
  ``trialbox`` system's CellPool.
* ``plain`` — ``/usr/bin/python3 -c SNIPPET`` as an asyncio subprocess with pipes, no
  isolation at all: the floor for a cold interpreter.
* ``bwrap`` — bubblewrap running ``/usr/bin/python3 -c SNIPPET`` with isolation as close
  to the namespace tier's as bwrap allows: every namespace unshared, the merged-/usr
  root read-only, private /proc, /dev, /tmp and /workspace, a cleared environment,
  uid/gid 1000, no capabilities, no_new_privs, and trialbox's own seccomp filter. bwrap
  has no cgroup limits (memory, pids, CPU accounting) and sets no rlimits: its isolation
  does less work per run than trialbox-1shot's.
* ``forkserver`` — trialbox's pre-fork design with no isolation (`forkserver.py`): a
  ``/usr/bin/python3`` fork server per session pre-forks a child that waits for a go,
  then runs the program. trialbox against it shows the cost of isolation itself, since
  both start Python warm.
* ``bwrap-forkserver`` — the same fork server started once per session inside bwrap
  (the ``bwrap`` system's isolation, set up once); per run only a fork inside it.

The ratios are printed against every baseline: start p50 and p95, e2e p50, throughput.

Metric A, start-to-first-instruction latency: SNIPPET prints ``time.monotonic_ns()``;
latency is that value minus ``time.monotonic_ns()`` taken just before the call (every
process shares CLOCK_MONOTONIC; neither trialbox nor bwrap unshares the time namespace).
The runs are sequential and interleaved round-robin (trialbox, trialbox-1shot, plain,
bwrap, forkserver, bwrap-forkserver, trialbox, …) after a few warm-up runs, so machine
noise hits every system alike.
Between two calls the harness waits, off the clock, until the trialbox pool has refilled
and removed the cgroups of closed cells, so each call starts on a quiet machine (and a
trialbox-1shot call finds a warm cell waiting); the cost of refilling shows in the
throughput figures instead. trialbox-1shot's e2e figure includes opening and closing
the session.

Metric B, throughput: runs per second of ``print(1)`` with N concurrent workers for S
seconds per point (trialbox, forkserver, bwrap-forkserver: one session per worker,
opened off the clock; trialbox-1shot: a session opened and closed per run, on the
clock). A run counts only if it exited 0 and printed exactly ``1``; failures are
counted and reported apart. For each level the systems run one after another; the
whole set runs twice and the median of the two rounds is reported.

Output: a table on stdout; with --json the results as one JSON object on the last line;
--out FILE writes the same JSON to FILE. Missing a goal is a measurement, not an error:
the exit status is 0 when everything ran, 1 when a system could not run or some runs
failed (the figures are still printed).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import math
import os
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trialbox.bench.report import (
    emit,
    machine_info,
    median,
    notes_and_problems,
    percentile,
)
from trialbox.bench.report import fmt as _fmt
from trialbox.bench.report import fmt_x as _fmt_x
from trialbox.bench.report import log as _log
from trialbox.bench.report import met as _met
from trialbox.bench.report import ratio as _ratio
from trialbox.bench.report import rounded as _r
from trialbox.bench.report import wrap as _wrap
from trialbox.errors import UsageError

SNIPPET_START = "import time; print(time.monotonic_ns())"
SNIPPET_PRINT = "print(1)"
PYTHON = "/usr/bin/python3"
BWRAP = "/usr/bin/bwrap"
SYSTEMS = ("trialbox", "trialbox-1shot", "plain", "bwrap", "forkserver", "bwrap-forkserver")
BASELINES = ("plain", "bwrap", "forkserver", "bwrap-forkserver")
SHORT = {"trialbox": "trialbox", "trialbox-1shot": "1shot", "plain": "plain",
         "bwrap": "bwrap", "forkserver": "fork", "bwrap-forkserver": "bwrap-fork"}
"""Column headings of the throughput table."""
INITIALS = {"trialbox": "t", "trialbox-1shot": "1", "plain": "p", "bwrap": "b",
            "forkserver": "f", "bwrap-forkserver": "bf"}
ROUNDS = 2
LATENCY_WARMUP = 5
THROUGHPUT_WARMUP = 2  # runs per worker before each point, not counted
GOAL_P50_MS = 5.0
GOAL_THROUGHPUT_X = 2.0
CALL_TIMEOUT_S = 30.0
SMALL_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/workspace",
             "LANG": "C.UTF-8"}

ISOLATION = {
    "trialbox": "namespace tier, one session per worker. Per session, a cell from the warm "
                "pool: pid/mount/net/ipc/uts namespaces, read-only /usr root, cgroup "
                "limits+accounting (memory, pids, CPU), private tmpfs workspace. Per run: "
                "a process forked in that cell, its own user namespace, uid 1000, no "
                "capabilities, seccomp, rlimits",
    "trialbox-1shot": "the same isolation as trialbox, but a new session for every run: a "
                      "fresh tmpfs workspace and a cell from the pool (a closed session's "
                      "cell reset — new IPC and network namespaces, no process left — or "
                      "a new one), nothing carried from one run to the next",
    "plain": "none: /usr/bin/python3 -c as an asyncio subprocess with pipes",
    "bwrap": "bubblewrap --unshare-all (user/pid/mount/net/ipc/uts/cgroup), read-only "
             "/usr root, tmpfs /tmp and /workspace, --clearenv, uid 1000, --cap-drop ALL, "
             "no_new_privs, trialbox's seccomp filter, all set up per run; NO cgroup "
             "limits, NO rlimits",
    "forkserver": "none, but warm: one /usr/bin/python3 fork server per session (per "
                  "worker, started off the clock) pre-forks a child that waits for a go "
                  "(the program, its stdout/stderr fds over a socketpair) and runs it; "
                  "per run one fork — trialbox's pre-fork design with no isolation",
    "bwrap-forkserver": "the bwrap system's isolation (namespaces, read-only /usr root, "
                        "tmpfs /tmp and /workspace, uid 1000, caps dropped, seccomp) "
                        "set up ONCE per session around the same fork server; per run "
                        "only a fork inside it; NO cgroup limits, NO rlimits, nothing "
                        "renewed between runs",
}


# ------------------------------------------------------------------ small helpers

def parse_levels(text: str) -> list[int]:
    """'1,2,4,8' -> [1, 2, 4, 8]; each level a positive integer, duplicates dropped."""
    levels: list[int] = []
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        try:
            n = int(part)
        except ValueError:
            raise UsageError(f"--concurrency takes comma-separated positive integers, "
                             f"e.g. 1,2,4,8; got {text!r}") from None
        if n < 1 or n > 256:
            raise UsageError(f"--concurrency levels must be between 1 and 256, got {n}")
        if n not in levels:
            levels.append(n)
    if not levels:
        raise UsageError("--concurrency needs at least one level, e.g. 1,2,4,8")
    return levels


@dataclass
class Outcome:
    """One run: did it succeed, what did it print, what went wrong."""

    ok: bool
    stdout: bytes
    error: str = ""


class Runner:
    """Runs a snippet in one system. One runner per concurrent worker."""

    async def run(self, code: str) -> Outcome:
        raise NotImplementedError

    async def close(self) -> None:
        """Release the runner (a trialbox session)."""


class System:
    name = ""

    async def start(self) -> None:
        """Prepare the system (raises when it cannot run here)."""

    async def runner(self) -> Runner:
        raise NotImplementedError

    async def settle(self) -> None:
        """Wait, off the clock, until the system's background work is done."""

    async def close(self) -> None:
        """Release what start() took."""


# ------------------------------------------------------------------ subprocess systems

class _ProcRunner(Runner):
    def __init__(self, argv_of: Callable[[str], tuple[list[str], list[int]]], cwd: str):
        self.argv_of, self.cwd = argv_of, cwd

    async def run(self, code: str) -> Outcome:
        argv, fds = self.argv_of(code)
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, env=SMALL_ENV, cwd=self.cwd, pass_fds=fds)
        except OSError as e:
            return Outcome(False, b"", f"could not start {argv[0]}: {e}")
        finally:
            for fd in fds:
                os.close(fd)
        try:
            out, err = await asyncio.wait_for(proc.communicate(), CALL_TIMEOUT_S)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            return Outcome(False, b"", f"timed out after {CALL_TIMEOUT_S}s")
        if proc.returncode != 0:
            return Outcome(False, out, f"exit {proc.returncode}: "
                           f"{err.decode(errors='replace').strip()[-300:]}")
        return Outcome(True, out)


class PlainSystem(System):
    name = "plain"

    def __init__(self) -> None:
        self.tmp = tempfile.TemporaryDirectory(prefix="trialbox-bench-")

    async def runner(self) -> Runner:
        return _ProcRunner(lambda code: ([PYTHON, "-c", code], []), self.tmp.name)

    async def close(self) -> None:
        self.tmp.cleanup()


def _bwrap_version() -> str:
    try:
        out = subprocess.run([BWRAP, "--version"], capture_output=True, text=True,
                             timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return "bubblewrap (version unknown)"
    return out.stdout.strip() or "bubblewrap (version unknown)"


def bwrap_argv(code: str, seccomp_fd: int | None) -> list[str]:
    argv = [BWRAP, "--unshare-all", "--die-with-parent", "--new-session",
            "--ro-bind", "/usr", "/usr"]
    for top in ("bin", "lib", "lib64", "sbin"):
        host = "/" + top
        if os.path.islink(host):
            argv += ["--symlink", os.readlink(host), host]
        elif os.path.isdir(host):
            argv += ["--ro-bind", host, host]
    argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
             "--tmpfs", "/workspace", "--chdir", "/workspace", "--hostname", "sandbox",
             "--clearenv"]
    for k, v in SMALL_ENV.items():
        argv += ["--setenv", k, v]
    argv += ["--uid", "1000", "--gid", "1000", "--cap-drop", "ALL"]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    return argv + [PYTHON, "-c", code]


class BwrapSystem(System):
    name = "bwrap"

    def __init__(self) -> None:
        self.tmp = tempfile.TemporaryDirectory(prefix="trialbox-bench-")
        self.seccomp: bytes | None = None
        self.version = ""

    async def start(self) -> None:
        if not os.access(BWRAP, os.X_OK):
            raise RuntimeError(f"{BWRAP} not found; install bubblewrap "
                               "(apt-get install bubblewrap, or `make system`)")
        self.version = _bwrap_version()
        try:
            from trialbox.sandbox.seccomp import build_filter
            self.seccomp = build_filter()
        except Exception as e:
            _log(f"bwrap runs without seccomp (no filter for this host: {e})")
            self.seccomp = None

    def _argv(self, code: str) -> tuple[list[str], list[int]]:
        if self.seccomp is None:
            return bwrap_argv(code, None), []
        # bwrap reads the program from the fd to its end: one fresh memfd per run.
        fd = os.memfd_create("seccomp", 0)
        os.write(fd, self.seccomp)
        os.lseek(fd, 0, os.SEEK_SET)
        return bwrap_argv(code, fd), [fd]

    async def runner(self) -> Runner:
        return _ProcRunner(self._argv, self.tmp.name)

    async def close(self) -> None:
        self.tmp.cleanup()


# ------------------------------------------------------------------ trialbox

def _exec_outcome(r: Any) -> Outcome:
    if not r.ok:
        return Outcome(False, r.stdout, f"{r.status.value}: {r.message} "
                       f"{r.stderr_text.strip()[-300:]}".strip())
    return Outcome(True, r.stdout)


class _SessionRunner(Runner):
    """trialbox: one open session, many runs (each a fresh process in the session's cell)."""

    def __init__(self, sb: Any):
        self.sb = sb

    async def run(self, code: str) -> Outcome:
        return _exec_outcome(await self.sb.exec(["python3", "-c", code]))

    async def close(self) -> None:
        await self.sb.close()


class _OneShotRunner(Runner):
    """trialbox-1shot: every run opens a session (a fresh cell), runs once, closes it."""

    def __init__(self, pool: Any):
        self.pool = pool

    async def run(self, code: str) -> Outcome:
        from trialbox.sandbox import NamespaceSandbox
        try:
            sb = await NamespaceSandbox.open(self.pool)
        except Exception as e:
            return Outcome(False, b"", f"could not open a session: {e}")
        try:
            r = await sb.exec(["python3", "-c", code])
        finally:
            await sb.close()
        return _exec_outcome(r)


class TrialboxSystem(System):
    name = "trialbox"

    def __init__(self) -> None:
        self.pool: Any = None

    async def start(self) -> None:
        from trialbox.sandbox import CellPool, PoolConfig
        self.pool = await CellPool(PoolConfig()).start()
        await self.settle()

    async def runner(self) -> Runner:
        from trialbox.sandbox import NamespaceSandbox
        return _SessionRunner(await NamespaceSandbox.open(self.pool))

    async def settle(self, timeout: float = 2.0) -> None:
        """Until the pool holds its warm cells again, warms no more, and its cgroup
        janitor is idle."""
        if self.pool is not None and not self.pool.closed:
            await self.pool.settle(timeout)

    async def close(self) -> None:
        if self.pool is not None:
            await self.pool.close()


class TrialboxOneShotSystem(TrialboxSystem):
    """A new session per run. Uses `shared`'s pool when that one is running (both
    trialbox systems then draw cells from one pool), else starts a pool of its own."""

    name = "trialbox-1shot"

    def __init__(self, shared: System | None = None) -> None:
        super().__init__()
        self.shared = shared if isinstance(shared, TrialboxSystem) else None
        self.owns_pool = False

    async def start(self) -> None:
        pool = self.shared.pool if self.shared is not None else None
        if pool is not None and not pool.closed:
            self.pool = pool
            await self.settle()
        else:
            self.owns_pool = True
            await super().start()

    async def runner(self) -> Runner:
        return _OneShotRunner(self.pool)

    async def close(self) -> None:
        if self.owns_pool:
            await super().close()
        self.pool = None


# ------------------------------------------------------------------ measurements

async def _settle_all(systems: dict[str, System], gap_s: float) -> None:
    for s in systems.values():
        await s.settle()
    if gap_s > 0:
        await asyncio.sleep(gap_s)


async def measure_latency(systems: dict[str, System], runs: int,
                          warmup: int = LATENCY_WARMUP) -> dict[str, dict[str, Any]]:
    runners = {name: await s.runner() for name, s in systems.items()}
    start: dict[str, list[float]] = {n: [] for n in systems}
    e2e: dict[str, list[float]] = {n: [] for n in systems}
    failed = {n: 0 for n in systems}
    warmup_failed = {n: 0 for n in systems}
    errors: dict[str, list[str]] = {n: [] for n in systems}
    try:
        await _settle_all(systems, 0.01)
        for i in range(warmup + runs):
            for name, runner in runners.items():
                t0 = time.monotonic_ns()
                out = await runner.run(SNIPPET_START)
                t1 = time.monotonic_ns()
                await _settle_all(systems, 0.001)
                try:
                    first = int(out.stdout.strip()) if out.ok else -1
                except ValueError:
                    first = -1
                if not out.ok or not t0 <= first <= t1:
                    (warmup_failed if i < warmup else failed)[name] += 1
                    if len(errors[name]) < 3:
                        errors[name].append(out.error or f"bad output {out.stdout[:80]!r}")
                    continue
                if i < warmup:
                    continue
                start[name].append((first - t0) / 1e6)
                e2e[name].append((t1 - t0) / 1e6)
    finally:
        for runner in runners.values():
            await runner.close()
    result: dict[str, dict[str, Any]] = {}
    for name in systems:
        s, e = start[name], e2e[name]
        result[name] = {
            "p50_ms": _r(percentile(s, 50)), "p95_ms": _r(percentile(s, 95)),
            "min_ms": _r(min(s) if s else math.nan),
            "mean_ms": _r(sum(s) / len(s) if s else math.nan),
            "e2e_p50_ms": _r(percentile(e, 50)), "e2e_p95_ms": _r(percentile(e, 95)),
            "runs": len(s), "failed": failed[name], "warmup_failed": warmup_failed[name],
            "errors": errors[name],
        }
    return result


async def throughput_point(system: System, level: int, seconds: float) -> dict[str, Any]:
    runners = [await system.runner() for _ in range(level)]
    ok = failed = 0
    errors: list[str] = []

    async def one(runner: Runner) -> bool:
        nonlocal ok, failed
        out = await runner.run(SNIPPET_PRINT)
        if out.ok and out.stdout == b"1\n":
            ok += 1
            return True
        failed += 1
        if len(errors) < 3:
            errors.append(out.error or f"bad output {out.stdout[:80]!r}")
        return False

    try:
        for _ in range(THROUGHPUT_WARMUP):
            await asyncio.gather(*(one(r) for r in runners))
        warmup_failed, ok, failed = failed, 0, 0
        await system.settle()
        gc.collect()
        t_start = time.monotonic()
        deadline = t_start + seconds

        async def worker(runner: Runner) -> None:
            while time.monotonic() < deadline:
                await one(runner)

        await asyncio.gather(*(worker(r) for r in runners))
        elapsed = time.monotonic() - t_start
    finally:
        for r in runners:
            await r.close()
    return {"runs_per_s": ok / elapsed if elapsed > 0 else 0.0, "ok": ok,
            "failed": failed, "warmup_failed": warmup_failed, "elapsed_s": elapsed,
            "errors": errors}


async def measure_throughput(systems: dict[str, System], levels: list[int],
                             seconds: float, rounds: int = ROUNDS
                             ) -> dict[str, dict[str, dict[str, Any]]]:
    points: dict[str, dict[int, list[dict[str, Any]]]] = {
        n: {lv: [] for lv in levels} for n in systems}
    gap = min(0.25, seconds / 8)
    for rnd in range(rounds):
        for lv in levels:
            for name, s in systems.items():
                _log(f"throughput round {rnd + 1}/{rounds}, concurrency {lv}: {name}")
                points[name][lv].append(await throughput_point(s, lv, seconds))
                await _settle_all(systems, gap)
    result: dict[str, dict[str, dict[str, Any]]] = {}
    for name in systems:
        result[name] = {}
        for lv in levels:
            pts = points[name][lv]
            rates = [p["runs_per_s"] for p in pts]
            result[name][str(lv)] = {
                "runs_per_s": _r(median(rates), 2),
                "rounds": [_r(x, 2) for x in rates],
                "ok": sum(p["ok"] for p in pts),
                "failed": sum(p["failed"] for p in pts),
                "warmup_failed": sum(p["warmup_failed"] for p in pts),
                "errors": [e for p in pts for e in p["errors"]][:3],
            }
    return result


# ------------------------------------------------------------------ report

def _key(name: str) -> str:
    """'trialbox-1shot' -> 'trialbox_1shot', as the system appears in ratio keys."""
    return name.replace("-", "_")


def render_table(res: dict[str, Any]) -> str:
    m, p = res["machine"], res["params"]
    lines = [
        (f"trialbox bench sandbox — {m['nproc']} CPUs ({m['cpu_model'] or 'unknown'}), "
         f"{m['memory_gib']} GiB, Linux {m['kernel']}"),
        (f"Python {m['python']} (bench), {m.get('runtime_python', '?')} (sandboxed "
         f"runtime), {m.get('bwrap_version', 'bwrap ?')}, {m['date']}"),
        (f"load average (1 min) {_fmt(m['loadavg_start'][0])} at start, "
         f"{_fmt(m.get('loadavg_end', [math.nan])[0])} at end (includes this benchmark)"),
        "",
        (f"A. Start-to-first-instruction latency, ms — {p['runs']} sequential runs per "
         f"system after {p['latency_warmup']} warm-up, round-robin"),
        f"   snippet: {SNIPPET_START!r}",
        (f"   {'system':<18}{'p50':>9}{'p95':>9}{'min':>9}{'e2e p50':>10}{'e2e p95':>10}"
         f"{'runs':>7}{'failed':>8}"),
    ]
    lat = res["latency"]
    for name in SYSTEMS:
        if name not in lat:
            lines.append(f"   {name:<18}  (did not run)")
            continue
        r = lat[name]
        lines.append(f"   {name:<18}{_fmt(r['p50_ms']):>9}{_fmt(r['p95_ms']):>9}"
                     f"{_fmt(r['min_ms']):>9}{_fmt(r['e2e_p50_ms']):>10}"
                     f"{_fmt(r['e2e_p95_ms']):>10}{r['runs']:>7}{r['failed']:>8}")
    ra, g = res["ratios"], res["goals"]
    lines.append("   speed-up, the baseline's latency / this system's (> 1: this one starts "
                 "faster):")
    lines.append(f"   {'':<22}" + "".join(f"{'vs ' + SHORT[o]:>15}" for o in BASELINES))
    for name in ("trialbox", "trialbox-1shot"):
        k = _key(name)
        for metric, label in (("latency_p50", "p50"), ("latency_p95", "p95"),
                              ("e2e_p50", "e2e p50")):
            lines.append(f"     {SHORT[name] + ' ' + label:<20}" + "".join(
                f"{_fmt_x(ra[f'{metric}_{_key(o)}_over_{k}']):>15}" for o in BASELINES))
    gl = g["latency_p50"]
    one_p50 = lat.get("trialbox-1shot", {}).get("p50_ms")
    lines.append(f"   goal: trialbox p50 <= {gl['target_ms']:g} ms — {_met(gl['met'])} "
                 f"({_fmt(gl['value_ms'])} ms; trialbox-1shot, not a goal: "
                 f"{_fmt(one_p50)} ms)")
    lines += [
        "",
        (f"B. Throughput, runs/s of {SNIPPET_PRINT!r} — {p['seconds']:g} s per point, "
         f"median of {p['rounds']} rounds (each round's figures in the JSON)"),
        (f"   {'conc':<6}" + "".join(f"{SHORT[n]:>11}" for n in SYSTEMS)
         + f"{'failed ' + '/'.join(INITIALS[n] for n in SYSTEMS):>20}"),
    ]
    thr = res["throughput"]
    gt = g["throughput_vs_plain"]
    for lv in p["concurrency"]:
        key = str(lv)

        def rate(name: str, key: str = key) -> str:
            return _fmt(thr[name][key]["runs_per_s"], 1) if name in thr else "-"

        fails = "/".join(str(thr[n][key]["failed"]) if n in thr else "-" for n in SYSTEMS)
        lines.append(f"   {lv:<6}" + "".join(f"{rate(n):>11}" for n in SYSTEMS)
                     + f"{fails:>20}")
    lines.append("   speed-up, this system's runs/s / the baseline's (> 1: this one is "
                 "faster):")
    lines.append(f"   {'conc':<6}" + "".join(f"{'tb/' + SHORT[o]:>15}" for o in BASELINES)
                 + f"{'1shot/plain':>13}{'goal >=' + format(GOAL_THROUGHPUT_X, 'g') + 'x':>11}")
    for lv in p["concurrency"]:
        key = str(lv)
        met = gt["by_level"].get(key)
        lines.append(f"   {lv:<6}" + "".join(
            f"{_fmt_x(ra[f'throughput_trialbox_over_{_key(o)}'].get(key)):>15}"
            for o in BASELINES)
            + f"{_fmt_x(ra['throughput_trialbox_1shot_over_plain'].get(key)):>13}"
            + f"{_met(met) if met is not None else '-':>11}")
    one = [x for x in ra["throughput_trialbox_1shot_over_plain"].values() if x is not None]
    one_text = ("-" if not one else _fmt_x(one[0]) if len(one) == 1 else
                f"{_fmt_x(min(one))} to {_fmt_x(max(one))}")
    lines.append(f"   goal: trialbox >= {GOAL_THROUGHPUT_X:g}x plain at every level — "
                 f"{_met(gt['met'])} (trialbox-1shot, not a goal: {one_text} plain)")

    def span(values: dict[str, float | None]) -> str:
        xs = [x for x in values.values() if x is not None]
        return "-" if not xs else (f"{_fmt_x(min(xs))} to {_fmt_x(max(xs))}"
                                   if len(xs) > 1 else _fmt_x(xs[0]))
    # "plain" starts a cold interpreter per run; the fair baselines start Python warm
    # too, so the headline says both (a ratio against a cold start alone flatters)
    fork = span(ra["throughput_trialbox_over_forkserver"])
    bfork = span(ra["throughput_trialbox_over_bwrap_forkserver"])
    lines.append(f"   fair baselines (Python warm too): trialbox {fork} forkserver "
                 "(no isolation),")
    lines.append(f"   {bfork} bwrap-forkserver (bwrap's isolation)")
    lines += ["", "Isolation compared:"]
    for n in SYSTEMS:
        lines += _wrap(ISOLATION[n], f"   {n:<17} ", " " * 21)
    lines += notes_and_problems(res)
    return "\n".join(lines)


def build_results(params: dict[str, Any], machine: dict[str, Any],
                  latency: dict[str, Any], throughput: dict[str, Any],
                  problems: list[str]) -> dict[str, Any]:
    def p50(name: str, key: str = "p50_ms") -> float:
        v = latency.get(name, {}).get(key)
        return v if v is not None else math.nan

    def rate(name: str, lv: str) -> float:
        v = throughput.get(name, {}).get(lv, {}).get("runs_per_s")
        return v if v is not None else math.nan

    levels = [str(lv) for lv in params["concurrency"]]
    ratios: dict[str, Any] = {}
    for tb in ("trialbox", "trialbox-1shot"):
        k = _key(tb)
        for other in BASELINES:
            o = _key(other)
            ratios[f"latency_p50_{o}_over_{k}"] = _r(_ratio(p50(other), p50(tb)), 2)
            ratios[f"latency_p95_{o}_over_{k}"] = _r(
                _ratio(p50(other, "p95_ms"), p50(tb, "p95_ms")), 2)
            ratios[f"e2e_p50_{o}_over_{k}"] = _r(
                _ratio(p50(other, "e2e_p50_ms"), p50(tb, "e2e_p50_ms")), 2)
            ratios[f"throughput_{k}_over_{o}"] = {
                lv: _r(_ratio(rate(tb, lv), rate(other, lv)), 2) for lv in levels}
    tb_plain: dict[str, float | None] = ratios["throughput_trialbox_over_plain"]
    tb_p50 = p50("trialbox")
    by_level = {lv: (x >= GOAL_THROUGHPUT_X if x is not None else None)
                for lv, x in tb_plain.items()}
    # met: true/false, or null when the figure could not be measured. The goals are
    # evaluated on the trialbox (session) system only; trialbox-1shot is for reference.
    goals = {
        "latency_p50": {"system": "trialbox", "target_ms": GOAL_P50_MS,
                        "value_ms": _r(tb_p50),
                        "met": tb_p50 <= GOAL_P50_MS if math.isfinite(tb_p50) else None},
        "throughput_vs_plain": {
            "system": "trialbox", "target_ratio": GOAL_THROUGHPUT_X, "by_level": by_level,
            "met": None if None in by_level.values() else all(by_level.values())},
    }
    failures = sum(r.get("failed", 0) + r.get("warmup_failed", 0)
                   for r in latency.values()) + sum(
        pt.get("failed", 0) + pt.get("warmup_failed", 0)
        for sysd in throughput.values() for pt in sysd.values())
    pool_note = ("trialbox and trialbox-1shot draw cells from one CellPool"
                 if machine.get("pool_shared") else
                 "trialbox and trialbox-1shot each have a CellPool of their own")
    notes = [
        ("who pays what: a trialbox cell (pid/mount/net/ipc/uts namespaces, the read-only "
         "root's mounts, a cgroup with every limit) serves one session. trialbox (one "
         "session per worker) pays for its cell and the session's tmpfs once per session, "
         "off the clock here, and per run only forks a candidate process (its own user "
         "namespace, seccomp, rlimits) and reads the cgroup's accounting. trialbox-1shot "
         "pays per run the session's tmpfs, a cell from the pool (usually the cell of a "
         "session that just closed, reset: its processes killed, its mounts detached, new "
         "IPC and network namespaces; a new cell when none is ready), and the reset at "
         "close; the pool's refill and any cgroup removal (on the pool's janitor thread) "
         "run in the background, inside its throughput figures."),
        ("bwrap sets up and tears down all its namespaces and mounts every run (trialbox-"
         "1shot renews the IPC and network ones and the workspace), but creates no cgroup "
         "(no memory, pids or CPU limits or accounting) and sets no rlimits: its "
         "isolation does less work per run than trialbox-1shot's. Both trialbox "
         "systems start Python warm (forked from the pool's zygote); plain and bwrap "
         "start a cold interpreter every run."),
        ("latency = monotonic_ns printed by the program's first statement minus "
         "monotonic_ns just before the call; e2e = call to result (output collected, "
         "process reaped; trialbox: cgroup accounting read; trialbox-1shot: also the "
         "session opened and closed)."),
        ("between latency calls the harness waits, off the clock, for the trialbox pool "
         "to refill its warm cells and remove the cgroups of closed cells, so a "
         "trialbox-1shot call finds a warm cell waiting; that refill is paid inside the "
         "throughput figures."),
        (f"{pool_note}, with the default PoolConfig (warm=4, max_warm=32) and default "
         "Limits; trialbox: one session per throughput worker, opened before the clock "
         "starts; trialbox-1shot: one session per run, opened and closed on the clock."),
        (f"plain and bwrap get the environment {SMALL_ENV} and are reaped through "
         f"asyncio's {machine.get('child_watcher', '?')}."),
        ("forkserver and bwrap-forkserver start Python warm, as trialbox does: a "
         "/usr/bin/python3 fork server per session (per worker, started off the clock, "
         "bwrap-forkserver's inside one bwrap sandbox) pre-forks a child that waits for "
         "the go (the program and its stdout/stderr descriptors over a socketpair), runs "
         "it with exec() and exits; the server reaps it, sends its exit status and "
         "pre-forks the next. trialbox vs forkserver is the cost of trialbox's isolation "
         "itself; vs bwrap-forkserver, of its isolation beyond bwrap's (a user namespace, "
         "seccomp and rlimits per run, cgroup limits and accounting)."),
        ("sessions and CPU share: bwrap (per run), bwrap-forkserver and forkserver (per "
         "server) each start a session of their own; with the scheduler's autogroups on "
         f"(here: {machine.get('sched_autogroup', '?')}) each new session is a CPU-share "
         "group of its own, while trialbox and plain share the bench's. On a loaded "
         "machine that favours the baselines, never trialbox."),
    ]
    return {
        "benchmark": "sandbox", "schema": 1, "params": params, "machine": machine,
        "systems": {n: {"isolation": ISOLATION[n]} for n in SYSTEMS},
        "latency": latency, "throughput": throughput, "ratios": ratios, "goals": goals,
        "failures": failures, "problems": problems, "notes": notes,
        "ok": not problems and failures == 0,
    }


# ------------------------------------------------------------------ main

@contextlib.contextmanager
def _pidfd_child_watcher() -> Any:
    """Python 3.11's asyncio reaps children with a thread each (ThreadedChildWatcher);
    3.12+ uses a pidfd. Use the pidfd watcher where it exists so the subprocess baselines
    are not charged for a thread per run. Yields the watcher's name."""
    name = "default child watcher"
    if sys.version_info >= (3, 12) or not hasattr(asyncio, "PidfdChildWatcher"):
        yield "pidfd child watcher" if sys.version_info >= (3, 12) else name
        return
    try:
        os.close(os.pidfd_open(os.getpid()))
    except (AttributeError, OSError):
        yield "ThreadedChildWatcher"
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        asyncio.set_child_watcher(asyncio.PidfdChildWatcher())
    try:
        yield "PidfdChildWatcher"
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            asyncio.set_child_watcher(None)  # type: ignore[arg-type]  # default comes back


async def _run(params: dict[str, Any], machine: dict[str, Any]) -> dict[str, Any]:
    from trialbox.bench.forkserver import BwrapForkServerSystem, ForkServerSystem

    problems: list[str] = []
    ctor: dict[str, Callable[[], System]] = {
        "trialbox": TrialboxSystem,
        "trialbox-1shot": lambda: TrialboxOneShotSystem(systems.get("trialbox")),
        "plain": PlainSystem, "bwrap": BwrapSystem, "forkserver": ForkServerSystem,
        "bwrap-forkserver": BwrapForkServerSystem}
    systems: dict[str, System] = {}
    try:
        for name in SYSTEMS:
            s = ctor[name]()
            try:
                await s.start()
                probe = await s.runner()
                try:
                    out = await probe.run(SNIPPET_PRINT)
                finally:
                    await probe.close()
                if not out.ok or out.stdout != b"1\n":
                    raise RuntimeError(out.error or f"printed {out.stdout[:80]!r}")
            except Exception as e:
                problems.append(f"{name} could not run: {e}")
                _log(f"{name} could not run, left out: {e}")
                await s.close()
                continue
            systems[name] = s
        tb_systems = [s for s in systems.values() if isinstance(s, TrialboxSystem)]
        if tb_systems:
            pool = tb_systems[0].pool
            machine["runtime_python"] = pool.runtime.version
            machine["cgroup_version"] = pool.cgroups.version
            machine["pool_shared"] = len(tb_systems) == 2 and \
                tb_systems[0].pool is tb_systems[1].pool
        if "bwrap" in systems:
            machine["bwrap_version"] = systems["bwrap"].version  # type: ignore[attr-defined]
        _log(f"latency: {params['runs']} runs per system ({', '.join(systems)})")
        latency = await measure_latency(systems, params["runs"])
        throughput = await measure_throughput(systems, params["concurrency"],
                                              params["seconds"])
    finally:
        for s in systems.values():
            await s.close()
    machine["loadavg_end"] = list(os.getloadavg())
    for name, r in latency.items():
        if r["failed"] or r["warmup_failed"]:
            problems.append(f"{name}: {r['failed']} latency runs (+{r['warmup_failed']} "
                            f"warm-up) failed: {r['errors']}")
    for name, pts in throughput.items():
        for lv, pt in pts.items():
            if pt["failed"] or pt["warmup_failed"]:
                problems.append(f"{name}: {pt['failed']} throughput runs (+"
                                f"{pt['warmup_failed']} warm-up) failed at concurrency "
                                f"{lv}: {pt['errors']}")
    return build_results(params, machine, latency, throughput, problems)


def main(args: argparse.Namespace) -> int:
    if getattr(args, "tiers", None):
        from trialbox.bench.tiers import main as tiers_main
        return tiers_main(args)
    runs = int(args.runs) if args.runs is not None else 200
    seconds = float(args.seconds) if args.seconds is not None else 4.0
    if runs < 1:
        raise UsageError(f"--runs must be at least 1, got {runs}")
    if not (math.isfinite(seconds) and seconds > 0):
        raise UsageError(f"--seconds must be a positive number, got {args.seconds}")
    params = {"runs": runs, "seconds": seconds, "concurrency": parse_levels(args.concurrency),
              "rounds": ROUNDS, "latency_warmup": LATENCY_WARMUP,
              "throughput_warmup_per_worker": THROUGHPUT_WARMUP}
    machine = machine_info()
    t0 = time.monotonic()
    with _pidfd_child_watcher() as watcher:
        machine["child_watcher"] = watcher
        res = asyncio.run(_run(params, machine))
    res["duration_s"] = round(time.monotonic() - t0, 1)
    emit(res, args, render_table(res))
    return 0 if res["ok"] else 1
