"""Task sets: where problems come from. `load_tasks("humaneval")` or a JSONL path gives a
list of `Task`s (see tasks.py for the file formats; checks.py splits HumanEval's
`check(candidate)` into one test case per assert)."""

from __future__ import annotations

from trialbox.store.tasks import HUMANEVAL, index, load_humaneval, load_jsonl, load_tasks

__all__ = ["HUMANEVAL", "index", "load_humaneval", "load_jsonl", "load_tasks"]
