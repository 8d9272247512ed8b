"""Judging repository tasks: a file tree and trusted pytest tests.

Two tiers (`RepoJudgeConfig.tier`). On the *trusted* tier (the default,
`_attempt_trusted`) the tests and the runner below run in a sandbox no candidate code
enters, and the candidate's tree — without the hidden tests — in a second sandbox whose
stub (repo_stub.py) serves its modules to the tests' process (repo_proxy.py) as plain
data or references: the report is evidence the candidate cannot reach. On the
*in-process* tier (`_attempt`, opt-in) the runner imports the candidate's code itself,
as drawn here:

    judge (this process)                          grading sandbox (fresh per attempt)
      candidate_tree(): the answer (a diff or       /workspace/repo/      the tree, with the
        files) on the starting tree, stripped of       trusted test files written over it
        test config, .pth, sitecustomize,           /workspace/_judge/    our runner + ini
        bytecode, shadowing modules (flagged)       python3 -c "import _trialbox_pytest…"
      static scan of the lines it wrote               (cwd /workspace/_judge: outside it)
      job ──────── socketpair, fd 3 ─────────────►  pytest with our plugin, our ini
      records ◄──── nonce + sequence, start/test/   (-c ours, --rootdir, --confcutdir,
                    tamper/end ──────────────────   -p no:cacheprovider, -o addopts=,
                                                    --noconftest when the task has none,
                                                    plugin autoload off)

The grade comes only from the plugin's records: each carries the nonce (sent over the
socket, never in argv, environment or files) and the next sequence number; results count
only when the `end` record came after pytest.main returned *and* the run ended normally.
pytest's exit code and output are never read as evidence. A test passes when its setup,
call and teardown all passed (skips and xfails are not passes); a test function the
trusted files define that never reports fails. Hidden test files are written only into
this grading sandbox, and their failures are reported without details.

What the trusted tier guarantees and cannot run, and what candidate code inside the
pytest process can still do on the in-process tier, are in docs/judge.md. An attempt
that would be excluded (INFRA; a runner that never starts: ERROR) is checked against a
control first (retry.py): the reference solution's tree, or the starting tree. If the
control proves the machinery works, the failure was the candidate's (FAILED, flag
`self_inflicted_infra`, no retry); only if the control fails too is it retried and
then excluded (reward None).
"""

from __future__ import annotations

import ast
import asyncio
import hashlib
import json
import os
import posixpath
import secrets
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import cache, lru_cache
from typing import Any

from trialbox.errors import UsageError
from trialbox.judge.anticheat import Flag, canary_check, noted, static_scan
from trialbox.judge.repo_tree import CandidateTree, candidate_tree, expected_tests
from trialbox.store.patches import TreeError
from trialbox.judge.repo_snapshot import WorkspaceUnwritable, open_workspace, workspace_key
from trialbox.judge.retry import Control, control_of, with_infra_retries
from trialbox.sandbox.base import Sandbox, SandboxProvider
from trialbox.telemetry import traced_grade
from trialbox.types import ExecResult, ExecStatus, Grade, Limits, Outcome, Task, TaskKind, \
    TestResult

HERE = os.path.dirname(os.path.abspath(__file__))
WORKSPACE = "/workspace"
REPO_DIR = "repo"
JUDGE_DIR = "_judge"
RUNNER = "_trialbox_pytest.py"
RUNNER_ENV = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONDONTWRITEBYTECODE": "1"}
MAX_CHANNEL = 32 << 20
TIERS = ("trusted", "in-process")
STUB = "_trialbox_repo_stub.py"
PROXY = "_trialbox_repo_proxy.py"
CODEC = "_trialbox_codec.py"
_NOT_HERE = (b'raise ImportError("the candidate\'s code runs in its own sandbox on the '
             b'trusted tier, never in the tests\' (docs/judge.md, repository tasks)")\n')
