"""`compute_score` for verl's custom reward function:

    custom_reward_function:
      path: /path/to/site-packages/trialbox/integrations/verl.py   # or a file that imports it
      name: compute_score

verl's reward manager calls `compute_score(data_source=..., solution_str=...,
ground_truth=..., extra_info=...)` once per response and takes a float, or a dict whose
"score" is the reward and whose other keys it logs. Here:

- `ground_truth` names the task:
  - a task id, looked up in the task set chosen by `data_source` — the mapping in the
    `TRIALBOX_TASK_SETS` environment variable (JSON, {"data source": "humaneval" or a
    .jsonl/.parquet path}) — else in `TRIALBOX_TASKS` ("humaneval", the default); any
    number of task sets in one process;
  - or the whole task row (a dict, or its JSON text) as in a trialbox task file;
  - or verl's code-dataset shape, `{"inputs": [...], "outputs": [...]}` (or its JSON
    text): stdin/stdout tests, graded as a stdio task (whitespace-insensitive output);
    `{"fn_name": ...}` call-based rows are refused with the reason;
- `solution_str` is the model's text, read as every trialbox caller reads it
  (`judge/answer.py`: the answer's code block, else the whole text). A stdio answer is
  graded in its language: `extra_info["language"]` when given, else the language its
  code block is tagged with (```` ```cpp ````), else Python;
- grading uses one judge pool per process, kept across calls (closed at exit), or, when
  `TRIALBOX_URL` is set, a `trialbox serve` at that URL (`POST /v1/submissions`, with
  `TRIALBOX_TOKEN` as its bearer token). A server that cannot be reached is loud: a
  warning naming the URL and the error on every such call, and after
  `TRIALBOX_MAX_UNREACHABLE` (default 32) in a row with none answered, an `InfraError`
  that stops the run — never a quiet stream of exclusions.

It returns {"score": 1.0 | 0.0, "passed": 1.0 | 0.0, "excluded": 0.0 | 1.0}. verl cannot
skip a sample, so an infrastructure failure (trialbox's reward None) scores 0.0 with
`excluded` = 1.0, logged beside the score so a run can count (and filter) them.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import threading
import urllib.error
import urllib.request
from typing import Any

from trialbox.errors import InfraError, UsageError
from trialbox.integrations.grader import (
    close_shared_grader,
    resolve_task,
    reward_of,
    shared_grader,
    task_index,
)
from trialbox.judge.answer import answer_of, fence_language
from trialbox.sandbox.languages import offered
from trialbox.types import Compare, Task, TaskKind, TestCase

__all__ = ["compute_score", "shutdown"]

log = logging.getLogger(__name__)
_lock = threading.Lock()
_tasks: dict[str, dict[str, Task]] = {}
_unreachable = 0  # calls in a row the server did not answer


def _task_set(data_source: Any) -> str:
    """The task set `data_source` names in TRIALBOX_TASK_SETS, else TRIALBOX_TASKS."""
    mapping = os.environ.get("TRIALBOX_TASK_SETS")
    if mapping:
        try:
            sets = json.loads(mapping)
        except ValueError as e:
            raise UsageError(f"TRIALBOX_TASK_SETS must be a JSON object "
                             f'{{"data source": "task set"}}: {e}') from None
        if not isinstance(sets, dict):
            raise UsageError("TRIALBOX_TASK_SETS must be a JSON object "
                             '{"data source": "task set"}')
        if isinstance(data_source, str) and data_source in sets:
            return str(sets[data_source])
    return os.environ.get("TRIALBOX_TASKS", "humaneval")


def _io_task(truth: dict[str, Any], extra_info: Any) -> Task:
    """verl's code-dataset ground truth, {"inputs": [...], "outputs": [...]}, as a stdio
    task (its id: the extra_info index, else a hash of the tests)."""
    if "fn_name" in truth:
        raise UsageError("ground_truth: call-based rows (fn_name) are not supported yet; "
                         "give stdin/stdout tests, or a trialbox function task row")
    inputs, outputs = truth.get("inputs"), truth.get("outputs")
    if not (isinstance(inputs, list) and isinstance(outputs, list) and inputs
            and len(inputs) == len(outputs)
            and all(isinstance(x, str) for x in [*inputs, *outputs])):
        raise UsageError("ground_truth: 'inputs' and 'outputs' must be non-empty lists of "
                         "strings of the same length (stdin and expected stdout per test)")
    index = extra_info.get("index") if isinstance(extra_info, dict) else None
    tid = f"verl/{index}" if index is not None else "verl/" + hashlib.sha256(
        json.dumps([inputs, outputs]).encode()).hexdigest()[:12]
    tests = tuple(TestCase(f"test_{i}", stdin=x.encode(), expected=y.encode())
                  for i, (x, y) in enumerate(zip(inputs, outputs, strict=True)))
    return Task(tid, TaskKind.STDIO, IO_PROMPT, hidden_tests=tests,
                compare=Compare.WHITESPACE)


IO_PROMPT = "verl ground truth: stdin/stdout tests"
"""The prompt of a task made from verl's inputs/outputs (the model's prompt is verl's)."""


