"""Grade every variant twice — by trialbox's judge and by the ordinary harness — and
list where they disagree.

    pool = await CellPool(judge_pool_config(warm=4)).start()
    report = await differential(tasks, corpus, pool, workers=2)
    report.disagreements      # each: task, kind, both verdicts, trialbox's message

A disagreement has a direction:

    correct-scored-0   the ordinary harness passed it, trialbox did not (failed, timeout,
                       memory or cheat): correct code scored 0
    wrong-scored-1     the ordinary harness failed it, trialbox passed it
    excluded           trialbox excluded it (infra or error: reward None), whatever the
                       ordinary harness said

None of the corpus's variants attacks a judge, so each disagreement is a trialbox bug
(or a variant whose behaviour is not deterministic: every disagreement is graded once
more both ways, and `Disagreement.again` says what the second grading gave).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from trialbox.judge.fidelity.corpus import Variant
from trialbox.judge.fidelity.ordinary import (
    OrdinaryConfig,
    OrdinaryVerdict,
    ordinary_grade_async,
)
from trialbox.judge.function import JudgeConfig, open_harness
from trialbox.judge.grade import grade
from trialbox.sandbox.base import Sandbox, SandboxProvider
from trialbox.types import Grade, Outcome, Task

CORRECT_SCORED_0 = "correct-scored-0"
WRONG_SCORED_1 = "wrong-scored-1"
EXCLUDED = "excluded"
DIRECTIONS = (CORRECT_SCORED_0, WRONG_SCORED_1, EXCLUDED)


@dataclass(frozen=True)
class Disagreement:
    """One variant the two graders judged differently."""

    task_id: str
    kind: str
    intent: str
    detail: str
    direction: str
    """correct-scored-0, wrong-scored-1 or excluded."""
    ordinary_passed: bool
    ordinary_message: str
    trialbox_outcome: str
    trialbox_message: str
    completion: str
    again: str = ""
    """The second grading, both ways: whether the disagreement held."""

    def as_dict(self) -> dict[str, object]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Row:
    """One variant's two verdicts."""

    task_id: str
    kind: str
    intent: str
    ordinary_passed: bool
    outcome: str
    """trialbox's outcome (passed, failed, timeout, ...)."""


@dataclass(frozen=True)
class FidelityReport:
    """The run's figures: labels by the ordinary harness, disagreements by direction."""

    variants: int
    correct: int
    """Variants the ordinary harness passed."""
    wrong: int
    """Variants the ordinary harness failed."""
    by_kind: dict[str, dict[str, int]]
    """kind -> variants, correct, wrong, disagreements."""
    directions: dict[str, int]
    """Disagreements by direction (all three keys present)."""
    disagreements: tuple[Disagreement, ...]
    wall_s: float
    outcomes: dict[str, int] = field(default_factory=dict)
    """trialbox's outcomes over all variants."""
    rows: tuple[Row, ...] = ()
    """Every variant's two verdicts, in the corpus's order (not in `as_dict`)."""

    def as_dict(self) -> dict[str, object]:
        return {"variants": self.variants, "correct": self.correct, "wrong": self.wrong,
                "directions": self.directions, "by_kind": self.by_kind,
                "outcomes": self.outcomes, "wall_s": self.wall_s,
                "disagreements": [d.as_dict() for d in self.disagreements]}


def direction(ordinary: OrdinaryVerdict, g: Grade) -> str | None:
    """How trialbox's grade departs from the ordinary verdict, or None if it agrees."""
    if g.outcome in (Outcome.INFRA, Outcome.ERROR):
        return EXCLUDED
    if ordinary.passed and not g.passed:
        return CORRECT_SCORED_0
    if not ordinary.passed and g.passed:
        return WRONG_SCORED_1
    return None


async def _trialbox(task: Task, completion: str, pool: SandboxProvider,
                    harness: Sandbox, config: JudgeConfig | None) -> Grade:
    try:
        return await grade(task, completion, pool, config=config, harness=harness)
    except Exception as e:  # the judge raised: excluded, with what it raised
        return Grade(task.task_id, Outcome.ERROR,
                     message=f"the judge raised {type(e).__name__}: {e}")