"""What the tests' sandbox holds for each of the candidate's Python files."""
_TRUSTED_EXTRA_S = 10.0
"""The trusted run's wall and CPU limits exceed the candidate's by this much: a candidate
that hangs is stopped by its own limit first, and the tests after it still report."""
_MSG = 1000

Answer = str | Mapping[str, bytes | str | None]
"""A unified diff against the starting tree, or an overlay {path: content, None: delete}."""


@dataclass(frozen=True)
class RepoJudgeConfig:
    """Limits of one repository judgement."""

    limits: Limits = field(default_factory=lambda: Limits(
        wall_s=60, cpu_s=60, memory_mb=1024, disk_mb=64, pids=64))
    """The grading sandbox: one pytest run over the candidate's tree and the tests."""
    retries: int = 2
    """Extra attempts after an infrastructure failure."""
    tier: str = "trusted"
    """"trusted": the tests run in a sandbox of their own that no candidate code enters;
    the candidate's modules are served from its sandbox as plain data or references
    (docs/judge.md, what this guarantees and what tests it cannot run). "in-process":
    pytest imports the candidate's code in its own process — any test runs, but the
    candidate's code can forge the report (the residual risk in docs/judge.md)."""
    snapshots: bool = True
    """Start each attempt's sessions as forks of a snapshot of the task's starting tree,
    writing only what the answer changed (repo_snapshot.py), where the tier has
    snapshots (the namespace tier); other tiers always copy. False: write every file
    into every session on any tier (the copying path, for comparison)."""

    def __post_init__(self) -> None:
        if self.tier not in TIERS:
            raise UsageError(f"RepoJudgeConfig.tier must be one of {', '.join(TIERS)}, got "
                             f"{self.tier!r}")
        if not isinstance(self.limits, Limits):
            raise UsageError(f"RepoJudgeConfig.limits must be a trialbox.types.Limits, got "
                             f"{type(self.limits).__name__}")
        if self.limits.network:
            raise UsageError("RepoJudgeConfig.limits.network must be False: tests run "
                             "offline")
        if isinstance(self.retries, bool) or not isinstance(self.retries, int) \
                or self.retries < 0:
            raise UsageError(f"RepoJudgeConfig.retries must be an int >= 0, got "
                             f"{self.retries!r}")
        if not isinstance(self.snapshots, bool):
            raise UsageError(f"RepoJudgeConfig.snapshots must be a bool, got "
                             f"{self.snapshots!r}")


def graded_modules(task: Task) -> list[str]:
    """The trusted test files pytest is given (`test_*.py`, `*_test.py`); other files in
    the test sets (helpers, data, conftest.py) are only put in place."""
    names = [p for p, _ in (*task.test_files, *task.hidden_test_files)]
    return sorted(p for p in names if p.endswith(".py") and (
        posixpath.basename(p).startswith("test_") or p.endswith("_test.py")))


@traced_grade  # span judge.grade, outcomes, flags, grading time (telemetry)
async def judge_repo(task: Task, answer: Answer, pool: SandboxProvider,
                     config: RepoJudgeConfig | None = None) -> Grade:
    """Grade the candidate's `answer` (a unified diff, or a files overlay) against the
    task's trusted tests, hidden first in the results, then visible."""
    config = config or RepoJudgeConfig()
    if task.kind is not TaskKind.REPO:
        raise UsageError(f"{task.task_id}: judge_repo needs a REPO task, got "
                         f"kind={task.kind.value!r}")
    if not graded_modules(task):
        raise UsageError(f"{task.task_id}: the task has no test module (test_*.py or "
                         "*_test.py) among its test files")
    t0 = time.monotonic()
    try:
        if isinstance(answer, str):
            tree = candidate_tree(task, patch=answer)
        elif isinstance(answer, Mapping):
            tree = candidate_tree(task, files=answer)
        else:
            raise UsageError(f"{task.task_id}: the answer must be a unified diff (str) or "
                             f"a mapping of files, got {type(answer).__name__}")
    except TreeError as e:  # the candidate's answer is unusable: its failure
        return Grade(task.task_id, Outcome.FAILED, tests=_not_run(task, "not run: the "
                     "answer could not be applied"),
                     message=f"the answer could not be applied: {e}"[:4000],
                     wall_ms=round((time.monotonic() - t0) * 1e3, 3))
    code_flags = scan_tree(tree)
    grade = await _judged(task, tree, pool, config)
    if config.tier == "in-process" and grade.passed and code_flags:
        trusted = await _judged(task, tree, pool, replace(config, tier="trusted"))
        grade = _cross_checked(grade, trusted, code_flags)
    return canary_check(noted(grade, [*tree.flags, *code_flags]), task)


