"""Judging function-call tasks (HumanEval style) from outside the candidate.

Two sandboxes per attempt, joined only by a socketpair:

    candidate session                         harness session (trusted code)
    solution.py = prompt + completion         job.json = the task's setup and tests
    _trialbox_stub.py: load the solution, ◄─fd 3─► _trialbox_harness.py: run each test
      answer calls with plain data                with `candidate` = a proxy; print the
                                                  results with a nonce from stdin

The two sessions may come from different tiers: a `SplitProvider` (provider.py, the
default of `trialbox eval --tier gvisor|container`) opens the candidate's in gVisor and
the harness's on the namespace tier (`open_harness`); the socketpair is the
supervisor's, one end handed to each session.

Test code and expected answers never enter the candidate's process; values cross as
plain data through `codec.py` (exact builtin types only), so an always-equal object,
patched builtins, an early exit, forged output or a walk up the stack cannot make a test
pass. The only evidence is the harness's result line, checked against a fresh nonce the
candidate never sees.

An attempt that would be excluded (`infra`, or a broken task: `error`) is checked
against a control on the same machinery first (retry.py): the task's reference solution,
or a trivial program that answers None. If the control gets a verdict, the failure was
the candidate's (failed, reward 0, flag `self_inflicted_infra`, no second try); only if
the control fails too is it retried and, if it persists, excluded (reward None). The
trusted test's `random` is seeded from the run's secret, the task and the code
(`seeds.py`: the same code gets the same draws), recorded as `Grade.seed`.
"""

from __future__ import annotations

import ast
import asyncio
import json
import os
import secrets
import socket
import time
import weakref
from dataclasses import dataclass, field, replace
from functools import cache
from typing import Any, Protocol, TypeVar

from trialbox.errors import SandboxUnavailable, UsageError
from trialbox.judge.provider import candidate_limits, harness_provider
from trialbox.judge.retry import SELF_INFLICTED, Control, control_of, with_infra_retries
from trialbox.judge.seeds import derive_seed
from trialbox.judge.anticheat import Flag, canary_check, dynamic_scan, noted, static_scan
from trialbox.sandbox.base import Sandbox, SandboxProvider, passes_fds, preloaded_modules
from trialbox.sandbox.pool import PoolConfig
from trialbox.telemetry import traced_grade
from trialbox.types import (
    ExecResult,
    ExecStatus,
    Grade,
    Limits,
    Outcome,
    Task,
    TaskKind,
    TestResult,
)

HERE = os.path.dirname(os.path.abspath(__file__))


@dataclass(frozen=True)
class JudgeConfig:
    """Limits and timeouts of one function-call judgement."""

    candidate_limits: Limits = field(default_factory=lambda: Limits(
        wall_s=60, cpu_s=30, memory_mb=512, disk_mb=32, pids=32))
    """The candidate's sandbox (its wall clock is the harness's, plus slack)."""
    harness_limits: Limits = field(default_factory=lambda: Limits(
        wall_s=60, cpu_s=30, memory_mb=512, disk_mb=32, pids=16))
    """The trusted harness's sandbox."""
    call_timeout_s: float = 5.0
    """How long one call of the candidate may take."""
    load_timeout_s: float = 5.0
    """How long loading the solution (module-level code) may take."""
    retries: int = 2
    """Extra attempts after an infrastructure failure."""
    time_scale: float | None = None
    """When set, each test's per-call limit is `time_scale` × the reference solution's
    time on that test (never under `min_call_timeout_s`, never over `call_timeout_s`);
    see `reference_times`."""
    min_call_timeout_s: float = 0.5
    """The floor of a scaled per-test limit (scheduling noise must not fail a test)."""

    def __post_init__(self) -> None:
        if self.call_timeout_s <= 0 or self.load_timeout_s <= 0 or self.retries < 0:
            raise UsageError("JudgeConfig: call_timeout_s and load_timeout_s must be > 0 "
                             "and retries >= 0")
        if self.time_scale is not None and not self.time_scale > 0:
            raise UsageError(f"JudgeConfig.time_scale must be > 0 or None, got "
                             f"{self.time_scale!r}")
        if not 0 < self.min_call_timeout_s <= self.call_timeout_s:
            raise UsageError("JudgeConfig.min_call_timeout_s must be > 0 and at most "
                             "call_timeout_s")

    def limit_for(self, reference_ms: float | None) -> float | None:
        """The per-call limit for a test whose reference took `reference_ms`."""
        if self.time_scale is None or reference_ms is None:
            return None
        scaled = self.time_scale * reference_ms / 1000
        return min(self.call_timeout_s, max(self.min_call_timeout_s, scaled))


