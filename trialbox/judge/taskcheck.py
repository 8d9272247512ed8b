"""A task is validated before it is trusted (DESIGN.md, decision 9): `trialbox tasks check`.

A broken task scores every answer 0 — a gradient against good code, silently, at scale —
or every answer 1. So a task set is checked before it is used, and a task that fails is
refused with the reason, naming the field to change:

    static (no sandbox; also run whenever eval or train loads a task set: `static_problems`)
      function  the prompt parses; it defines `entry_point`; every `candidate(...)` call in
                the tests binds to the signature the prompt declares
      stdio     every test has expected output (or the task a checker); a `checker`
                task has one
      repo      there are tests to run
    judged (real sandboxes, `check_task`)
      function  the reference passes, `repeats` times with independent seeds (so it is
                deterministic); a trivial answer (`pass`: returns None) fails
      stdio     the reference passes `repeats` times; a program printing each test's
                own expected output passes (the comparison or checker accepts the right
                answer); programs printing nothing, a perturbed answer (a digit or a
                letter changed) or `nan` for the first number fail (it rejects wrong
                ones — a checker that accepts everything is caught here)
      repo      the reference (a diff) passes `repeats` times; the untouched starting tree
                fails (else there is nothing to fix)

`TaskProblem.field` names what to change. A task without a reference (no
`canonical_solution`) cannot show it is passable: that is a problem too.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import re
from collections.abc import Sequence
from dataclasses import dataclass

from trialbox.errors import InfraError, UsageError
from trialbox.judge.grade import grade
from trialbox.judge.seeds import derive_seed
from trialbox.sandbox.base import SandboxProvider
from trialbox.types import Compare, Grade, Outcome, Task, TaskKind

TRIVIAL_BODY = "    pass\n"
"""A function answer that does nothing (returns None)."""


@dataclass(frozen=True)
class TaskCheckConfig:
    """How hard `check_task` looks."""

    repeats: int = 3
    """Gradings of the reference, each with its own seed; all must pass."""

    def __post_init__(self) -> None:
        if isinstance(self.repeats, bool) or not isinstance(self.repeats, int) \
                or self.repeats < 1:
            raise UsageError(f"TaskCheckConfig.repeats must be an int >= 1, got "
                             f"{self.repeats!r}")


@dataclass(frozen=True)
class TaskProblem:
    """Why a task cannot be trusted."""

    task_id: str
    field: str
    """The task's field to change (prompt, entry_point, hidden_tests, checker, ...)."""
    message: str

    def __str__(self) -> str:
        return f"task {self.task_id!r}, field {self.field!r}: {self.message}"


# --------------------------------------------------------------------------- static

def static_problems(task: Task) -> list[TaskProblem]:
    """What is wrong with `task` that reading it shows (no sandbox)."""
    if task.kind is TaskKind.FUNCTION:
        return _function_static(task)
    if task.kind is TaskKind.STDIO:
        out = []
        if task.compare is Compare.CHECKER and not task.checker:
            out.append(TaskProblem(task.task_id, "checker", "compare is 'checker' but the "
                                   "task has no checker program"))
        if not (task.hidden_tests or task.visible_tests):
            out.append(TaskProblem(task.task_id, "hidden_tests", "no tests: nothing can "
                                   "pass or fail"))
        return out
    if not (task.test_files or task.hidden_test_files or task.test_command):
        return [TaskProblem(task.task_id, "test_files", "no tests to run")]
    return []


def _parse_prompt(task: Task) -> ast.Module | None:
    for tail in ("", TRIVIAL_BODY, task.canonical_solution):
        try:
            return ast.parse(task.prompt + tail)
        except SyntaxError:
            continue
    return None