async def _judged(task: Task, tree: CandidateTree, pool: SandboxProvider,
                  config: RepoJudgeConfig) -> Grade:
    """One judgement of `tree` on `config.tier`, an exclusion proven by a control."""
    attempt = _attempt_trusted if config.tier == "trusted" else _attempt
    control_tree, name = _control_tree(task)
    control = None
    if control_tree.files != tree.files:
        async def control() -> Control:
            return control_of(name, await attempt(task, control_tree, pool, config),
                              reference=name == "the reference solution")
    return await with_infra_retries(lambda: attempt(task, tree, pool, config),
                                    config.retries, task.task_id, control)


def _cross_checked(grade: Grade, trusted: Grade, flags: list[Flag]) -> Grade:
    """An in-process pass of code the scan flagged, against the trusted tier's verdict
    of the same tree. In-process the candidate's code shares pytest's process, so a
    flagged act could have reached the report; on the trusted tier it cannot. The same
    verdict: the act changed nothing, the pass stands (the flags are notable). A
    different one: the act reached the evidence — CHEAT, `verdict-differs`, with the
    trusted tier's per-test results. A trusted run that cannot decide (excluded: its
    machinery or the task's tests failed on that tier, its control too) leaves the
    in-process verdict, and says so."""
    if trusted.passed:
        return grade
    if trusted.outcome in (Outcome.INFRA, Outcome.ERROR):
        return replace(grade, message=(
            f"not confirmed on the trusted tier ({trusted.outcome.value}: "
            f"{trusted.message[:500]})")[:4000])
    detail = "; ".join(f"{f.detector}: {f.detail}" for f in flags[:5])
    return replace(trusted, outcome=Outcome.CHEAT,
                   flags=tuple(sorted({*trusted.flags, "verdict-differs"})),
                   attempts=grade.attempts + trusted.attempts,
                   message=(f"passed in-process, where its flagged code ({detail}) shares "
                            f"pytest's process, but {trusted.outcome.value} on the trusted "
                            f"tier, where it cannot reach the report ({trusted.message}): "
                            f"the act changed the verdict")[:4000])


def _control_tree(task: Task) -> tuple[CandidateTree, str]:
    """The tree a control grades for `task` (retry.py) and its name: the reference
    solution's when it applies, else the starting tree (no change)."""
    if task.canonical_solution:
        try:
            return candidate_tree(task, patch=task.canonical_solution), \
                "the reference solution"
        except TreeError:
            pass
    return candidate_tree(task, files={}), "the starting tree (no change)"


def scan_tree(tree: CandidateTree) -> list[Flag]:
    """The static scan over the Python lines the candidate wrote, plus references to the
    test runner's internals (`_pytest`, `pluggy`, hook functions)."""
    flags: list[Flag] = []
    for path, lines in sorted(tree.changed.items()):
        source = tree.files[path].decode("utf-8", "replace")
        for f in static_scan(source, lines=lines) + _runner_refs(source, lines):
            flags.append(Flag(f.detector, f"{path} {f.detail}"))
    return flags


