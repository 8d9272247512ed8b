"""A gym-style multi-turn code environment — the interface SkyRL-Gym, rLLM, GEM and ROLL
step through:

    env = CodeEnv("humaneval", EnvConfig(max_turns=3))
    obs, info = env.reset(seed=0)                   # the task's prompt (visible tests only)
    obs, reward, terminated, truncated, info = env.step(model_text)
    env.close()

An action is the model's text; its last ```python block is the code (or the whole text,
a completion continuing the prompt). Each step runs that code in the episode's own
sandbox session (function tasks: the prompt plus the code as solution.py; stdio tasks:
the program on the first visible test's input) and grades it with the trusted judge, at
the same time. The observation is the feedback the agent loop gives
(`rollout.text.feedback_report`: the run's status and stderr, the visible tests'
failures, never a hidden test; `ACCEPTED` on a pass). `terminated` when the judge passes
the answer; `truncated` at `max_turns` without a pass. The reward is the judge's (1.0
pass, 0.0 otherwise): at the episode's end only (`reward="final"`, 0.0 on earlier steps)
or on every step (`reward="step"`). When the machinery failed (trialbox's reward None)
the step's reward is 0.0 and `info["excluded"]` is True: leave that episode out of
training.

One session per episode: opened by `reset`, released when the episode ends, on the next
`reset`, on `close()`, and (sync env) when the env is garbage-collected.
`AsyncCodeEnv` has the same methods as coroutines, for async trainers.
"""

from __future__ import annotations

import asyncio
import random
import weakref
from dataclasses import dataclass, field
from typing import Any

from trialbox.errors import InfraError, UsageError
from trialbox.integrations.grader import (
    Grader,
    GraderConfig,
    LoopThread,
    answer_of,
    grade_seeded,
    resolve_task,
    reward_of,
    task_index,
)
from trialbox.judge.answer import read_code
from trialbox.judge.seeds import ends_episode, turn_grade
from trialbox.rollout.text import default_prompt, feedback_report
from trialbox.sandbox.languages import run_code
from trialbox.sandbox.namespace import NamespaceSandbox
from trialbox.types import ExecResult, ExecStatus, Grade, Limits, Task, TaskKind

__all__ = ["AsyncCodeEnv", "CodeEnv", "EnvConfig"]

Step = tuple[str, float, bool, bool, dict[str, Any]]
ACCEPTED = "The solution is accepted."
"""The observation of the step that passes (the episode terminates)."""


@dataclass(frozen=True)
class EnvConfig:
    """One environment's settings."""

    max_turns: int = 3
    """Steps per episode; the last one without a pass is `truncated`."""
    reward: str = "final"
    """"final": the judge's reward on the episode's last step, 0.0 before;
    "step": the judge's reward on every step."""
    feedback_chars: int = 2000
    """Longest feedback observation, in characters."""
    execute: bool = True
    """Run each step's code in the episode's session (stderr and crashes in the
    feedback); False: only grade it."""
    exec_limits: Limits = field(default_factory=lambda: Limits(wall_s=5, cpu_s=5,
                                                               memory_mb=256))
    """Limits of the episode's own runs."""
    language: str = "python"
    """The language of stdio programs."""

    def __post_init__(self) -> None:
        if isinstance(self.max_turns, bool) or not isinstance(self.max_turns, int) \
                or self.max_turns < 1:
            raise UsageError(f"EnvConfig.max_turns must be an int >= 1, got {self.max_turns!r}")
        if self.reward not in ("final", "step"):
            raise UsageError(f"EnvConfig.reward must be 'final' or 'step', got {self.reward!r}")
        if self.feedback_chars < 100:
            raise UsageError(f"EnvConfig.feedback_chars must be >= 100, got "
                             f"{self.feedback_chars!r}")