async def differential(tasks: Mapping[str, Task] | Iterable[Task],
                       variants: Sequence[Variant], pool: SandboxProvider, *,
                       workers: int = 2, config: JudgeConfig | None = None,
                       ordinary: OrdinaryConfig | None = None,
                       progress: Callable[[int, int], None] | None = None,
                       ) -> FidelityReport:
    """Grade each variant by trialbox (`grade`, on `workers` shared trusted harness
    sessions of `pool`) and by the ordinary harness, side by side; the report."""
    by_id = dict(tasks) if isinstance(tasks, Mapping) else {t.task_id: t for t in tasks}
    missing = sorted({v.task_id for v in variants} - set(by_id))
    if missing:
        raise ValueError(f"variants of unknown tasks: {missing[:5]}")
    t0 = time.monotonic()
    results: list[tuple[OrdinaryVerdict, Grade] | None] = [None] * len(variants)
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(len(variants)):
        queue.put_nowait(i)
    done = 0

    async def worker() -> None:
        nonlocal done
        harness = await open_harness(pool, config)
        try:
            while not queue.empty():
                i = queue.get_nowait()
                v = variants[i]
                task = by_id[v.task_id]
                verdict, g = await asyncio.gather(
                    ordinary_grade_async(task, v.completion, ordinary),
                    _trialbox(task, v.completion, pool, harness, config))
                results[i] = (verdict, g)
                done += 1
                if progress is not None:
                    progress(done, len(variants))
        finally:
            await harness.close()

    await asyncio.gather(*(worker() for _ in range(max(1, workers))))
    found: list[Disagreement] = []
    harness = await open_harness(pool, config)
    try:
        for v, r in zip(variants, results, strict=True):
            assert r is not None
            verdict, g = r
            d = direction(verdict, g)
            if d is None:
                continue
            task = by_id[v.task_id]
            again_o, again_t = await asyncio.gather(
                ordinary_grade_async(task, v.completion, ordinary),
                _trialbox(task, v.completion, pool, harness, config))
            held = direction(again_o, again_t) == d
            found.append(Disagreement(
                v.task_id, v.kind, v.intent, v.detail, d, verdict.passed,
                verdict.message, g.outcome.value, g.message, v.completion,
                again=(f"{'held' if held else 'did not hold'}: ordinary "
                       f"{'passed' if again_o.passed else 'failed'}, trialbox "
                       f"{again_t.outcome.value}")))
    finally:
        await harness.close()
    return _report(variants, results, found, time.monotonic() - t0)


def _report(variants: Sequence[Variant],
            results: Sequence[tuple[OrdinaryVerdict, Grade] | None],
            found: list[Disagreement], wall: float) -> FidelityReport:
    by_kind: dict[str, Counter[str]] = {}
    outcomes: Counter[str] = Counter()
    for v, r in zip(variants, results, strict=True):
        assert r is not None
        c = by_kind.setdefault(v.kind, Counter())
        c["variants"] += 1
        c["correct" if r[0].passed else "wrong"] += 1
        outcomes[r[1].outcome.value] += 1
    for d in found:
        by_kind[d.kind]["disagreements"] += 1
    kinds = {k: {f: c[f] for f in ("variants", "correct", "wrong", "disagreements")}
             for k, c in by_kind.items()}
    correct = sum(1 for r in results if r is not None and r[0].passed)
    dirs = Counter(d.direction for d in found)
    rows = tuple(Row(v.task_id, v.kind, v.intent, r[0].passed, r[1].outcome.value)
                 for v, r in zip(variants, results, strict=True) if r is not None)
    return FidelityReport(len(variants), correct, len(variants) - correct, kinds,
                          {k: dirs[k] for k in DIRECTIONS}, tuple(found), round(wall, 3),
                          dict(outcomes), rows)
