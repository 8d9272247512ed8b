"""An environment class for TRL's `GRPOTrainer(environment_factory=...)`: the model
solves a code task with tools — run its code, check it against the visible tests — in a
sandbox session of its own, and the trusted judge's grade of its last checked answer is
the reward (`get_reward`).

    from functools import partial
    from trialbox.integrations.trl_env import TrialboxToolEnv
    GRPOTrainer(model=..., environment_factory=partial(TrialboxToolEnv, "humaneval"),
                train_dataset=ds, ...)        # ds rows carry `task_id` (or a `task` row)

TRL builds instances once and reuses them: `reset(**row)` starts a rollout (the previous
one's session, if still open, is released), each public method is a tool (its docstring
is the schema TRL shows the model: so the class has no other public method), and
`get_reward()` ends it — grades, releases the session, and returns 1.0 / 0.0, or None
when the machinery failed (TRL skips it). All instances share this process's judge pool
(`grader.shared_grader`) unless given one.
"""

from __future__ import annotations

import weakref
from typing import Any

from trialbox.errors import InfraError, UsageError
from trialbox.integrations.grader import (
    ThreadedGrader,
    answer_of,
    resolve_task,
    reward_of,
    shared_grader,
    task_index,
)
from trialbox.judge.seeds import FINAL, TURN
from trialbox.rollout.text import clip, exec_summary, feedback_report
from trialbox.sandbox.languages import run_code
from trialbox.sandbox.namespace import NamespaceSandbox
from trialbox.types import ExecResult, ExecStatus, Grade, Limits, Task, TaskKind

__all__ = ["TrialboxToolEnv"]

_OUTPUT_CHARS = 2000


def _close_session(runner: ThreadedGrader, holder: list[NamespaceSandbox]) -> None:
    while holder:
        sb = holder.pop()
        if not runner.thread.closed:
            runner.thread.call(sb.close())


class TrialboxToolEnv:
    """One rollout's environment (see the module docstring). `tasks`: the task set the
    rows' `task_id`s name; `grader`: a ThreadedGrader to use instead of the shared one."""

    def __init__(self, tasks: Any = "humaneval", *, grader: ThreadedGrader | None = None,
                 limits: Limits | None = None):
        self._tasks = task_index(tasks)
        self._runner = grader if grader is not None else shared_grader()
        self._limits = limits or Limits(wall_s=5, cpu_s=5, memory_mb=256)
        self._task: Task | None = None
        self._answer: str | None = None
        self._grade: Grade | None = None
        self._session: list[NamespaceSandbox] = []  # 0 or 1; a list so GC can close it
        self._finalizer = weakref.finalize(self, _close_session, self._runner, self._session)

    # ------------------------------------------------------------------ TRL's protocol

    def reset(self, **row: Any) -> str | None:
        """A new rollout for the row's task (`task_id`, or a whole `task` row)."""
        self._release()
        ref = row.get("task_id", row.get("task"))
        if ref is None:
            raise UsageError("a TrialboxToolEnv row needs a 'task_id' (or 'task') column; "
                             f"this one has {sorted(row)}")
        self._task = resolve_task(self._tasks, ref, "reset")
        if self._task.kind not in (TaskKind.FUNCTION, TaskKind.STDIO):
            raise UsageError(f"{self._task.task_id}: TrialboxToolEnv runs function and stdio "
                             f"tasks, not {self._task.kind.value!r} ones")
        self._answer, self._grade = None, None
        return None

    def get_reward(self) -> float | None:
        """The judge's reward for the last answer checked with `run_tests` (0.0 when none
        was): graded once more, with the final-domain seed no `run_tests` saw
        (judge/seeds.py) — checking until "accepted" cannot sample a randomised task's
        hidden tests until lucky. Ends the rollout and releases its session."""
        task = self._require_task()
        try:
            self._grade = self._runner.grade_all([(task, self._answer or "")],
                                                 domain=FINAL)[0]
            return reward_of(self._grade)
        finally:
            self._release()

    # ------------------------------------------------------------------ tools

    def run_code(self, code: str) -> str:
        """Run a Python program in your sandbox and see what it prints.

        Args:
            code: The whole Python program to run.

        Returns:
            The run's status, then its standard output and standard error.
        """
        self._require_task()
        if not isinstance(code, str):
            return "Error: code must be a string."
        r = self._runner.thread.call(self._exec(code))
        out = r.stdout.decode(errors="replace")
        return clip(f"{r.status.value}\n{out}" + (f"\n{exec_summary(r)}" if not r.ok else ""),
                     _OUTPUT_CHARS)

    def run_tests(self, solution: str) -> str:
        """Check a solution with the trusted judge; your last checked solution is graded.

        Args:
            solution: The whole solution: the complete function, or the whole program.

        Returns:
            Whether it is accepted, and the failures of the tests you may see.
        """
        task = self._require_task()
        if not isinstance(solution, str):
            return "Error: solution must be a string."
        self._answer = answer_of(task, f"```python\n{solution}\n```") \
            if "```" not in solution else answer_of(task, solution)
        checked = self._runner.grade_all([(task, self._answer)], domain=TURN)[0]
        if checked.passed:
            return "The solution is accepted."
        return feedback_report(task, self._answer, None, checked, _OUTPUT_CHARS)

    # ------------------------------------------------------------------ plumbing

    def _require_task(self) -> Task:
        if self._task is None:
            raise UsageError("reset(**row) first: TRL calls it before each rollout")
        return self._task

    async def _exec(self, code: str) -> ExecResult:
        try:
            if not self._session:
                pool = await self._grader_pool()
                self._session.append(await NamespaceSandbox.open(pool, self._limits))
            return await run_code(self._session[0], code, "python", limits=self._limits)
        except InfraError as e:
            return ExecResult(ExecStatus.INFRA, message=f"the sandbox: {e}")

    async def _grader_pool(self) -> Any:
        pool = getattr(self._runner.grader, "pool", None)
        if pool is None:
            raise UsageError("run_code needs a trialbox Grader (with a pool) behind the env")
        return await pool()

    def _release(self) -> None:
        _close_session(self._runner, self._session)
