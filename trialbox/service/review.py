"""The review page's JSON API: the spot-check audit over HTTP, on `judge.audit.ReviewQueue`.

    GET  /api/review/items?run_id=&state=pending|reviewed|all&limit=
    GET  /api/review/items/{id}           the item: task, code per turn, output, tests,
                                          grade, reward, flags, reasons, verdict
    POST /api/review/items/{id}/verdict   {"correct": true|false, "note": "…",
                                           "reviewer": "…"} → the stored verdict + stats
    GET  /api/review/stats?run_id=        queued / reviewed / wrong and the estimated
                                          reward error rate with its 95% Wilson interval

The queue file is `DashboardConfig.review_db` (rows are queued with `trialbox audit
queue`). Each request opens its own connection: sqlite3 connections belong to one
thread, FastAPI runs these handlers in a thread pool, and opening one is ~0.1 ms.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from functools import cache
from typing import Any, Literal

from fastapi import APIRouter, HTTPException, Query, Request
from pydantic import BaseModel, ConfigDict, Field, StrictBool

from trialbox.errors import UsageError
from trialbox.judge.audit import AuditStats, ReviewItem, ReviewQueue

router = APIRouter(prefix="/api/review", tags=["review"])


class VerdictIn(BaseModel):
    """A reviewer's verdict on one item's reward."""

    model_config = ConfigDict(extra="forbid")
    correct: StrictBool
    """true: the reward the judge gave is right; false: it is wrong."""
    note: str = Field("", max_length=4000)
    reviewer: str = Field("", max_length=200)


@contextmanager
def _queue(request: Request) -> Iterator[ReviewQueue]:
    config = getattr(request.app.state, "dashboard", None)
    path = getattr(config, "review_db", None)
    if not path:
        raise HTTPException(409, "no review queue is configured: start the server with "
                                 "TRIALBOX_REVIEW_DB=review.db (a queue made by `trialbox "
                                 "audit queue --db review.db …`)")
    try:
        q = ReviewQueue(path)
    except UsageError as e:
        raise HTTPException(409, str(e)) from None
    try:
        yield q
    except sqlite3.Error as e:  # e.g. locked by a long writer: the caller may retry
        raise HTTPException(503, f"review queue {path}: {e}",
                            headers={"Retry-After": "1"}) from None
    finally:
        q.close()


def stats_json(s: AuditStats) -> dict[str, Any]:
    out = asdict(s)
    out["error_rate_ci"] = list(s.error_rate_ci) if s.error_rate_ci else None
    return out


def _summary(item: ReviewItem) -> dict[str, Any]:
    row = item.row
    return {"id": item.id, "run_id": item.run_id, "row_index": item.row_index,
            "task_id": row.get("task_id"), "outcome": row.get("outcome"),
            "reward": row.get("reward"), "flags": row.get("flags") or [],
            "reasons": list(item.reasons),
            "verdict": asdict(item.verdict) if item.verdict else None}


@cache
def _bundled_prompts() -> dict[str, str]:
    """Prompts of the bundled HumanEval tasks, for rows that name a task but carry no
    prompt (`trialbox eval` rows do not)."""
    from trialbox.store.tasks import load_humaneval
    return {t.task_id: t.prompt for t in load_humaneval()}


def _turns(row: dict[str, Any]) -> list[dict[str, Any]]:
    """The code per turn: a rollout row's `turns` ([{code, stdout, stderr, status}]),
    else one turn from `completion`, else one per file of a repository answer's `files`
    ({code, path}; a deleted file's code is null)."""
    turns = row.get("turns")
    if isinstance(turns, list):
        return [t if isinstance(t, dict) else {"code": str(t)} for t in turns]
    if isinstance(row.get("completion"), str):
        return [{"code": row["completion"], "stdout": row.get("stdout"),
                 "stderr": row.get("stderr"), "status": row.get("status")}]
    files = row.get("files")
    if isinstance(files, dict):
        return [{"path": str(path), "code": text if isinstance(text, str) else None}
                for path, text in sorted(files.items())]
    return []


def detail(item: ReviewItem) -> dict[str, Any]:
    row = item.row
    prompt = row.get("prompt")
    task_id = row.get("task_id")
    if not isinstance(prompt, str) and isinstance(task_id, str):
        try:
            prompt = _bundled_prompts().get(task_id)
        except Exception:  # the bundled set is optional here
            prompt = None
    return {**_summary(item), "prompt": prompt, "turns": _turns(row),
            "tests": row.get("tests") or [], "message": row.get("message"),
            "passed": row.get("passed"), "row": row}


@router.get("/items")
def items(request: Request, run_id: str | None = None,
          state: Literal["pending", "reviewed", "all"] = "pending",
          limit: int = Query(50, ge=1, le=1000)) -> dict[str, Any]:
    """Queued items, oldest first."""
    with _queue(request) as q:
        if state == "pending":
            found = q.pending(limit, run_id=run_id)
        else:
            found = _all(q, run_id, limit, reviewed_only=state == "reviewed")
        return {"items": [_summary(i) for i in found],
                "stats": stats_json(q.stats(run_id))}


def _all(q: ReviewQueue, run_id: str | None, limit: int,
         reviewed_only: bool) -> list[ReviewItem]:
    return q.items(limit, run_id=run_id, reviewed_only=reviewed_only)


@router.get("/items/{item_id}")
def item(request: Request, item_id: int) -> dict[str, Any]:
    """One item, everything a reviewer needs to judge its reward."""
    with _queue(request) as q:
        try:
            return detail(q.get(item_id))
        except UsageError as e:
            raise HTTPException(404, str(e)) from None


@router.post("/items/{item_id}/verdict")
def verdict(request: Request, item_id: int, body: VerdictIn) -> dict[str, Any]:
    """Store the reviewer's verdict (a later one replaces an earlier one)."""
    with _queue(request) as q:
        try:
            recorded = q.record(item_id, body.correct, body.note, body.reviewer)
        except UsageError as e:
            raise HTTPException(404, str(e)) from None
        run_id = q.get(item_id).run_id
        return {"id": item_id, "verdict": asdict(recorded.verdict),
                "replaced": asdict(recorded.replaced) if recorded.replaced else None,
                "stats": stats_json(q.stats(run_id)), "all_stats": stats_json(q.stats())}


@router.get("/stats")
def stats(request: Request, run_id: str | None = None) -> dict[str, Any]:
    """Review progress and the estimated reward error rate (95% Wilson interval), from
    the randomly sampled items only (anomalies would bias it)."""
    with _queue(request) as q:
        runs = q.runs()
        return {"run_id": run_id, "runs": runs, **stats_json(q.stats(run_id))}