def _runner_refs(source: str, lines: frozenset[int]) -> tuple[Flag, ...]:
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return ()
    found = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if line not in lines:
            continue
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and node.value.startswith(("_pytest", "pluggy")):
            names = [node.value]
        if any(n.split(".")[0] in ("_pytest", "pluggy") for n in names):
            found.append(Flag("pytest-internals", f"line {line}: {names[0]}: the test "
                              "runner's internals"))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                node.name.startswith("pytest_"):
            found.append(Flag("pytest-internals", f"line {line}: def {node.name}: a "
                              "pytest hook in the candidate's code"))
    return tuple(found)


# --------------------------------------------------------------------------- a run

@cache
def _program(name: str) -> bytes:
    with open(os.path.join(HERE, name), "rb") as f:
        return f.read()


def _runner_program() -> bytes:
    return _program("repo_plugin.py")


def _ini() -> bytes:
    """Our pytest configuration: the only one pytest reads (`-c`)."""
    return (f"[pytest]\npythonpath = {WORKSPACE}/{REPO_DIR}\n"
            "console_output_style = classic\n").encode()


# ------------------------------------------------------------------ the workspaces
#
# What each session of an attempt holds, as one mapping (workspace path -> bytes): the
# copying path writes it all, the snapshot path (repo_snapshot.py) forks the same
# mapping built from the task's starting tree and writes the difference.

def _trusted_files(task: Task) -> dict[str, bytes]:
    return {**dict(task.test_files), **dict(task.hidden_test_files),
            **{p: d for p, d in task.files if posixpath.basename(p) == "conftest.py"}}


def _tests_ws(files: Mapping[str, bytes], trusted: Mapping[str, bytes]) -> dict[str, bytes]:
    """The tests' sandbox (trusted tier): our runner, proxy and ini, and the tree with
    the candidate's Python files as stubs — their modules are remote, and nothing there
    (a test's subprocess, runpy) can run the candidate's code beside the tests."""
    ws = {f"{JUDGE_DIR}/{name}": _program(source) for name, source in (
        (RUNNER, "repo_plugin.py"), (PROXY, "repo_proxy.py"), (CODEC, "codec.py"))}
    ws[f"{JUDGE_DIR}/pytest.ini"] = _ini()
    for path, data in files.items():
        code = path.endswith(".py") and path not in trusted
        ws[f"{REPO_DIR}/{path}"] = _NOT_HERE if code else data
    return ws


def _candidate_ws(files: Mapping[str, bytes], hidden: set[str]) -> dict[str, bytes]:
    """The candidate's sandbox (trusted tier): the stub serving its modules, and its
    tree without the hidden tests (they never enter this sandbox)."""
    ws = {f"{JUDGE_DIR}/{name}": _program(source)
          for name, source in ((STUB, "repo_stub.py"), (CODEC, "codec.py"))}
    ws.update((f"{REPO_DIR}/{p}", d) for p, d in files.items() if p not in hidden)
    return ws


def _inproc_ws(files: Mapping[str, bytes]) -> dict[str, bytes]:
    """The one sandbox of the in-process tier: our runner and ini, and the tree."""
    ws = {f"{JUDGE_DIR}/{RUNNER}": _runner_program(), f"{JUDGE_DIR}/pytest.ini": _ini()}
    ws.update((f"{REPO_DIR}/{p}", d) for p, d in files.items())
    return ws


@lru_cache(maxsize=32)  # bounded: a training run sees many tasks
def _starting_ws(task: Task, side: str) -> tuple[dict[str, bytes], str] | None:
    """`side`'s workspace for the task's starting tree (no answer applied) and its key:
    what the snapshot path forks. None when the starting tree cannot be built (then
    every attempt copies, and grades as it would)."""
    try:
        files = candidate_tree(task, files={}).files
    except (TreeError, UsageError):
        return None
    if side == "tests":
        ws = _tests_ws(files, _trusted_files(task))
    elif side == "candidate":
        ws = _candidate_ws(files, {p for p, _ in task.hidden_test_files})
    else:
        ws = _inproc_ws(files)
    return ws, workspace_key(ws)