def _function_static(task: Task) -> list[TaskProblem]:
    tid = task.task_id
    if not task.entry_point:
        return [TaskProblem(tid, "entry_point", "empty: name the function the tests call")]
    module = _parse_prompt(task)
    if module is None:
        return [TaskProblem(tid, "prompt", "does not parse as Python (even with a body "
                            "added)")]
    defs = {n.name: n for n in module.body
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    names = set(defs) | {t.id for n in module.body if isinstance(n, ast.Assign)
                         for t in n.targets if isinstance(t, ast.Name)}
    if task.entry_point not in names:
        return [TaskProblem(tid, "entry_point", f"{task.entry_point!r} is not defined by "
                            f"the prompt (it defines: {', '.join(sorted(names)) or 'nothing'}"
                            "); every answer would fail")]
    node = defs.get(task.entry_point)
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return []
    sig = _signature(node.args)
    out = []
    for t in (*task.hidden_tests, *task.visible_tests):
        try:
            tree = ast.parse(t.code)
        except SyntaxError as e:
            out.append(TaskProblem(tid, "hidden_tests", f"test {t.name!r} is not valid "
                                   f"Python: {e.msg} (line {e.lineno})"))
            continue
        for call in ast.walk(tree):
            if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)
                    and call.func.id == "candidate"):
                continue
            if any(isinstance(a, ast.Starred) for a in call.args) or any(
                    k.arg is None for k in call.keywords):
                continue  # *args / **kwargs: the count is known only when it runs
            try:
                sig.bind(*call.args, **{k.arg: None for k in call.keywords if k.arg})
            except TypeError as e:
                out.append(TaskProblem(tid, "hidden_tests", f"test {t.name!r} calls "
                                       f"{ast.unparse(call)[:80]} but the prompt declares "
                                       f"{task.entry_point}{sig}: {e}"))
                break
    return out


def _signature(args: ast.arguments) -> inspect.Signature:
    """The signature `args` declares (defaults as placeholders: only binding matters)."""
    P = inspect.Parameter
    positional = [*args.posonlyargs, *args.args]
    first_default = len(positional) - len(args.defaults)
    params = [P(a.arg, P.POSITIONAL_ONLY if i < len(args.posonlyargs)
                else P.POSITIONAL_OR_KEYWORD,
                default=None if i >= first_default else P.empty)
              for i, a in enumerate(positional)]
    if args.vararg is not None:
        params.append(P(args.vararg.arg, P.VAR_POSITIONAL))
    params += [P(a.arg, P.KEYWORD_ONLY, default=P.empty if d is None else None)
               for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)]
    if args.kwarg is not None:
        params.append(P(args.kwarg.arg, P.VAR_KEYWORD))
    return inspect.Signature(params)


# --------------------------------------------------------------------------- judged

async def check_task(task: Task, provider: SandboxProvider,
                     config: TaskCheckConfig | None = None) -> list[TaskProblem]:
    """Every problem with `task`: the static ones, then (when there are none) the judged
    ones, on `provider`'s real sandboxes."""
    config = config or TaskCheckConfig()
    problems = static_problems(task)
    if problems:
        return problems
    if task.kind is TaskKind.FUNCTION:
        return await _function_judged(task, provider, config)
    if task.kind is TaskKind.STDIO:
        return await _stdio_judged(task, provider, config)
    problems = await _reference(task, provider, config)
    g = await grade(task, {}, provider)
    if g.passed:
        problems.append(TaskProblem(task.task_id, "files", "the untouched starting tree "
                                    "passes its tests: there is nothing to fix"))
    return problems


def _said(g: Grade) -> str:
    return f"{g.outcome.value}" + (f" ({g.message[:200]})" if g.message else "")


async def _reference(task: Task, provider: SandboxProvider, config: TaskCheckConfig,
                     **kw: object) -> list[TaskProblem]:
    if not task.canonical_solution:
        return [TaskProblem(task.task_id, "canonical_solution", "no reference: add one so "
                            "the task can show it is passable")]
    code = task.canonical_solution
    seeds = [derive_seed(task.task_id, code, f"check:{i}") for i in range(config.repeats)] \
        if task.kind is TaskKind.FUNCTION else [None] * config.repeats
    grades = list(await asyncio.gather(*(grade(task, code, provider, seed=s, **kw)  # type: ignore[arg-type]
                                         for s in seeds)))
    if any(g.outcome in (Outcome.INFRA,) for g in grades):
        bad = next(g for g in grades if g.outcome is Outcome.INFRA)
        raise InfraError(f"{task.task_id}: the machinery failed while checking the "
                              f"reference: {bad.message}")
    passed = sum(g.passed for g in grades)
    if passed == len(grades):
        return []
    worst = next(g for g in grades if not g.passed)
    if passed == 0:
        return [TaskProblem(task.task_id, "canonical_solution", f"the reference does not "
                            f"pass: {_said(worst)}")]
    return [TaskProblem(task.task_id, "hidden_tests", f"the reference passed {passed} of "
                        f"{len(grades)} gradings with different seeds: the tests are not "
                        f"deterministic ({_said(worst)})")]