JUDGE_PRELOAD = ("collections", "functools", "itertools", "math", "re", "typing", "heapq",
                 "bisect", "string")
"""Stdlib modules a judge pool's zygote imports: what solutions commonly use, and
nothing heavy they rarely do (PoolConfig's default also has dataclasses — it pulls in
inspect and ast —, fractions, decimal, traceback, linecache: ~2.6 MiB more heap). Every
attempt forks a candidate from that heap, so each page of it costs page-table copies
at the fork and their teardown at exit; a solution that imports one of those modules
pays for it itself (a few ms)."""


def judge_pool_config(**changes: Any) -> PoolConfig:
    """A pool configuration for judging: the codec preloaded in every sandbox's
    interpreter (importing it cold costs ~6 ms per process, twice per attempt), and a
    leaner set of stdlib modules than the default (`JUDGE_PRELOAD`)."""
    changes.setdefault("preload", JUDGE_PRELOAD)
    return PoolConfig(preload_sources=(
        ("_trialbox_codec", _program("codec.py").decode()),
        ("_trialbox_stub", _program("candidate_stub.py").decode()),
        ("_trialbox_harness", _program("harness_program.py").decode())), **changes)


@cache
def _program(name: str) -> bytes:
    with open(os.path.join(HERE, name), "rb") as f:
        return f.read()


_S = TypeVar("_S", bound=Sandbox, covariant=True)


class _Opener(Protocol[_S]):
    """What `open_harness` needs of a provider; typed so that a concrete provider's
    session type comes back (a `CellPool` gives a `NamespaceSandbox`)."""

    tier: str

    async def open(self, limits: Limits | None = None) -> _S: ...


async def open_harness(pool: _Opener[_S], config: JudgeConfig | None = None) -> _S:
    """A session for the trusted harness that several judgements may share, one at a
    time (every process of a run dies with it; only job.json changes between tasks).
    The candidate always gets a fresh session of its own. From `pool`'s harness
    provider (`provider.harness_provider`): a `SplitProvider` judging candidates in
    gVisor gives the harness a namespace-tier session."""
    config = config or JudgeConfig()
    pool = harness_provider(pool)
    _check_provider(pool, "open_harness")
    harness = await pool.open(config.harness_limits)
    await harness.write_file("_trialbox_codec.py", _program("codec.py"))
    await harness.write_file("_trialbox_harness.py", _program("harness_program.py"))
    return harness