async def _open(task: Task, side: str, ws: dict[str, bytes], pool: SandboxProvider,
                limits: Limits, config: RepoJudgeConfig) -> Sandbox:
    """A session holding `ws`: a fork of the task's starting workspace for `side` with
    the difference written, or (no snapshots) every file written."""
    start = _starting_ws(task, side) if config.snapshots else None
    if start is None:
        return await open_workspace(pool, limits, ws, snapshots=False)
    return await open_workspace(pool, limits, ws, base=start[0], key=start[1])


def _unwritable(task: Task, e: WorkspaceUnwritable, t0: float) -> Grade:
    return Grade(task.task_id, Outcome.FAILED, tests=_not_run(task, "not run"),
                 message=f"the tree could not be written: {e}"[:4000],
                 wall_ms=round((time.monotonic() - t0) * 1e3, 3))


# --------------------------------------------------------------------------- attempts

async def _attempt(task: Task, tree: CandidateTree, pool: SandboxProvider,
                   config: RepoJudgeConfig) -> Grade:
    t0 = time.monotonic()
    nonce = secrets.token_hex(16)
    repo = f"{WORKSPACE}/{REPO_DIR}"
    trusted = _trusted_files(task)
    modules = graded_modules(task)
    job = {"nonce": nonce, "repo": repo,
           "trusted": {f"{repo}/{p}": hashlib.sha256(d).hexdigest()
                       for p, d in trusted.items() if p.endswith(".py")},
           "tests": [f"{repo}/{p}" for p in modules]}
    try:
        sb = await _open(task, "in-process", _inproc_ws(tree.files), pool, config.limits,
                         config)
    except WorkspaceUnwritable as e:  # e.g. a tree larger than the workspace: its doing
        return _unwritable(task, e, t0)
    ours, theirs = socket.socketpair()
    try:
        ours.setblocking(False)
        loop = asyncio.get_running_loop()
        await loop.sock_sendall(ours, json.dumps(job).encode() + b"\n")
        reader = asyncio.ensure_future(_read_all(loop, ours))
        try:
            # Imported under its own name, not run as __main__: code that wants to
            # reach it must name it ("_trialbox..." is flagged by the scan) or walk
            # the heap or frames (flagged too). cwd is the judge's directory, outside
            # the tree.
            r = await sb.exec(["python3", "-c", "import _trialbox_pytest as m; m.main()"],
                              env=RUNNER_ENV, cwd=f"{WORKSPACE}/{JUDGE_DIR}",
                              pass_fds={3: theirs.detach()})
        finally:
            data = await reader
    finally:
        ours.close()
        theirs.close()
        await sb.close()
    return _grade(task, modules, nonce, data, r, (time.monotonic() - t0) * 1e3)


