"""`compute_score` for verl's custom reward function:

    custom_reward_function:
      path: /path/to/site-packages/trialbox/integrations/verl.py   # or a file that imports it
      name: compute_score

verl's reward manager calls `compute_score(data_source=..., solution_str=...,
ground_truth=..., extra_info=...)` once per response and takes a float, or a dict whose
"score" is the reward and whose other keys it logs. Here:

- `ground_truth` names the task: a task id (looked up in the task set named by the
  `TRIALBOX_TASKS` environment variable: "humaneval", the default, or a .jsonl/.parquet
  path), or the whole task row (a dict, or its JSON text) as in a trialbox task file;
- `solution_str` is the model's text; its last ```python block is the answer (or the
  whole text, a completion continuing the prompt);
- grading uses one judge pool per process, kept across calls (closed at exit), or, when
  `TRIALBOX_URL` is set, a `trialbox serve` at that URL (`POST /v1/submissions`, with
  `TRIALBOX_TOKEN` as its bearer token).

It returns {"score": 1.0 | 0.0, "passed": 1.0 | 0.0, "excluded": 0.0 | 1.0}. verl cannot
skip a sample, so an infrastructure failure (trialbox's reward None) scores 0.0 with
`excluded` = 1.0, logged beside the score so a run can count (and filter) them.
"""

from __future__ import annotations

import json
import os
import threading
import urllib.error
import urllib.request
from typing import Any

from trialbox.errors import UsageError
from trialbox.integrations.grader import (
    close_shared_grader,
    answer_of,
    resolve_task,
    reward_of,
    shared_grader,
    task_index,
)
from trialbox.types import Task

__all__ = ["compute_score", "shutdown"]

_lock = threading.Lock()
_tasks: dict[str, dict[str, Task]] = {}


def _task(ground_truth: Any) -> Task:
    if isinstance(ground_truth, dict) or (isinstance(ground_truth, str)
                                          and ground_truth.lstrip().startswith("{")):
        return resolve_task({}, ground_truth, "ground_truth")
    spec = os.environ.get("TRIALBOX_TASKS", "humaneval")
    with _lock:
        if spec not in _tasks:
            _tasks[spec] = task_index(spec)
    return resolve_task(_tasks[spec], ground_truth, f"ground_truth (task set {spec!r})")


def _local(task: Task, answer: str) -> float | None:
    return reward_of(shared_grader().grade_all([(task, answer)])[0])


def _remote(url: str, ground_truth: Any, task: Task, answer: str) -> float | None:
    body: dict[str, Any] = {"completion": answer}
    if isinstance(ground_truth, str) and not ground_truth.lstrip().startswith("{"):
        body["task_id"] = task.task_id
    else:
        body["task"] = ground_truth if isinstance(ground_truth, dict) else json.loads(ground_truth)
    headers = {"content-type": "application/json"}
    if os.environ.get("TRIALBOX_TOKEN"):
        headers["authorization"] = f"Bearer {os.environ['TRIALBOX_TOKEN']}"
    req = urllib.request.Request(url.rstrip("/") + "/v1/submissions",
                                 json.dumps(body).encode(), headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            row = json.loads(r.read())
    except urllib.error.HTTPError as e:
        if e.code in (400, 401, 403, 404, 422):  # the request's fault: say so, loudly
            raise UsageError(f"trialbox server {url} refused the submission ({e.code}): "
                             f"{e.read()[:500].decode(errors='replace')}") from None
        return None  # overloaded, deadline, 5xx: the machinery, not the candidate
    except OSError:
        return None
    r_ = row.get("reward")
    return None if r_ is None else float(r_)


def compute_score(data_source: Any, solution_str: str, ground_truth: Any,
                  extra_info: Any = None, **kwargs: Any) -> dict[str, float]:
    """verl's reward function (see the module docstring). `data_source` and `extra_info`
    are not needed: the task comes from `ground_truth`."""
    if not isinstance(solution_str, str):
        raise UsageError(f"solution_str must be a str, got {type(solution_str).__name__}")
    task = _task(ground_truth)
    answer = answer_of(task, solution_str)
    url = os.environ.get("TRIALBOX_URL")
    r = _remote(url, ground_truth, task, answer) if url else _local(task, answer)
    if r is None:
        return {"score": 0.0, "passed": 0.0, "excluded": 1.0}
    return {"score": r, "passed": float(r >= 1.0), "excluded": 0.0}


def shutdown() -> None:
    """Release this process's judge pool (also run at exit)."""
    close_shared_grader()