class _HarnessServer:
    """The trusted harness as a server in a shared harness session (harness_program's
    `serve()`): one sandbox run for many judgements, each job run in the server's own
    process (test code is trusted; the server puts back what a job changed before the
    next). Compared with a sandbox run per job it saves the run's set-up (user
    namespace, seccomp, rlimits, status records, cgroup reads) on every attempt, and
    compared with a child per job a fork and its copy-on-write faults. Created lazily
    for a session from `open_harness`; a server that dies is started again."""

    def __init__(self, sb: Sandbox, config: JudgeConfig):
        # weakly: the registry below is keyed by the session and must not keep it alive
        self._sb = weakref.ref(sb)
        self.config = config
        self.ctl: socket.socket | None = None
        self.run: asyncio.Future[ExecResult] | None = None
        self.seq = 0

    @property
    def sb(self) -> Sandbox:
        sb = self._sb()
        if sb is None:
            raise UsageError("the harness session of this server is gone")
        return sb

    @property
    def alive(self) -> bool:
        return self.ctl is not None and self.run is not None and not self.run.done()

    def _start(self) -> None:
        self.shutdown()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        ours.setblocking(False)
        self.ctl = ours
        # The server lives as long as the session: its own wall and CPU limits are the
        # caps; each job's time is bounded by the deadline the server enforces.
        limits = replace(self.config.harness_limits, wall_s=86400, cpu_s=86400)
        self.run = asyncio.ensure_future(self.sb.exec(
            ["python3", "-c", "import _trialbox_harness as m; m.serve()"],
            limits=limits, pass_fds={3: theirs.detach()}))

    def shutdown(self) -> None:
        if self.ctl is not None:
            self.ctl.close()  # EOF: the server returns
            self.ctl = None

    async def job(self, job: dict[str, Any], nonce: str, channel: socket.socket,
                  deadline_s: float) -> tuple[dict[str, Any] | None, str, bool]:
        """Run one job against the candidate on `channel` (handed over: closed here).
        Returns (the report, why there is none, whether the machinery failed)."""
        try:
            if not self.alive:
                self._start()
            assert self.ctl is not None and self.run is not None
            self.seq += 1
            request: dict[str, Any] = {"seq": self.seq, "nonce": nonce,
                                       "deadline": deadline_s, "job": job}
            data = json.dumps(request).encode()
            if len(data) > _INLINE_MAX:  # a datagram this big may not fit: a file
                name = f"job-{self.seq}.json"
                await self.sb.write_file(name, json.dumps(job).encode())
                del request["job"]
                request["job_file"] = name
                data = json.dumps(request).encode()
            socket.send_fds(self.ctl, [data], [channel.fileno()])
        except (OSError, UsageError) as e:
            self.shutdown()
            return None, f"harness server: {e}", True
        finally:
            channel.close()
        loop = asyncio.get_running_loop()
        reply_task = asyncio.ensure_future(loop.sock_recv(self.ctl, _REPLY_MAX))
        try:
            waiting: set[asyncio.Future[Any]] = {reply_task, self.run}
            done, _ = await asyncio.wait(waiting, timeout=deadline_s + 5,
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not reply_task.done():
                reply_task.cancel()
        if reply_task not in done or not reply_task.result():
            self.shutdown()
            await self.sb.stop()
            r = self.run.result() if self.run.done() else None
            detail = f"{r.status.value}: {r.message}" if r is not None else "no reply"
            return None, f"the harness server stopped answering ({detail})", True
        try:  # a reply cut short or garbled is the machinery's failure, never a grade
            reply = json.loads(reply_task.result())
            if not isinstance(reply, dict):
                raise ValueError(f"a {type(reply).__name__}, not an object")
        except (ValueError, UnicodeDecodeError) as e:
            self.shutdown()
            await self.sb.stop()
            return None, f"the harness server's reply is unreadable: {e}", True
        if not reply.get("ok") or reply.get("seq") != self.seq:
            return None, str(reply.get("why") or "bad reply"), False
        if isinstance(reply.get("report"), dict):
            return reply["report"], "", False
        try:
            data = await self.sb.read_file(str(reply.get("report_file")))
            return json.loads(data), "", False
        except (UsageError, ValueError) as e:
            return None, f"the harness's report is unreadable: {e}", False


_PAST_DEADLINE = "ran past the job's deadline"
"""In a grade's message: the harness server's alarm stopped a test (harness_program)."""

_INLINE_MAX = 60_000
"""Jobs up to this size travel in the request itself, larger ones as a workspace file."""

_REPLY_MAX = 1 << 16
"""The receive size for the harness server's replies: a report inline is at most its
INLINE_MAX (60,000) characters plus a few short fields, larger ones come as a file. Kept
under glibc's mmap threshold (128 KiB): a 128 KiB receive buffer was a fresh mapping
made and unmapped on every reply (~20 us)."""


_servers: weakref.WeakKeyDictionary[Sandbox, _HarnessServer] = \
    weakref.WeakKeyDictionary()


def _server_for(harness: Sandbox, config: JudgeConfig) -> _HarnessServer:
    server = _servers.get(harness)
    if server is None:
        server = _servers[harness] = _HarnessServer(harness, config)
    return server


async def reference_times(task: Task, pool: SandboxProvider, config: JudgeConfig | None = None,
                          harness: Sandbox | None = None) -> dict[str, float]:
    """Per-test times (ms, as the harness measured them) of the task's reference
    solution, for `JudgeConfig.time_scale`; empty when it has none or it does not pass."""
    if not task.canonical_solution:
        return {}
    g = await judge_function(task, task.canonical_solution, pool, config, harness)
    return {t.name: t.ms for t in g.tests} if g.passed else {}


@traced_grade  # span judge.grade, outcomes, flags, grading time (telemetry)
async def judge_function(task: Task, completion: str, pool: SandboxProvider,
                         config: JudgeConfig | None = None,
                         harness: Sandbox | None = None,
                         reference: dict[str, float] | None = None,
                         seed: int | None = None) -> Grade:
    """Grade `completion` (appended to `task.prompt`) against the task's tests.

    `harness`: a session from `open_harness` to reuse (saves a sandbox per attempt);
    without one, a harness session is opened and closed here. `reference`: per-test
    times from `reference_times`, used when `config.time_scale` is set. `seed`: the
    trusted test's `random` seed (default: a fresh secret per attempt; pass a grade's
    `seed` to re-grade it with the same draws)."""
    config = config or JudgeConfig()
    if task.kind is not TaskKind.FUNCTION or not task.entry_point:
        raise UsageError(f"{task.task_id}: judge_function needs a FUNCTION task with an "
                         f"entry_point, got kind={task.kind.value!r}")
    if not isinstance(completion, str):
        raise UsageError(f"{task.task_id}: the completion must be a str, got "
                         f"{type(completion).__name__}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise UsageError(f"{task.task_id}: seed must be an int or None, got {seed!r}")
    _check_provider(pool, task.task_id)
    # Every attempt runs: a flag is no verdict (anticheat.py), so no source is scored
    # unrun — speed never buys a wrong verdict.
    static = static_scan(task.prompt + completion, task.prompt, entry_point=task.entry_point)
    return await _judge(task, completion, pool, config, harness, reference or {}, seed,
                        with_control=True, static=static)


async def _judge(task: Task, completion: str, pool: SandboxProvider, config: JudgeConfig,
                 harness: Sandbox | None, reference: dict[str, float],
                 seed: int | None, with_control: bool,
                 static: tuple[Flag, ...] | None = None) -> Grade:
    program, name = control_program(task)
    control = None
    if with_control and completion != program:
        async def control() -> Control:
            g = await _judge(task, program, pool, replace(config, retries=0), harness,
                             reference, None, with_control=False)
            return control_of(name, g, reference=bool(task.canonical_solution))
    grade = await with_infra_retries(
        lambda: _attempt(task, completion, pool, config, harness, reference, seed, static),
        config.retries, task.task_id, control)
    if SELF_INFLICTED in grade.flags and _PAST_DEADLINE in grade.message:
        # The candidate's answers made trusted test code overrun its deadline: time.
        grade = replace(grade, outcome=Outcome.TIMEOUT)
    return grade


def control_program(task: Task) -> tuple[str, str]:
    """The completion a control runs for `task` (retry.py) and its name: the reference
    solution when the task has one, else a trivial program whose every call answers
    None (appended to the prompt, it redefines the entry point)."""
    if task.canonical_solution:
        return task.canonical_solution, "the reference solution"
    return (f"\n    pass\n\n\ndef {task.entry_point}(*args, **kwargs):\n    return None\n",
            "a trivial program (every call answers None)")


async def _attempt(task: Task, completion: str, pool: SandboxProvider, config: JudgeConfig,
                   shared: Sandbox | None, reference: dict[str, float],
                   seed: int | None, static: tuple[Flag, ...] | None = None) -> Grade:
    t0 = time.monotonic()
    nonce = secrets.token_hex(16)
    tests = [(t, True) for t in task.hidden_tests] + [(t, False) for t in task.visible_tests]
    job = _job(task, config, reference)
    # the same code, the same draws; the secret never enters a sandbox (seeds.py)
    job["seed"] = seed = derive_seed(task.task_id, completion) if seed is None else seed
    cand = await pool.open(candidate_limits(config.candidate_limits, task))
    harness = shared or await open_harness(pool, config)
    ours, theirs = socket.socketpair()
    report: dict[str, Any] | None = None
    try:
        try:
            await cand.write_file("solution.py", (task.prompt + completion).encode(
                "utf-8", errors="surrogateescape"))
        except UsageError as e:  # e.g. a completion larger than the workspace
            return Grade(task.task_id, Outcome.FAILED, message=f"the solution could not be "
                         f"written to the candidate's workspace: {e}",
                         wall_ms=round((time.monotonic() - t0) * 1e3, 3), seed=seed)
        if not _preloaded(pool):  # else `import` finds them in the warm interpreter
            await cand.write_file("_trialbox_codec.py", _program("codec.py"))
            await cand.write_file("_trialbox_stub.py", _program("candidate_stub.py"))
        cand_run = asyncio.ensure_future(cand.exec(
            ["python3", "-c", "import _trialbox_stub as m; m.main()", task.entry_point],
            pass_fds={3: theirs.detach()}, last=True))
        if shared is not None:
            report, why, broken = await _server_for(shared, config).job(
                job, nonce, ours, _job_deadline(job, config))
            rh = _server_result(report, nonce, why, broken, pool)
        else:
            await harness.write_file("job.json", json.dumps(job).encode())
            rh = await harness.exec(
                ["python3", "-c", "import _trialbox_harness as m; m.main()"],
                stdin=nonce.encode(), pass_fds={3: ours.detach()})
        # The harness is done (or gone): nothing the candidate does now can matter.
        await cand.stop()
        rc = await cand_run
    finally:
        ours.close()
        theirs.close()
        await cand.close()
        if shared is None:
            await harness.close()
    grade = _grade(task, tests, nonce, rc, rh, (time.monotonic() - t0) * 1e3, report)
    return canary_check(_with_flags(replace(grade, seed=seed), task, completion, rc, static),
                        task)


def _job(task: Task, config: JudgeConfig, reference: dict[str, float]) -> dict[str, Any]:
    """The harness's job for a task: its setup and tests (hidden first), with limits."""
    tests = (*task.hidden_tests, *task.visible_tests)
    return {"setup": _prompt_setup(task.prompt, task.entry_point) + "\n" + task.test_setup,
            "entry_point": task.entry_point, "call_timeout": config.call_timeout_s,
            "load_timeout": config.load_timeout_s,
            "tests": [{"name": t.name, "code": t.code,
                       "timeout": config.limit_for(reference.get(t.name))}
                      for t in tests]}


_STUB_MODULES = frozenset({"_trialbox_codec", "_trialbox_stub"})


def _preloaded(pool: SandboxProvider) -> bool:
    """Whether the candidate's interpreter already holds the stub and the codec (a judge
    pool, `judge_pool_config`), or they must be written into its workspace."""
    return _STUB_MODULES <= preloaded_modules(pool)


def _check_provider(pool: _Opener[Any], task_id: str) -> None:
    """The function judge joins its two sandboxes by a socketpair handed over as fd 3
    (`Sandbox.exec(pass_fds=...)`): a tier that cannot pass an fd cannot run it."""
    if not passes_fds(pool):
        raise SandboxUnavailable(
            f"{task_id}: the function judge needs a tier that passes file descriptors into "
            f"a sandbox (the candidate and the harness talk over a socketpair), and the "
            f"{pool.tier} tier's provider cannot (its passes_fds is False); judge function "
            f"tasks on the namespace, gvisor or container tier")


def _job_deadline(job: dict[str, Any], config: JudgeConfig) -> float:
    """How long one job may take in the harness server: loading plus every test's
    limit, plus slack for the test code's own work."""
    per_test = sum(t["timeout"] or config.call_timeout_s for t in job["tests"])
    return min(config.harness_limits.wall_s, config.load_timeout_s + per_test + 5.0)


def _server_result(report: dict[str, Any] | None, nonce: str, why: str, broken: bool,
                   pool: SandboxProvider) -> ExecResult:
    """The harness server's answer in the shape of a one-shot harness run, for
    `_grade` (which takes the report itself beside it), a broken server as `infra`."""
    if broken:
        return ExecResult(ExecStatus.INFRA, message=why, runtime=pool.runtime.id)
    if report is None:
        return ExecResult(ExecStatus.EXIT, exit_code=1, message=why,
                          runtime=pool.runtime.id)
    return ExecResult(ExecStatus.OK, exit_code=0, runtime=pool.runtime.id)


def _with_flags(grade: Grade, task: Task, completion: str, rc: ExecResult,
                static: tuple[Flag, ...] | None = None) -> Grade:
    """Record what the detectors saw (the source, the candidate's output) as notable
    flags. They change nothing else: the tests run in the harness's process and only
    plain data crosses back, so no act in the candidate's process reaches the evidence
    — an attack that fails is FAILED by its tests (an always-equal object returned is
    refused by the codec and fails its test), and one that breaks the machinery is
    proven its own failure by the control (retry.py). Only a canary's pass is CHEAT
    (`canary_check`)."""
    if static is None:  # else scanned once already, by judge_function
        static = static_scan(task.prompt + completion, task.prompt,
                             entry_point=task.entry_point)
    return noted(grade, static + dynamic_scan(rc.stdout, rc.stderr))


def _grade(task: Task, tests: list[tuple[Any, bool]], nonce: str, rc: ExecResult,
           rh: ExecResult, wall_ms: float, served: dict[str, Any] | None = None) -> Grade:
    """The grade from the harness's report: the line carrying the nonce on a one-shot
    harness's stdout, or `served`, the harness server's report (the nonce checked all
    the same; not written out as JSON and read back)."""
    common: dict[str, Any] = {"wall_ms": round(wall_ms, 3), "candidate_cpu_ms": rc.cpu_ms,
                              "candidate_peak_memory_bytes": rc.peak_memory_bytes}
    if ExecStatus.INFRA in (rc.status, rh.status):
        which = "candidate" if rc.status is ExecStatus.INFRA else "harness"
        msg = rc.message if rc.status is ExecStatus.INFRA else rh.message
        return Grade(task.task_id, Outcome.INFRA, message=f"{which} sandbox: {msg}", **common)
    report = _report(rh.stdout, nonce) if served is None else (
        served if served.get("nonce") == nonce else None)
    if report is None:
        return Grade(task.task_id, Outcome.ERROR, message=(
            f"the test harness produced no result (status {rh.status.value}: "
            f"{rh.message}; {rh.stderr_text.strip()[-500:]})"), **common)
    if report["setup_error"]:
        return Grade(task.task_id, Outcome.ERROR,
                     message=f"the task's test code failed: {report['setup_error']}",
                     **common)
    results = tuple(
        TestResult(name=r["name"], passed=bool(r["passed"]), message=r["message"],
                   ms=float(r["ms"]), hidden=hidden)
        for r, (_t, hidden) in zip(report["results"], tests, strict=True))
    if report.get("deadline"):  # provisional: judge_function asks the reference
        return Grade(task.task_id, Outcome.ERROR, tests=results, message=(
            f"test {report['deadline']} {_PAST_DEADLINE}"), **common)
    if results and all(r.passed for r in results):
        outcome, message = Outcome.PASSED, ""
    elif rc.status is ExecStatus.MEMORY:
        outcome, message = Outcome.MEMORY, rc.message
    elif report["load"]:
        outcome = Outcome.TIMEOUT if "did not load within" in report["load"] \
            else Outcome.FAILED
        message = report["load"]
    elif any("no answer within" in r.message for r in results if not r.passed):
        outcome, message = Outcome.TIMEOUT, next(
            r.message for r in results if "no answer within" in r.message)
    else:
        first = next(r for r in results if not r.passed) if results else None
        outcome = Outcome.FAILED
        message = f"{first.name}: {first.message}" if first else "no tests"
    return Grade(task.task_id, outcome, tests=results, message=message, **common)


@cache
def _prompt_setup(prompt: str, entry_point: str) -> str:
    """The prompt's own definitions (imports, helper functions such as HumanEval/38's
    `encode_cyclic`) for the harness: tests may use them, and the harness must use the
    task's copy, not whatever the candidate redefined. The entry point itself is left
    out — in the harness that name is the proxy to the candidate."""
    try:
        tree = ast.parse(prompt)
    except SyntaxError:
        return ""
    keep = [node for node in tree.body
            if not (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                    and node.name == entry_point)]
    return "\n".join(ast.get_source_segment(prompt, node) or "" for node in keep)


def _report(stdout: bytes, nonce: str) -> dict[str, Any] | None:
    """The harness's result line, if it is there and carries our nonce."""
    for line in reversed(stdout.splitlines()):
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict) and obj.get("nonce") == nonce:
            return obj
    return None