async def _attempt_trusted(task: Task, tree: CandidateTree, pool: SandboxProvider,
                           config: RepoJudgeConfig) -> Grade:
    """The trusted tier: pytest and the tests in a sandbox of their own, which no
    candidate code enters; the candidate's tree, without the hidden tests, in another,
    serving its modules (repo_stub.py) to the tests' process (repo_proxy.py)."""
    t0 = time.monotonic()
    nonce = secrets.token_hex(16)
    repo = f"{WORKSPACE}/{REPO_DIR}"
    hidden = {p for p, _ in task.hidden_test_files}
    trusted = _trusted_files(task)
    modules = graded_modules(task)
    tops = sorted({p.split("/")[0].removesuffix(".py") for p in tree.files
                   if p.endswith(".py")})
    job = {"nonce": nonce, "repo": repo, "proxy": True, "repo_tops": tops,
           "trusted": {f"{repo}/{p}": hashlib.sha256(d).hexdigest()
                       for p, d in trusted.items() if p.endswith(".py")},
           "tests": [f"{repo}/{p}" for p in modules]}
    lim = config.limits
    tests_limits = replace(lim, wall_s=lim.wall_s + _TRUSTED_EXTRA_S,
                           cpu_s=lim.cpu_s + _TRUSTED_EXTRA_S)
    try:
        cand = await _open(task, "candidate", _candidate_ws(tree.files, hidden), pool, lim,
                           config)
        try:
            sb = await _open(task, "tests", _tests_ws(tree.files, trusted), pool,
                             tests_limits, config)
        except BaseException:
            await cand.close()
            raise
    except WorkspaceUnwritable as e:  # e.g. a tree larger than the workspace: its doing
        return _unwritable(task, e, t0)
    ours, theirs = socket.socketpair()
    mine, cands = socket.socketpair()
    try:
        ours.setblocking(False)
        loop = asyncio.get_running_loop()
        await loop.sock_sendall(ours, json.dumps(job).encode() + b"\n")
        started = asyncio.Event()
        reader = asyncio.ensure_future(_read_all(loop, ours, started))
        tests_run = asyncio.ensure_future(sb.exec(
            ["python3", "-c", "import _trialbox_pytest as m; m.main()"], env=RUNNER_ENV,
            cwd=f"{WORKSPACE}/{JUDGE_DIR}", pass_fds={3: theirs.detach(), 4: mine.detach()}))
        cand_run: asyncio.Future[ExecResult] | None = None
        try:
            # The candidate's clock starts when the tests' runner is up (its `start`
            # record, pytest imported), not while it waits for a slow start.
            waiter = asyncio.ensure_future(started.wait())
            await asyncio.wait([tests_run, waiter], return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            if started.is_set() and not tests_run.done():
                cand_run = asyncio.ensure_future(cand.exec(
                    ["python3", "-c", f"import sys; sys.path.insert(0, "
                     f"'{WORKSPACE}/{JUDGE_DIR}'); import _trialbox_repo_stub as m; m.main()"],
                    env=RUNNER_ENV, cwd=repo, pass_fds={3: cands.detach()}, last=True))
            r = await tests_run
        finally:
            # The tests are done (or gone): nothing the candidate does now can matter.
            if not tests_run.done():
                await sb.stop()
                await asyncio.wait([tests_run])
            if cand_run is not None:
                await cand.stop()
                rc = await cand_run
            else:
                rc = ExecResult(ExecStatus.SIGNAL, message="not started: the tests' run "
                                "ended before its runner started")
            data = await reader
    finally:
        for s in (ours, theirs, mine, cands):
            s.close()
        await cand.close()
        await sb.close()
    return _grade(task, modules, nonce, data, r, (time.monotonic() - t0) * 1e3, rc)


async def _read_all(loop: asyncio.AbstractEventLoop, sock: socket.socket,
                    first_line: asyncio.Event | None = None) -> bytes:
    """Everything the runner sends until the run is over (the sandbox closes its end);
    past `MAX_CHANNEL` bytes the rest is drained and dropped. `first_line` is set when
    the first record (`start`) has arrived."""
    chunks: list[bytes] = []
    size = 0
    while True:
        try:
            chunk = await loop.sock_recv(sock, 1 << 16)
        except ConnectionResetError:  # the run ended with our job unread: over, too
            chunk = b""
        if first_line is not None and (b"\n" in chunk or not chunk):
            first_line.set()
        if not chunk:
            return b"".join(chunks)
        if size < MAX_CHANNEL:
            chunks.append(chunk)
            size += len(chunk)


# --------------------------------------------------------------------------- grading

@dataclass
class _Report:
    """The runner's records, as far as they can be believed."""

    start: dict[str, Any] | None = None
    end: dict[str, Any] | None = None
    tests: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    """node id -> phase (setup/call/teardown) -> record"""
    collect: dict[str, dict[str, Any]] = field(default_factory=dict)
    tamper: list[str] = field(default_factory=list)


def parse_records(data: bytes, nonce: str) -> _Report:
    """Records carrying `nonce`, in sequence. A record out of sequence, or anything else
    on the channel that names a nonce, is someone else writing to it: `tamper`, and
    nothing after it is believed."""
    rep = _Report()
    seq = 0
    for line in data.split(b"\n"):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError):
            obj = None
        if not isinstance(obj, dict) or obj.get("nonce") != nonce:
            rep.tamper.append("something else wrote to the judge's channel")
            break
        if obj.get("seq") != seq or rep.end is not None:
            rep.tamper.append("the judge's channel carried records out of sequence")
            break
        seq += 1
        kind = obj.get("t")
        if kind == "start" and seq == 1:
            rep.start = obj
        elif kind == "test" and isinstance(obj.get("id"), str):
            rep.tests.setdefault(obj["id"], {})[str(obj.get("when"))] = obj
        elif kind == "collect" and isinstance(obj.get("id"), str):
            rep.collect[obj["id"]] = obj
        elif kind == "tamper":
            rep.tamper += [str(w) for w in obj.get("what") or []]
        elif kind == "end" and obj.get("count") == seq:
            rep.end = obj
        else:
            rep.tamper.append(f"unexpected record {str(kind)[:40]!r} on the channel")
            break
    return rep


