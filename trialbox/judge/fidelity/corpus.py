"""The variants of a task's reference solution, deterministic from a seed.

    variants(task, seed=0, n=12)          # the canonical solution and 11 variants
    variants(task, seed=0, kinds=KINDS)   # the canonical solution and one of each kind

Kinds and what they intend (intent is never the label: the ordinary harness labels):

    canonical  the task's canonical_solution, verbatim
    correct    a semantics-preserving transformation (transforms.CORRECT, `combo`)
    probe      the answer in another form (returns.py): equal-valued or not
    wrong      a mutant (mutants.py)

With `n`, kinds follow a rotation that starts at a point drawn from the seed and the
task: two correct-or-probe variants, then a mutant, and so on; a kind that does not
apply to this solution, renders to code that does not compile, or repeats an earlier
completion is passed over for the next. A correct variant is rendered as a whole
redefinition instead of a body with probability `REDEFINE_SHARE`.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from trialbox.judge.fidelity.mutants import MUTANTS
from trialbox.judge.fidelity.source import Base
from trialbox.judge.fidelity.transforms import CORRECT, PROBES, Transform, combo
from trialbox.types import Task

REDEFINE_SHARE = 0.15
"""Correct and probe variants rendered as a redefinition even when a body would do."""

INTENTS: dict[str, str] = {
    "canonical": "canonical",
    **{k: "correct" for k in CORRECT}, "combo": "correct",
    **{k: "probe" for k in PROBES},
    **{k: "wrong" for k in MUTANTS},
}
"""Every kind and its intent."""

KINDS: tuple[str, ...] = tuple(INTENTS)
"""Every kind, in a fixed order."""

_TRANSFORMS: dict[str, Transform] = {**CORRECT, "combo": combo, **PROBES, **MUTANTS}


@dataclass(frozen=True)
class Variant:
    """One completion of a task, as the corpus generated it."""

    task_id: str
    kind: str
    intent: str
    """canonical, correct, probe or wrong (by construction; the ordinary harness's
    verdict is the label)."""
    detail: str
    """Which form the transformation took (e.g. "ThreadPoolExecutor", "Lt -> LtE")."""
    completion: str
    """Appended to the task's prompt, like a model's completion."""


def variant(base: Base, kind: str, rng: random.Random) -> Variant | None:
    """One variant of `kind`, or None when it does not apply or does not compile."""
    task = base.task
    if kind == "canonical":
        return Variant(task.task_id, kind, "canonical", "", task.canonical_solution)
    prog = base.program()
    detail = _TRANSFORMS[kind](prog, rng)
    if detail is None:
        return None
    redefine = INTENTS[kind] != "wrong" and rng.random() < REDEFINE_SHARE
    text = base.render(prog, redefine=redefine)
    if text is None:
        return None
    if redefine or prog.redefine:
        detail += " [redefinition]"
    return Variant(task.task_id, kind, INTENTS[kind], detail, text)


def variants(task: Task, seed: int = 0, n: int | None = None,
             kinds: Sequence[str] | None = None) -> list[Variant]:
    """The canonical solution and variants of `task` (see the module docstring): `n`
    in all in rotation, or one of each of `kinds`. Empty when the task's reference
    cannot be edited (`Base.of`)."""
    base = Base.of(task)
    if base is None or not task.canonical_solution:
        return []
    out = [Variant(task.task_id, "canonical", "canonical", "", task.canonical_solution)]
    seen = {out[0].completion}

    def attempt(kind: str, j: int) -> bool:
        v = variant(base, kind, random.Random(f"{seed}/{task.task_id}/{kind}/{j}"))
        if v is None or v.completion in seen:
            return False
        seen.add(v.completion)
        out.append(v)
        return True

    if kinds is not None:
        for kind in kinds:
            if kind not in INTENTS:
                raise ValueError(f"unknown variant kind {kind!r}")
            if kind != "canonical":
                any(attempt(kind, j) for j in range(3))
        return out
    if n is None or n < 1:
        raise ValueError("variants: give n >= 1 or kinds")
    start = random.Random(f"{seed}/{task.task_id}")
    good = [k for k in KINDS if INTENTS[k] in ("correct", "probe")]
    bad = [k for k in KINDS if INTENTS[k] == "wrong"]
    gi, bi = start.randrange(len(good)), start.randrange(len(bad))
    for j in range(6 * n):
        if len(out) >= n:
            break
        if j % 3 == 2:
            kind, bi = bad[bi % len(bad)], bi + 1
        else:
            kind, gi = good[gi % len(good)], gi + 1
        attempt(kind, j)
    return out
