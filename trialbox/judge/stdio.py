"""Judging stdio tasks: run the candidate's program on each test's stdin in a sandbox of
its own, and compare its stdout with the expected bytes *outside* the sandbox.

    candidate session (one per attempt)           the judge (this process)
      main.py / main.c (compiled once)              compares stdout with `expected`:
      one run per test: stdin in, stdout out ────►  exact | whitespace | float
                                                    checker: a trusted program in a
                                                    separate session decides

The expected output never enters the candidate's sandbox, and what the program says
about itself (exit status, stderr) is never evidence of a pass: a test passes only when
the run ended normally (status 0) and its stdout compares equal. An attempt that would be
excluded (`infra`; a checker that breaks on the task's own expected output: `error`) is
checked against a control first (retry.py): the task's reference solution, or a trivial
program, in a fresh session. If the control gets a verdict, the failure was the
candidate's (it can break its own session: `chmod 000` on its workspace) — failed,
reward 0, flag `self_inflicted_infra`; only if the control fails too is it retried and
then excluded (reward None).

Messages of hidden tests say where the output differs, never what was expected, so a
grade fed back to the policy cannot leak hidden answers.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from trialbox.errors import UsageError
from trialbox.judge.anticheat import Flag, canary_check, dynamic_scan, noted, static_scan
from trialbox.judge.provider import candidate_limits
from trialbox.judge.retry import Control, control_of, with_infra_retries
from trialbox.sandbox import languages
from trialbox.sandbox.languages import Language, compile_limits_for, run_limits_for
from trialbox.sandbox.base import Sandbox, SandboxProvider
from trialbox.telemetry import traced_grade
from trialbox.types import (
    Compare,
    ExecResult,
    ExecStatus,
    Grade,
    Limits,
    Outcome,
    Task,
    TaskKind,
    TestCase,
    TestResult,
)


@dataclass(frozen=True)
class StdioJudgeConfig:
    """Limits of one stdio judgement."""

    limits: Limits = field(default_factory=lambda: Limits(
        wall_s=10, cpu_s=10, memory_mb=256, disk_mb=32))
    """The candidate's sandbox; each test's run gets these limits."""
    compile_limits: Limits | None = None
    """The compile's budget, its own (compiled languages). None: `limits` with at least
    COMPILE_FLOOR_S of wall and CPU time — a per-test limit of 1 s, a contest's, is not
    a compiler's budget (`#include <bits/stdc++.h>` alone takes 1–2 s of CPU). Either
    way the language's floors on the compiler's processes and memory apply; a compile
    that passes this budget is the candidate's (`compilation failed (timeout)`)."""
    checker_limits: Limits = field(default_factory=lambda: Limits(
        wall_s=10, cpu_s=10, memory_mb=256, disk_mb=32))
    """The trusted checker's sandbox (CHECKER tasks); its disk holds input, expected and
    the candidate's output (up to `limits.output_bytes`)."""
    retries: int = 2
    """Extra attempts after an infrastructure failure."""
    stop_on_timeout: bool = True
    """After a test times out, fail the rest without running them (an infinite loop
    would otherwise cost every test's wall time; the outcome is TIMEOUT either way)."""
    time_scale: float | None = None
    """When set, each test's wall-clock limit is `time_scale` × the reference solution's
    time on that test (never under `min_time_s`, never over `limits.wall_s`); see
    `reference_times`. Mirrors `JudgeConfig.time_scale` of function tasks."""
    min_time_s: float = 0.5
    """The floor of a scaled per-test limit (scheduling noise must not fail a test)."""

    def __post_init__(self) -> None:
        for name in ("limits", "checker_limits", "compile_limits"):
            value = getattr(self, name)
            if name == "compile_limits" and value is None:
                continue
            if not isinstance(value, Limits):
                raise UsageError(f"StdioJudgeConfig.{name} must be a trialbox.types.Limits, "
                                 f"got {type(value).__name__}")
            if value.network:
                raise UsageError(f"StdioJudgeConfig.{name}.network must be False: a stdio "
                                 "program's only input is stdin")
        if isinstance(self.retries, bool) or not isinstance(self.retries, int) \
                or self.retries < 0:
            raise UsageError(f"StdioJudgeConfig.retries must be an int >= 0, got "
                             f"{self.retries!r}")
        if self.time_scale is not None and (
                isinstance(self.time_scale, bool) or not isinstance(self.time_scale, (int, float))
                or not math.isfinite(self.time_scale) or self.time_scale <= 0):
            raise UsageError(f"StdioJudgeConfig.time_scale must be a number > 0 or None, got "
                             f"{self.time_scale!r}")
        if not 0 < self.min_time_s <= self.limits.wall_s:
            raise UsageError(f"StdioJudgeConfig.min_time_s must be > 0 and at most "
                             f"limits.wall_s ({self.limits.wall_s}), got {self.min_time_s!r}")
        if self.checker_limits.disk_bytes < 2 * self.limits.output_bytes + (1 << 20):
            raise UsageError("StdioJudgeConfig.checker_limits.disk_mb is too small to hold "
                             "the candidate's output (limits.output_bytes) with the input and "
                             "expected files; raise checker_limits.disk_mb")


    def compile_limits_of(self, spec: Language) -> Limits:
        """The limits `spec`'s compiler runs under (see `compile_limits`)."""
        base = self.compile_limits or self.limits.with_(
            wall_s=max(self.limits.wall_s, COMPILE_FLOOR_S),
            cpu_s=max(self.limits.cpu_s, COMPILE_FLOOR_S))
        return compile_limits_for(base, spec)

    def limits_for(self, reference_ms: float | None) -> Limits | None:
        """The run limits for a test whose reference took `reference_ms` (None: the
        session's own `limits`)."""
        if self.time_scale is None or reference_ms is None:
            return None
        scaled = self.time_scale * reference_ms / 1000
        return self.limits.with_(wall_s=min(self.limits.wall_s,
                                            max(self.min_time_s, scaled)))