class AsyncCodeEnv:
    """The environment for async callers; its judge binds to the loop it is first used
    on. `grader`: share one Grader among many envs (it is then not closed by `close`)."""

    def __init__(self, tasks: Any = "humaneval", config: EnvConfig | None = None, *,
                 grader: Grader | None = None):
        self.config = config or EnvConfig()
        self.tasks = task_index(tasks)
        if not self.tasks:
            raise UsageError("the environment needs at least one task")
        self._own_grader = grader is None
        self.grader = grader if grader is not None else \
            Grader(GraderConfig(workers=1, language=self.config.language))
        self.rng = random.Random()
        self.task: Task | None = None
        self.session: NamespaceSandbox | None = None
        self.turn = 0
        self.done = True

    async def reset(self, seed: int | None = None,
                    options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Start an episode: options {"task_id": ...} or {"task": row} picks the task,
        else one is drawn (from `seed`'s generator, when given). Releases the previous
        episode's session and opens this one's."""
        if seed is not None:
            self.rng.seed(seed)
        await self._release()
        options = options or {}
        if "task" in options or "task_id" in options:
            self.task = resolve_task(self.tasks, options.get("task", options.get("task_id")),
                                     "reset(options=...)")
        else:
            self.task = self.tasks[self.rng.choice(sorted(self.tasks))]
        if self.task.kind not in (TaskKind.FUNCTION, TaskKind.STDIO):
            raise UsageError(f"{self.task.task_id}: the environment runs function and stdio "
                             f"tasks, not {self.task.kind.value!r} ones")
        self.turn, self.done = 0, False
        if self.config.execute:
            pool = await self.grader.pool()
            self.session = await NamespaceSandbox.open(pool, self.config.exec_limits)
        return default_prompt(self.task), {"task_id": self.task.task_id,
                                           "max_turns": self.config.max_turns}

    async def step(self, action: str) -> Step:
        """One turn: run and grade the action's code; (feedback, reward, terminated,
        truncated, info)."""
        if self.task is None or self.done:
            raise UsageError("step() needs a running episode: call reset() first (and "
                             "again after an episode terminated or was truncated)")
        if not isinstance(action, str):
            raise UsageError(f"an action is the model's text (str), got {type(action).__name__}")
        task, cfg = self.task, self.config
        self.turn += 1
        last = self.turn >= cfg.max_turns
        code, _ = read_code(task, action, language=cfg.language)
        run: ExecResult | None = None
        grade: Grade | None = None
        if code is not None:  # the episode's own run and the judge's, concurrently
            answer = answer_of(task, action, language=cfg.language)
            run, grade = await asyncio.gather(self._run(task, code), turn_grade(
                lambda seed: grade_seeded(self.grader, task, answer, seed), task, answer,
                last=last))
        elif last:  # a last turn without code is graded as the empty answer
            grade = await self.grader.grade(task, "")
        passed = grade is not None and grade.passed
        # a turn's pass ends the episode; its reward is the final grading (seeds.py)
        ended = grade is not None and ends_episode(grade)
        terminated, truncated = ended, last and not ended
        value = reward_of(grade) if grade is not None else 0.0
        excluded = grade is not None and value is None
        if cfg.reward == "step" or terminated or truncated:
            reward = value or 0.0
        else:
            reward = 0.0
        # feedback_report speaks to a model that must try again; a pass ends the episode
        observation = ACCEPTED if passed else \
            feedback_report(task, code, run, grade, cfg.feedback_chars)
        info: dict[str, Any] = {
            "task_id": task.task_id, "turn": self.turn, "grade": grade,
            "outcome": grade.outcome.value if grade is not None else None,
            "passed": passed, "excluded": excluded, "run": run}
        if terminated or truncated:
            self.done = True
            await self._release()
        return observation, reward, terminated, truncated, info

    async def _run(self, task: Task, code: str) -> ExecResult | None:
        sb = self.session
        if sb is None:
            return None
        try:
            if task.kind is TaskKind.FUNCTION:
                solution = task.prompt + answer_of(task, code)
                try:
                    await sb.write_file("solution.py", solution.encode(errors="surrogateescape"))
                except UsageError as e:  # too large, or the path was made a directory
                    return ExecResult(ExecStatus.EXIT, message=str(e))
                return await sb.exec(["python3", "solution.py"], limits=self.config.exec_limits)
            stdin = task.visible_tests[0].stdin if task.visible_tests else b""
            return await run_code(sb, code, self.config.language, stdin=stdin,
                                  limits=self.config.exec_limits)
        except InfraError as e:
            return ExecResult(ExecStatus.INFRA, message=f"the episode's sandbox: {e}")

    async def _release(self) -> None:
        sb, self.session = self.session, None
        if sb is not None:
            await sb.close()

    async def close(self) -> None:
        """End the episode (its session released) and, if this env made its own judge,
        close it. Idempotent."""
        self.done = True
        try:
            await self._release()
        finally:
            if self._own_grader:
                await self.grader.close()

    async def __aenter__(self) -> AsyncCodeEnv:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _close_on(thread: LoopThread, env: AsyncCodeEnv) -> None:
    """Release `env` (session and judge) on its loop, then stop the loop's thread."""
    try:
        if not thread.closed:
            thread.call(env.close())
    finally:
        thread.close()


class CodeEnv:
    """The environment for synchronous callers: an `AsyncCodeEnv` on a loop of its own
    thread. Released by `close()`, `with`, or garbage collection."""

    def __init__(self, tasks: Any = "humaneval", config: EnvConfig | None = None):
        self._thread = LoopThread("trialbox-env")
        self.env = AsyncCodeEnv(tasks, config)
        self._finalizer = weakref.finalize(self, _close_on, self._thread, self.env)

    @property
    def config(self) -> EnvConfig:
        return self.env.config

    @property
    def task(self) -> Task | None:
        return self.env.task

    def reset(self, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        return self._thread.call(self.env.reset(seed=seed, options=options))

    def step(self, action: str) -> Step:
        return self._thread.call(self.env.step(action))

    def close(self) -> None:
        self._finalizer()

    def __enter__(self) -> CodeEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

