"""The judge the integrations share: one CellPool and a few reusable harness sessions,
kept across calls, released by `close()` (or by leaving the context manager).

`Grader` is async and binds to the event loop of its first call; `ThreadedGrader` gives
the same to synchronous callers, on an event loop of its own thread. Both grade a task
and a completion into trialbox's own `Grade` — the same judges `trialbox eval` uses —
and `reward_of(grade)` turns it into 1.0 / 0.0, or None when the machinery failed.

A grader is anything with `async grade(task, completion) -> Grade` (`GradeFn`): tests of
the layers above pass a fake.
"""

from __future__ import annotations

import asyncio
import atexit
import threading
from collections.abc import Awaitable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from trialbox.errors import InfraError, UsageError
from trialbox.judge.answer import answer_of
from trialbox.judge.evaluate import reward_of
from trialbox.judge.function import JudgeConfig, judge_pool_config, open_harness
from trialbox.judge.grade import grade
from trialbox.judge.seeds import seed_of
from trialbox.judge.stdio import StdioJudgeConfig
from trialbox.sandbox.base import Sandbox
from trialbox.sandbox.pool import CellPool
from trialbox.types import Grade, Outcome, Task, TaskKind

T = TypeVar("T")

__all__ = ["Grader", "GraderConfig", "GradeFn", "LoopThread", "ThreadedGrader", "answer_of",
           "close_shared_grader", "resolve_task", "reward_of", "shared_grader", "task_index"]


class GradeFn(Protocol):
    def grade(self, task: Task, completion: str) -> Awaitable[Grade]: ...


def grade_seeded(grader: GradeFn, task: Task, completion: str, seed: int | None,
                 language: str | None = None) -> Awaitable[Grade]:
    """`grader.grade`, with `seed` for the tests' random draws and `language` for a stdio
    program when given (a `GradeFn` need take neither: the judge then derives the
    final-domain seed, and grades stdio programs in its configured language)."""
    extra: dict[str, Any] = {}
    if seed is not None:
        extra["seed"] = seed
    if language is not None:
        extra["language"] = language
    return grader.grade(task, completion, **extra)


@dataclass(frozen=True)
class GraderConfig:
    """How the shared judge runs."""

    workers: int = 4
    """Gradings at once (each function grading holds one harness session)."""
    judge: JudgeConfig | None = None
    """The function judge's settings (default: JudgeConfig())."""
    stdio_judge: StdioJudgeConfig | None = None
    """The stdio judge's settings (default: StdioJudgeConfig())."""
    language: str = "python"
    """The language of stdio programs."""

    def __post_init__(self) -> None:
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) \
                or self.workers < 1:
            raise UsageError(f"GraderConfig.workers must be an int >= 1, got {self.workers!r}")


class Grader:
    """trialbox's judge for async callers. Use `async with Grader() as g:` or call
    `await g.close()`; the pool starts on the first grading."""

    def __init__(self, config: GraderConfig | None = None):
        self.config = config or GraderConfig()
        self._pool: CellPool | None = None
        self._starting: asyncio.Lock | None = None
        self._slots: asyncio.Semaphore | None = None
        self._harnesses: list[Sandbox] = []
        self._closed = False

    async def __aenter__(self) -> Grader:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def pool(self) -> CellPool:
        """The shared pool, started on first use (also the gym environment's sessions)."""
        if self._closed:
            raise UsageError("this Grader is closed; make a new one")
        if self._starting is None:
            self._starting = asyncio.Lock()
            self._slots = asyncio.Semaphore(self.config.workers)
        async with self._starting:
            if self._pool is None:
                self._pool = await CellPool(
                    judge_pool_config(warm=2 * self.config.workers)).start()
        return self._pool

    async def grade(self, task: Task, completion: str, seed: int | None = None,
                    language: str | None = None) -> Grade:
        """The trusted grade of `completion` (function tasks: appended to the prompt;
        stdio tasks: the whole program; `judge.grade.grade`), its tests' random draws
        seeded with `seed` (default: judge/seeds.py's final domain); a stdio program in
        `language` (default: the config's). A sandbox that cannot be had is an INFRA
        grade."""
        if task.kind not in (TaskKind.FUNCTION, TaskKind.STDIO):
            raise UsageError(f"{task.task_id}: the integrations grade function and "
                             f"stdio tasks, not {task.kind.value!r} ones")
        pool = await self.pool()
        assert self._slots is not None
        async with self._slots:
            if task.kind is TaskKind.STDIO:
                return await grade(task, completion, pool,
                                   stdio_config=self.config.stdio_judge,
                                   language=language or self.config.language)
            try:
                harness = self._harnesses.pop() if self._harnesses else \
                    await open_harness(pool, self.config.judge)
            except InfraError as e:
                return Grade(task.task_id, Outcome.INFRA, message=f"the judge's sandbox: {e}")
            try:
                return await grade(task, completion, pool, config=self.config.judge,
                                   harness=harness, seed=seed)
            finally:
                self._harnesses.append(harness)

    async def close(self) -> None:
        """Close the harness sessions and the pool. Idempotent."""
        self._closed = True
        harnesses, self._harnesses = self._harnesses, []
        try:
            for h in harnesses:
                await h.close()
        finally:
            pool, self._pool = self._pool, None
            if pool is not None:
                await pool.close()