async def _function_judged(task: Task, provider: SandboxProvider,
                           config: TaskCheckConfig) -> list[TaskProblem]:
    problems = await _reference(task, provider, config)
    trivial = await grade(task, TRIVIAL_BODY, provider)
    if trivial.passed:
        problems.append(TaskProblem(task.task_id, "hidden_tests", "a trivial answer "
                                    "(`pass`: returns None) passes: the tests check nothing"))
    return problems


def _oracle(task: Task, outputs: dict[bytes, bytes]) -> str:
    """A Python program that prints, for each test's stdin, `outputs[stdin]`."""
    return ("import sys\nanswers = " + repr(outputs) + "\n"
            "sys.stdout.buffer.write(answers.get(sys.stdin.buffer.read(), b''))\n")


_NUMBER = re.compile(rb"-?\d+(?:\.\d+)?")


def _perturbed(expected: bytes) -> bytes:
    """`expected` with one visible change: its last digit, else its first letter, else
    one more line."""
    digits = [m.end() - 1 for m in re.finditer(rb"\d", expected)]
    if digits:
        i = digits[-1]
        d = expected[i] - ord("0")
        return expected[:i] + bytes([ord("0") + (d + 1) % 10]) + expected[i + 1:]
    m = re.search(rb"[A-Za-z]", expected)
    if m:
        c = expected[m.start():m.start() + 1]
        swapped = c.lower() if c.isupper() else c.upper()
        if swapped == c:
            swapped = b"x" if c != b"x" else b"y"
        return expected[:m.start()] + swapped + expected[m.end():]
    return expected + b"\nextra\n"


def _nan(expected: bytes) -> bytes | None:
    m = _NUMBER.search(expected)
    return None if m is None else expected[:m.start()] + b"nan" + expected[m.end():]


async def _stdio_judged(task: Task, provider: SandboxProvider,
                        config: TaskCheckConfig) -> list[TaskProblem]:
    problems = await _reference(task, provider, config, language="python")
    tests = [*task.hidden_tests, *task.visible_tests]
    expected = {t.stdin: t.expected for t in tests}
    if len(expected) < len(tests):  # one stdin, two answers: the oracle cannot tell them
        return problems
    field = "checker" if task.compare is Compare.CHECKER else "compare"
    right = await grade(task, _oracle(task, expected), provider, language="python")
    if not right.passed:
        problems.append(TaskProblem(task.task_id, field, f"the tests' own expected output "
                                    f"is not accepted: {_said(right)}"))
    wrongs = {"an empty output": {k: b"" for k in expected},
              "a perturbed output (one character changed)":
                  {k: _perturbed(v) for k, v in expected.items()}}
    nans = {k: _nan(v) for k, v in expected.items()}
    if all(v is not None for v in nans.values()):
        wrongs["nan for the first number"] = {k: v or b"" for k, v in nans.items()}
    for what, outputs in wrongs.items():
        if all(outputs[k] == expected[k] for k in expected):
            continue  # the expected output is already empty: not a wrong answer
        g = await grade(task, _oracle(task, outputs), provider, language="python")
        if g.passed:
            problems.append(TaskProblem(task.task_id, field, f"{what} is accepted: the "
                                        "comparison accepts wrong answers"))
    return problems


async def check_tasks(tasks: Sequence[Task], provider: SandboxProvider, *,
                      config: TaskCheckConfig | None = None,
                      workers: int = 4) -> dict[str, list[TaskProblem]]:
    """`check_task` of every task, `workers` at once: {task_id: problems} in order."""
    slots = asyncio.Semaphore(workers)

    async def one(task: Task) -> list[TaskProblem]:
        async with slots:
            return await check_task(task, provider, config)
    found = await asyncio.gather(*(one(t) for t in tasks))
    return {t.task_id: p for t, p in zip(tasks, found, strict=True)}


def refuse_broken(tasks: Sequence[Task], where: str) -> None:
    """Raise `UsageError` naming every task whose static check fails (what eval and
    train run on loading a task set)."""
    problems = [p for t in tasks for p in static_problems(t)]
    if problems:
        shown = "\n  ".join(map(str, problems[:20]))
        more = f"\n  … and {len(problems) - 20} more" if len(problems) > 20 else ""
        raise UsageError(f"{where}: {len(problems)} task problem(s); fix the task set "
                         f"(`trialbox tasks check` runs every check):\n  {shown}{more}")