COMPILE_FLOOR_S = 10
"""The least wall and CPU time a stdio judge's compile gets when no `compile_limits` are
set (SandboxFusion's default `compile_timeout` too)."""

_NORMAL_IN_PROGRAMS = frozenset({"exit-call", "test-runner-output"})
"""Static findings not even recorded for stdio programs: nearly every program would carry
them, which would drown the flag counts. Runner-like text on *stderr* (dynamic scan) is
still recorded: stderr is not the answer, so such text there is aimed at someone else."""

_TRACEBACK = b"Traceback (most recent call last)"
_NUMBER = re.compile(rb"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_INTEGER = re.compile(rb"[+-]?\d+")
_PARTS = re.compile(rb"([+-]?)(\d*)(?:\.(\d*))?(?:[eE]([+-]?\d+))?")
_SNIPPET = 80


class _Excluded(Exception):
    """The attempt cannot be graded: the machinery (INFRA) or the task (ERROR) failed."""

    def __init__(self, outcome: Outcome, message: str):
        super().__init__(message)
        self.outcome = outcome
        self.message = message


async def reference_times(task: Task, pool: SandboxProvider,
                          config: StdioJudgeConfig | None = None) -> dict[str, float]:
    """Per-test wall times (ms, the supervisor's clock) of the task's reference solution
    (Python), for `StdioJudgeConfig.time_scale` and efficiency scores; empty when it has
    none or it does not pass. Measured under unscaled limits."""
    if not task.canonical_solution:
        return {}
    base = replace(config, time_scale=None) if config is not None else None
    g = await judge_stdio(task, task.canonical_solution, pool, base)
    return {t.name: t.ms for t in g.tests} if g.passed else {}


@traced_grade  # span judge.grade, outcomes, flags, grading time (telemetry)
async def judge_stdio(task: Task, source: str, pool: SandboxProvider,
                      config: StdioJudgeConfig | None = None,
                      language: str = "python",
                      reference: dict[str, float] | None = None) -> Grade:
    """Grade the program `source` (in `language`: python, c, cpp, bash, sh) against the
    task's tests, hidden first, then visible. `reference`: per-test times from
    `reference_times`, used when `config.time_scale` is set."""
    config = config or StdioJudgeConfig()
    if task.kind is not TaskKind.STDIO:
        raise UsageError(f"{task.task_id}: judge_stdio needs a STDIO task, got "
                         f"kind={task.kind.value!r}")
    if task.compare is Compare.CHECKER and not task.checker:
        raise UsageError(f"{task.task_id}: compare is 'checker' but the task has no checker")
    if not isinstance(source, str):
        raise UsageError(f"{task.task_id}: the source must be a str, got "
                         f"{type(source).__name__}")
    spec = languages.language(language)  # UnknownLanguage (a UsageError) names the choices
    program, name = control_program(task)
    python = languages.language("python")
    control = None
    if (source, spec.name) != (program, python.name):
        async def control() -> Control:
            return control_of(name, await _attempt(task, program, python, pool, config,
                                                   reference or {}),
                              reference=bool(task.canonical_solution))
    return await with_infra_retries(
        lambda: _attempt(task, source, spec, pool, config, reference or {}),
        config.retries, task.task_id, control)


def control_program(task: Task) -> tuple[str, str]:
    """The Python program a control runs for `task` (retry.py) and its name: the
    reference solution when the task has one, else a program that prints nothing."""
    if task.canonical_solution:
        return task.canonical_solution, "the reference solution"
    return "pass\n", "a trivial program (prints nothing)"


async def _attempt(task: Task, source: str, spec: Language, pool: SandboxProvider,
                   config: StdioJudgeConfig, reference: dict[str, float]) -> Grade:
    t0 = time.monotonic()
    tests = [(t, True) for t in task.hidden_tests] + [(t, False) for t in task.visible_tests]
    runs: list[ExecResult] = []
    config = replace(config, limits=candidate_limits(config.limits, task))  # its runs too
    cand = await pool.open(config.limits)
    checker = _Checker(task, pool, config.checker_limits)
    try:
        results, message = await _run_tests(task, source, spec, tests, cand, checker,
                                            config, runs, reference)
    except _Excluded as e:
        return _grade(task, e.outcome, (), e.message, runs, t0)
    finally:
        await cand.close()
        await checker.close()
    grade = _grade(task, _outcome(results, runs, message), results,
                   message or _first_failure(results), runs, t0)
    return canary_check(_with_flags(grade, source, spec, runs), task)


async def _run_tests(task: Task, source: str, spec: Language,
                     tests: list[tuple[TestCase, bool]], cand: Sandbox,
                     checker: _Checker, config: StdioJudgeConfig, runs: list[ExecResult],
                     reference: dict[str, float]) -> tuple[tuple[TestResult, ...], str]:
    """Per-test results, and a message when the program never ran (did not compile)."""
    if not tests:
        raise _Excluded(Outcome.ERROR, "the task has no tests")
    data = source.encode("utf-8", errors="surrogateescape")
    filename, build, run = spec.commands(data)
    env = dict(spec.env) or None
    try:
        await cand.write_file(filename, data)
    except UsageError as e:  # the program does not fit the workspace: the candidate's doing
        return _none_ran(tests, f"the program could not be written: {e}")
    if build:
        comp = await cand.exec(list(build), env=env, limits=config.compile_limits_of(spec))
        if comp.status is ExecStatus.INFRA:
            raise _Excluded(Outcome.INFRA, f"candidate sandbox (compiling): {comp.message}")
        if not comp.ok:
            why = comp.stderr_text.strip()[-2000:] or comp.stdout_text.strip()[-2000:]
            return _none_ran(tests, f"compilation failed ({comp.status.value}"
                                    f"{': ' + comp.message if comp.message else ''}): {why}")
    results: list[TestResult] = []
    skip = ""
    for test, hidden in tests:
        if skip:
            results.append(TestResult(test.name, False, f"not run: {skip}", 0.0, hidden))
            continue
        limits = config.limits_for(reference.get(test.name))  # None: the session's
        if spec.run_pids:  # a runtime's thread pool (JVM, go): its floor on processes
            limits = run_limits_for(limits or config.limits, spec)
        r = await cand.exec(list(run), stdin=test.stdin, env=env, limits=limits)
        runs.append(r)
        if r.status is ExecStatus.INFRA:
            raise _Excluded(Outcome.INFRA, f"candidate sandbox: {r.message}")
        failed = await _verdict(task, test, hidden, r, checker)
        results.append(TestResult(test.name, failed is None, failed or "", r.wall_ms, hidden))
        if r.status is ExecStatus.TIMEOUT and config.stop_on_timeout:
            skip = f"{test.name} timed out"
    return tuple(results), ""


def _none_ran(tests: Sequence[tuple[TestCase, bool]],
              message: str) -> tuple[tuple[TestResult, ...], str]:
    return tuple(TestResult(t.name, False, "not run: the program did not build", 0.0, h)
                 for t, h in tests), message


async def _verdict(task: Task, test: TestCase, hidden: bool, r: ExecResult,
                   checker: _Checker) -> str | None:
    """None when the test passed, else why it failed."""
    if r.status is ExecStatus.TIMEOUT:
        return f"timeout: {r.message}" if r.message else "timeout"
    if r.status is ExecStatus.MEMORY:
        return f"memory: {r.message}" if r.message else "memory"
    if r.status is ExecStatus.OUTPUT:
        return "output limit: wrote more than the sandbox keeps"
    if r.status is ExecStatus.DISK:
        return "disk full"
    if r.status is ExecStatus.SIGNAL:
        return f"crashed: {r.message or f'killed by signal {r.signal}'}"
    if r.status is ExecStatus.EXIT:
        # A crash is a failure whatever was printed before it; say so when the output
        # was right (the checker is not consulted for a crashed run).
        right = task.compare is not Compare.CHECKER and compare_output(
            task.compare, test.expected, r.stdout, task.float_tol) is None
        tail = r.stderr_text.strip()[-300:]
        return (f"crashed: exited with status {r.exit_code}"
                + (" (its output was correct)" if right else "")
                + (f": {tail}" if tail and not hidden else ""))
    if task.compare is Compare.CHECKER:
        return await checker.verdict(test, hidden, r.stdout)
    why = compare_output(task.compare, test.expected, r.stdout, task.float_tol)
    if why is None:
        return None
    if hidden:
        return f"wrong answer: {why}"
    return (f"wrong answer: {why}; expected {_snip(test.expected)}, got {_snip(r.stdout)}")


def _snip(data: bytes) -> str:
    return repr(data[:_SNIPPET]) + ("…" if len(data) > _SNIPPET else "")


# --------------------------------------------------------------------------- comparing

def compare_output(mode: Compare, expected: bytes, actual: bytes,
                   float_tol: float = 1e-6) -> str | None:
    """None when `actual` matches `expected` under `mode`, else where it differs (never
    what was expected). CHECKER cannot be decided here.

    >>> compare_output(Compare.WHITESPACE, b"1 2\\n", b"1  2")
    >>> compare_output(Compare.FLOAT, b"0.3333333", b"0.33333334", 1e-6)
    >>> compare_output(Compare.EXACT, b"3\\n", b"3")
    'output differs at byte 1 (got 1 bytes)'
    """
    if mode is Compare.EXACT:
        if actual == expected:
            return None
        at = next((i for i, (a, b) in enumerate(zip(expected, actual, strict=False))
                   if a != b), min(len(expected), len(actual)))
        return f"output differs at byte {at} (got {len(actual)} bytes)"
    if mode is Compare.CHECKER:
        raise UsageError("compare_output cannot decide CHECKER; run the task's checker")
    want, got = expected.split(), actual.split()
    if len(want) != len(got):
        return f"wrong number of tokens (got {len(got)})"
    same = _same_float if mode is Compare.FLOAT else _same_token
    for i, (w, g) in enumerate(zip(want, got, strict=True)):
        if not same(w, g, float_tol):
            return f"token {i + 1} differs"
    return None


def _same_token(want: bytes, got: bytes, _tol: float) -> bool:
    return want == got


def _same_float(want: bytes, got: bytes, tol: float) -> bool:
    """The FLOAT rule, decided by how the *expected* token is spelt (docs/judge.md):

    * an integer (`[+-]?digits`) is compared exactly, by value: `got` must be a number
      equal to it with no tolerance (`1000000000007` is not `1000000000000`; `+5`,
      `005`, `5.0` and `5e0` are `5`; `-0` is `0`);
    * a decimal with a point or an exponent (`2.50`, `.5`, `1e-9`) is compared within
      `tol`, absolute or relative to the expected value; `got` may be any finite number;
    * anything else — hex (`0x1A`), `inf`, `nan`, `1_0`, words — only as the same bytes.

    Numbers are recognised by their spelling, never by `float()` alone (which would take
    "nan", "inf", "1_0" and " 1"), and a number that overflows a float is compared only
    as the same bytes."""
    if want == got:
        return True
    if not (_NUMBER.fullmatch(want) and _NUMBER.fullmatch(got)):
        return False
    if _INTEGER.fullmatch(want):
        return _decimal_parts(want) == _decimal_parts(got)
    w, g = float(want), float(got)
    if not (math.isfinite(w) and math.isfinite(g)):
        return False
    return abs(w - g) <= tol or abs(w - g) <= tol * abs(w)


def _decimal_parts(token: bytes) -> tuple[bool, bytes, int] | None:
    """A number's exact value as (negative, significant digits, power of ten): equal
    parts, equal values; zero is (False, b"", 0). Linear in the token, no big-number
    arithmetic (a 10**6-digit token or an exponent of 10**30 costs no more than its
    bytes). None for an exponent too large to name any value a token could equal."""
    m = _PARTS.fullmatch(token)
    if m is None:
        return None
    sign, whole, frac, exp = m.group(1), m.group(2) or b"", m.group(3) or b"", m.group(4)
    digits = (whole + frac).lstrip(b"0")
    if not digits:
        return (False, b"", 0)
    if exp and len(exp.lstrip(b"+-0")) > 18:
        return None
    power = (int(exp) if exp else 0) - len(frac)
    stripped = digits.rstrip(b"0")
    return (sign == b"-", stripped, power + len(digits) - len(stripped))


# --------------------------------------------------------------------------- checker

class _Checker:
    """The task's trusted checker in a session of its own, opened at first use and shared
    by the attempt's tests (only its data files change between them)."""

    def __init__(self, task: Task, pool: SandboxProvider, limits: Limits):
        self.task, self.pool, self.limits = task, pool, limits
        self.sb: Sandbox | None = None

    async def run(self, test: TestCase, actual: bytes) -> ExecResult:
        if self.sb is None:
            self.sb = await self.pool.open(self.limits)
            await self.sb.write_file("checker.py", self.task.checker.encode(
                "utf-8", errors="surrogateescape"))
        for name, data in (("input", test.stdin), ("expected", test.expected),
                           ("actual", actual)):
            await self.sb.write_file(name, data)
        r = await self.sb.exec(["python3", "checker.py", "input", "expected", "actual"])
        if r.status is ExecStatus.INFRA:
            raise _Excluded(Outcome.INFRA, f"checker sandbox: {r.message}")
        return r

    async def verdict(self, test: TestCase, hidden: bool, actual: bytes) -> str | None:
        r = await self.run(test, actual)
        if r.ok:
            return None
        if r.status is ExecStatus.EXIT and _TRACEBACK not in r.stderr:
            said = (r.stderr_text.strip() or r.stdout_text.strip())[-300:]
            return "wrong answer: rejected by the checker" + (
                f": {said}" if said and not hidden else "")
        # The checker crashed (or ran out of time or memory). If it does so on the task's
        # own expected output too, the task is broken: excluded. If only on this output,
        # the output is what it could not read: the candidate's failure (otherwise a
        # program could dodge a 0 by printing garbage).
        own = await self.run(test, test.expected)
        if not own.ok:
            raise _Excluded(Outcome.ERROR, (
                f"the task's checker is broken: on {test.name}'s expected output it "
                f"ended with {own.status.value} {own.message}: "
                f"{own.stderr_text.strip()[-1000:]}").strip())
        return (f"wrong answer: the checker could not read the output "
                f"({r.status.value}{' ' + r.message if r.message else ''})")

    async def close(self) -> None:
        if self.sb is not None:
            await self.sb.close()


# --------------------------------------------------------------------------- grading

def _outcome(results: tuple[TestResult, ...], runs: list[ExecResult], message: str) -> Outcome:
    """Mirrors function.py: PASSED only if every test passed; MEMORY when the candidate
    hit its memory limit, TIMEOUT when a test ran out of time, FAILED otherwise."""
    if message:  # the program never ran
        return Outcome.FAILED
    if results and all(r.passed for r in results):
        return Outcome.PASSED
    if any(r.status is ExecStatus.MEMORY for r in runs):
        return Outcome.MEMORY
    if any(r.status is ExecStatus.TIMEOUT for r in runs):
        return Outcome.TIMEOUT
    return Outcome.FAILED


def _first_failure(results: tuple[TestResult, ...]) -> str:
    first = next((r for r in results if not r.passed), None)
    return f"{first.name}: {first.message}" if first else ""


def _grade(task: Task, outcome: Outcome, results: tuple[TestResult, ...], message: str,
           runs: list[ExecResult], t0: float) -> Grade:
    common: dict[str, Any] = {
        "wall_ms": round((time.monotonic() - t0) * 1e3, 3),
        "candidate_cpu_ms": sum(r.cpu_ms for r in runs),
        "candidate_peak_memory_bytes": max((r.peak_memory_bytes for r in runs), default=0)}
    return Grade(task.task_id, outcome, tests=results, message=message[:4000], **common)


def _with_flags(grade: Grade, source: str, spec: Language, runs: list[ExecResult]) -> Grade:
    """Record what the detectors saw as notable flags: the static scan on Python sources
    (the whole source is the candidate's: no trusted prefix), the output scan on stderr
    only (stdout is the answer). They change nothing else: the evidence is stdout,
    compared outside the candidate's sandbox, so no act inside it — a signal handler, an
    alarm, a read of /proc/self/fd/0 — can reach it; only a canary's pass is CHEAT
    (`canary_check`). An attempt that broke its own session is proven so by the
    control (retry.py), flagged or not."""
    flags: list[Flag] = []
    if spec.name == "python":
        flags += [f for f in static_scan(source) if f.detector not in _NORMAL_IN_PROGRAMS]
    for r in runs:
        flags += dynamic_scan(b"", r.stderr)
    return noted(grade, flags)