def _task(ground_truth: Any, data_source: Any = None, extra_info: Any = None) -> Task:
    truth = ground_truth
    if isinstance(truth, str) and truth.lstrip().startswith("{"):
        try:
            truth = json.loads(truth)
        except ValueError as e:
            raise UsageError(f"ground_truth: not valid JSON: {e}") from None
    if isinstance(truth, dict) and "inputs" in truth and "task_id" not in truth:
        return _io_task(truth, extra_info)
    if isinstance(truth, dict):
        return resolve_task({}, truth, "ground_truth")
    spec = _task_set(data_source)
    with _lock:
        if spec not in _tasks:
            _tasks[spec] = task_index(spec)
    return resolve_task(_tasks[spec], truth, f"ground_truth (task set {spec!r})")


def _language(task: Task, solution: str, extra_info: Any, remote: bool) -> str | None:
    """A stdio answer's language: extra_info's, else its code block's — one this machine
    runs, when it grades (a server checks its own) — else Python."""
    if task.kind is not TaskKind.STDIO:
        return None
    given = extra_info.get("language") if isinstance(extra_info, dict) else None
    return given if isinstance(given, str) and given else (
        fence_language(solution, None if remote else local_languages()) or "python")


@functools.cache
def local_languages() -> frozenset[str]:
    """The languages this machine runs, looked up once per process (`offered()` checks
    every toolchain's files on disk: not once per sample)."""
    return frozenset(offered())


def _local(task: Task, answer: str, language: str | None) -> float | None:
    return reward_of(shared_grader().grade_all([(task, answer)], language=language)[0])


def _unanswered(url: str, why: str) -> None:
    """Loud, never quiet: a warning each time, an error once nothing answers."""
    global _unreachable
    with _lock:
        _unreachable += 1
        n = _unreachable
    limit = int(os.environ.get("TRIALBOX_MAX_UNREACHABLE", "32"))
    log.warning("trialbox server %s did not grade this sample (%s): scored 0.0, excluded "
                "(%d in a row)", url, why, n)
    if n >= limit:
        raise InfraError(f"trialbox server {url} answered none of the last {n} gradings "
                         f"({why}); check TRIALBOX_URL and the server, or raise "
                         "TRIALBOX_MAX_UNREACHABLE")


def _remote(url: str, ground_truth: Any, task: Task, answer: str,
            language: str | None) -> float | None:
    global _unreachable
    body: dict[str, Any] = {"completion": answer}
    if language is not None:
        body["language"] = language
    if isinstance(ground_truth, str) and not ground_truth.lstrip().startswith("{"):
        body["task_id"] = task.task_id
    elif task.task_id.startswith("verl/"):  # verl's inputs/outputs shape, as a task row
        body["task"] = {"task_id": task.task_id, "kind": "stdio", "prompt": IO_PROMPT,
                        "compare": "whitespace",
                        "tests": [{"stdin": t.stdin.decode(), "expected": t.expected.decode()}
                                  for t in task.hidden_tests]}
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
        _unanswered(url, f"HTTP {e.code}")  # overloaded, deadline, 5xx: the machinery
        return None
    except OSError as e:
        _unanswered(url, f"{type(e).__name__}: {e}")
        return None
    with _lock:
        _unreachable = 0
    r_ = row.get("reward")
    return None if r_ is None else float(r_)


def compute_score(data_source: Any, solution_str: str, ground_truth: Any,
                  extra_info: Any = None, **kwargs: Any) -> dict[str, float]:
    """verl's reward function (see the module docstring): the task from `ground_truth`
    (a task id in the task set `data_source` names, a task row, or verl's inputs/outputs
    shape), a stdio answer's language from `extra_info` or its code block."""
    if not isinstance(solution_str, str):
        raise UsageError(f"solution_str must be a str, got {type(solution_str).__name__}")
    task = _task(ground_truth, data_source, extra_info)
    url = os.environ.get("TRIALBOX_URL")
    language = _language(task, solution_str, extra_info, remote=bool(url))
    answer = answer_of(task, solution_str, language=language)
    r = _remote(url, ground_truth, task, answer, language) if url else \
        _local(task, answer, language)
    if r is None:
        return {"score": 0.0, "passed": 0.0, "excluded": 1.0}
    return {"score": r, "passed": float(r >= 1.0), "excluded": 0.0}


def shutdown() -> None:
    """Release this process's judge pool (also run at exit)."""
    close_shared_grader()