class LoopThread:
    """An event loop on a daemon thread of its own, for synchronous callers: `call(coro)`
    runs a coroutine there and returns its result."""

    def __init__(self, name: str = "trialbox-integrations"):
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True, name=name)
        self._thread.start()

    @property
    def closed(self) -> bool:
        return self.loop.is_closed()

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        if self.loop.is_closed():
            coro.close()
            raise UsageError("this object is closed; make a new one")
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def close(self) -> None:
        """Stop the loop and its thread. Idempotent."""
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()


class ThreadedGrader:
    """A `Grader` for synchronous callers, on a `LoopThread`."""

    def __init__(self, config: GraderConfig | None = None, grader: GradeFn | None = None):
        self.grader: GradeFn = grader if grader is not None else Grader(config)
        self.thread = LoopThread("trialbox-grader")

    def __enter__(self) -> ThreadedGrader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def grade_all(self, pairs: list[tuple[Task, str]], domain: str | None = None,
                  language: str | None = None) -> list[Grade]:
        """The grades of (task, completion) pairs, concurrently; `domain`: the seeds'
        (judge/seeds.py; default the judge's own, the final domain); `language`: stdio
        programs' (default the grader's)."""
        async def all_() -> list[Grade]:
            return list(await asyncio.gather(*(
                grade_seeded(self.grader, t, c,
                             None if domain is None else seed_of(t, c, domain), language)
                for t, c in pairs)))
        return self.thread.call(all_())

    def close(self) -> None:
        """Release the grader's pool and stop the thread. Idempotent."""
        if self.thread.closed:
            return
        try:
            close = getattr(self.grader, "close", None)
            if close is not None:
                self.thread.call(close())
        finally:
            self.thread.close()


def task_index(tasks: str | Any) -> dict[str, Task]:
    """Tasks by id, from a task-set spec (`"humaneval"`, a .jsonl/.parquet path or URL:
    `store.tasks.load_tasks`), a mapping of id to Task, or an iterable of Tasks."""
    from trialbox.store.tasks import index, load_tasks
    if isinstance(tasks, str):
        return index(load_tasks(tasks))
    if isinstance(tasks, dict):
        return dict(tasks)
    return index(tasks)


def resolve_task(tasks: dict[str, Task], ref: Any, where: str) -> Task:
    """The task a dataset row names: a task id in `tasks`, or a whole task row (a dict
    or its JSON text, as in a task file) parsed on the spot."""
    from trialbox.store.tasks import parse_task
    if isinstance(ref, Task):
        return ref
    if isinstance(ref, dict) or (isinstance(ref, str) and ref.lstrip().startswith("{")):
        return parse_task(ref, where)
    if isinstance(ref, str):
        task = tasks.get(ref)
        if task is None:
            raise UsageError(f"{where}: unknown task id {ref!r}; pass the task set that "
                             f"holds it (tasks=...), or put the whole task row in the column")
        return task
    raise UsageError(f"{where}: a task id (str) or a task row (dict or JSON text) was "
                     f"expected, got {type(ref).__name__}")


_shared_lock = threading.Lock()
_shared: ThreadedGrader | None = None


def shared_grader() -> ThreadedGrader:
    """This process's shared ThreadedGrader (one pool for every caller that has no grader
    of its own: verl's compute_score, TRL's environment instances), started on first use
    and closed at exit or by `close_shared_grader()`."""
    global _shared
    with _shared_lock:
        if _shared is None or _shared.thread.closed:
            if _shared is None:
                atexit.register(close_shared_grader)
            _shared = ThreadedGrader()
        return _shared


def close_shared_grader() -> None:
    """Release the shared grader's pool (a later `shared_grader()` starts a new one)."""
    with _shared_lock:
        grader = _shared
    if grader is not None:
        grader.close()