def _grade(task: Task, modules: list[str], nonce: str, data: bytes, r: ExecResult,
           wall_ms: float, rc: ExecResult | None = None) -> Grade:
    """`r`: the run of the tests; `rc`: the candidate's own run on the trusted tier (on
    the in-process tier, `r` is both)."""
    rc = rc or r
    common: dict[str, Any] = {"wall_ms": round(wall_ms, 3), "candidate_cpu_ms": rc.cpu_ms,
                              "candidate_peak_memory_bytes": rc.peak_memory_bytes}
    if r.status is ExecStatus.INFRA:
        return Grade(task.task_id, Outcome.INFRA, message=f"grading sandbox: {r.message}",
                     **common)
    rep = parse_records(data, nonce)
    if rc is not r and rc.status is ExecStatus.INFRA and not (rep.end or {}).get("answers"):
        # Proven, not assumed: the candidate's sandbox failed before its process answered
        # anything. Once it has answered, whatever became of its run is its own doing,
        # and the tests' report stands.
        return Grade(task.task_id, Outcome.INFRA,
                     message=f"candidate's sandbox: {rc.message}", **common)
    if rep.start is None:
        return Grade(task.task_id, Outcome.ERROR, message=(
            f"the test runner did not start (status {r.status.value} {r.message}): "
            f"{r.stderr_text.strip()[-1500:]}").strip(), **common)
    if rep.start.get("error"):
        return Grade(task.task_id, Outcome.ERROR,
                     message=f"the test runner could not start: {rep.start['error']}"[:4000],
                     **common)
    clean = (rep.end is not None and rep.end.get("finished") is True
             and r.status is ExecStatus.OK and not rep.tamper)
    hidden_files = {p for p, _ in task.hidden_test_files}
    results = _results(task, modules, rep, clean, hidden_files)
    flags = ("pytest-tamper",) if rep.tamper else ()
    if rep.tamper:
        message = "the test runner was tampered with: " + "; ".join(rep.tamper[:5])
    elif not clean:
        message = (f"the test run did not finish cleanly (status {r.status.value}"
                   f"{': ' + r.message if r.message else ''}); no result counts")
    else:
        first = next((t for t in results if not t.passed), None)
        message = f"{first.name}: {first.message}" if first else ""
    statuses = {r.status, rc.status}
    if rep.tamper:  # the act reached the evidence: the runner saw it
        outcome = Outcome.CHEAT
    elif results and all(t.passed for t in results):
        outcome = Outcome.PASSED
    elif ExecStatus.MEMORY in statuses:
        outcome = Outcome.MEMORY
    elif ExecStatus.TIMEOUT in statuses:
        outcome = Outcome.TIMEOUT
    else:
        outcome = Outcome.FAILED
    ordered = tuple(sorted(results, key=lambda t: (not t.hidden, t.name)))
    return Grade(task.task_id, outcome, tests=ordered, message=message[:4000], flags=flags,
                 **common)


