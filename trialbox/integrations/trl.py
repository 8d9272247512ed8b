"""A reward function for TRL's `GRPOTrainer` (`reward_funcs=[TrialboxReward(...)]`).

TRL calls it with keyword arguments: `prompts`, `completions` (strings, or chat-format
lists of messages) and every dataset column, one value per completion. The task comes
from the `task_id` column (looked up in `tasks`) or a `task` column holding the whole
task row. The reward is trialbox's own: 1.0 when the trusted judge passes the answer,
0.0 for anything the candidate did, and `None` when the machinery failed — TRL (checked
in 1.16's grpo_trainer.py) turns None into NaN, leaves the completion out of its group's
baseline and of the logged reward, and gives it zero advantage: skipped, not punished.

    from trialbox.integrations.trl import TrialboxReward
    with TrialboxReward("humaneval") as reward:
        GRPOTrainer(model=..., reward_funcs=[reward], train_dataset=ds, ...).train()

`AsyncTrialboxReward` is the same as an `async` callable: TRL runs it on its own event
loop, concurrently with its other async reward functions.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from trialbox.errors import UsageError
from trialbox.judge.answer import answer_of, completion_text, fence_language
from trialbox.sandbox.languages import offered
from trialbox.integrations.grader import (
    Grader,
    GraderConfig,
    GradeFn,
    ThreadedGrader,
    grade_seeded,
    resolve_task,
    reward_of,
    task_index,
)
from trialbox.types import Grade, Task, TaskKind

__all__ = ["AsyncTrialboxReward", "TrialboxReward", "completion_text"]


class _Base:
    __name__ = "trialbox"  # TRL names the reward's logged columns after it

    def __init__(self, tasks: Any = "humaneval", *, task_column: str = "task_id",
                 row_column: str = "task"):
        self.tasks: dict[str, Task] = task_index(tasks)
        self.task_column = task_column
        self.row_column = row_column
        self.grades: list[Grade] = []
        """Every grade so far, in call order (what the rewards were made from)."""
        self._languages: frozenset[str] | None = None

    def offered(self) -> frozenset[str]:
        """The languages this machine runs, looked up once per reward function (each
        `offered()` checks every toolchain's files on disk), at its first stdio answer
        with no `language` column."""
        if self._languages is None:
            self._languages = frozenset(offered())
        return self._languages

    def _items(self, completions: Sequence[Any],
               columns: dict[str, Any]) -> list[tuple[Task, str, str | None]]:
        """(task, answer, language) per completion: a stdio answer's language from the
        dataset's `language` column when it has one, else its code block's tag (None:
        the grader's default, Python)."""
        refs = columns.get(self.task_column)
        if refs is None:
            refs = columns.get(self.row_column)
        if refs is None:
            raise UsageError(f"the dataset needs a {self.task_column!r} column (task ids) or a "
                             f"{self.row_column!r} column (task rows); TRL passes dataset "
                             f"columns to reward functions by name")
        if len(refs) != len(completions):
            raise UsageError(f"{len(completions)} completions but {len(refs)} task references")
        langs = columns.get("language")
        if langs is not None and len(langs) != len(completions):
            raise UsageError(f"{len(completions)} completions but {len(langs)} languages")
        out: list[tuple[Task, str, str | None]] = []
        for i, (ref, c) in enumerate(zip(refs, completions, strict=True)):
            task = resolve_task(self.tasks, ref, f"completion {i}")
            text = completion_text(c)
            lang = None
            if task.kind is TaskKind.STDIO:
                given = langs[i] if langs is not None else None
                lang = given if isinstance(given, str) and given else \
                    fence_language(text, self.offered())  # one this machine runs
            out.append((task, answer_of(task, text, language=lang), lang))
        return out

    async def _grade(self, grader: GradeFn,
                     items: list[tuple[Task, str, str | None]]) -> list[Grade]:
        return list(await asyncio.gather(*(grade_seeded(grader, t, c, None, lang)
                                           for t, c, lang in items)))

    def _rewards(self, grades: list[Grade]) -> list[float | None]:
        self.grades.extend(grades)
        return [reward_of(g) for g in grades]


class TrialboxReward(_Base):
    """A synchronous TRL reward function; its judge runs on a thread of its own.

    `tasks`: the task set (a spec such as "humaneval", a .jsonl path, or Tasks);
    `grader`: an async grader to use instead of trialbox's judge (tests pass a fake).
    Close it (or use `with`) to release the judge's sandbox pool."""

    def __init__(self, tasks: Any = "humaneval", *, config: GraderConfig | None = None,
                 grader: GradeFn | None = None, task_column: str = "task_id",
                 row_column: str = "task"):
        super().__init__(tasks, task_column=task_column, row_column=row_column)
        self._judge = ThreadedGrader(config, grader)

    def __call__(self, prompts: Sequence[Any] | None = None,
                 completions: Sequence[Any] = (), **columns: Any) -> list[float | None]:
        items = self._items(completions, columns)
        return self._rewards(self._judge.thread.call(self._grade(self._judge.grader, items)))

    def __enter__(self) -> TrialboxReward:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._judge.close()


class AsyncTrialboxReward(_Base):
    """An `async` TRL reward function. Its judge binds to the loop of the first call
    (TRL's reward loop); `await close()` on that loop, or `close_sync()` from elsewhere
    (it runs the close on the loop the grader was used on)."""

    def __init__(self, tasks: Any = "humaneval", *, config: GraderConfig | None = None,
                 grader: GradeFn | None = None, task_column: str = "task_id",
                 row_column: str = "task"):
        super().__init__(tasks, task_column=task_column, row_column=row_column)
        self.grader: GradeFn = grader if grader is not None else Grader(config)
        self._loop: asyncio.AbstractEventLoop | None = None

    async def __call__(self, prompts: Sequence[Any] | None = None,
                       completions: Sequence[Any] = (), **columns: Any) -> list[float | None]:
        self._loop = asyncio.get_running_loop()
        return self._rewards(await self._grade(self.grader, self._items(completions, columns)))

    async def close(self) -> None:
        close = getattr(self.grader, "close", None)
        if close is not None:
            await close()

    def close_sync(self) -> None:
        """Close from outside the grader's loop (e.g. after `trainer.train()`)."""
        loop = self._loop
        if loop is None or loop.is_closed() or not loop.is_running():
            asyncio.run(self.close())
        else:
            asyncio.run_coroutine_threadsafe(self.close(), loop).result()