def _results(task: Task, modules: list[str], rep: _Report, clean: bool,
             hidden_files: set[str]) -> list[TestResult]:
    sources = {**dict(task.test_files), **dict(task.hidden_test_files)}
    out: list[TestResult] = []
    seen: set[str] = set()
    for node, phases in rep.tests.items():
        path = node.partition("::")[0]
        if path not in modules:
            continue  # not a trusted test file's test
        seen.add(node)
        hidden = path in hidden_files
        why = _failure(phases, hidden)
        if why and not hidden and _quotes_hidden(why, task):
            why = why.split(":", 1)[0] + ": details withheld (they quote a hidden test)"
        if why is None and not clean:
            why = "passed, but the run did not finish cleanly: not counted"
        out.append(TestResult(node, why is None, why or "",
                              float(phases.get("call", {}).get("ms", 0.0)), hidden))
    for path in modules:
        hidden = path in hidden_files
        bad = rep.collect.get(path)
        for name in expected_tests(path, sources[path]):
            if any(n == name or n.startswith(name + "[") for n in seen):
                continue
            if bad is not None:
                why = f"not run: its file did not collect ({bad.get('outcome')})" + (
                    "" if hidden else f": {str(bad.get('msg', ''))[-_MSG:]}")
            else:
                why = "not run: never reported by the test runner"
            out.append(TestResult(name, False, why, 0.0, hidden))
        if bad is not None and not expected_tests(path, sources[path]):
            out.append(TestResult(path, False, f"its file did not collect "
                                  f"({bad.get('outcome')})", 0.0, hidden))
    return out


def _quotes_hidden(message: str, task: Task) -> bool:
    """Whether a visible test's failure message quotes a line of a hidden test file (the
    candidate's code can read those files while it runs and put them in an exception)."""
    return any(line in message for line in _hidden_lines(task))


@lru_cache(maxsize=256)  # bounded: a training run sees many tasks
def _hidden_lines(task: Task) -> frozenset[str]:
    return frozenset(line.strip() for _, d in task.hidden_test_files
                     for line in d.decode("utf-8", "replace").splitlines()
                     if len(line.strip()) >= 12)


def _failure(phases: dict[str, dict[str, Any]], hidden: bool) -> str | None:
    """None when setup, call and teardown all passed, else why not (details only for
    visible tests: a hidden test's assertion would show its expected values)."""
    if "call" not in phases:
        for when in ("setup", "teardown"):
            rec = phases.get(when)
            if rec is not None and rec.get("outcome") != "passed":
                return _phase_failure(rec, when, hidden)
        return "not run: no result for the test call"
    for when in ("setup", "call", "teardown"):
        rec = phases.get(when)
        if rec is None:
            return f"no result for its {when}"
        if rec.get("xfail"):
            return "xfail: an expected failure is not a pass"
        if rec.get("outcome") != "passed":
            return _phase_failure(rec, when, hidden)
    return None


def _phase_failure(rec: dict[str, Any], when: str, hidden: bool) -> str:
    outcome = str(rec.get("outcome"))
    head = f"{outcome} ({when})" if when != "call" else outcome
    if hidden:
        return head
    return f"{head}: {str(rec.get('msg', ''))[-_MSG:]}"


def _not_run(task: Task, why: str) -> tuple[TestResult, ...]:
    hidden = {p for p, _ in task.hidden_test_files}
    sources = {**dict(task.test_files), **dict(task.hidden_test_files)}
    return tuple(sorted((TestResult(n, False, why, 0.0, p in hidden)
                         for p in graded_modules(task) for n in expected_tests(p, sources[p])),
                        key=lambda t: (not t.hidden, t.name)))
