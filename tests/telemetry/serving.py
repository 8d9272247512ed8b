"""A real uvicorn server on a free loopback port, in a thread of this process, for the
dashboard's tests (the metrics it reads are this process's)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI

from trialbox.judge.audit import ReviewQueue, select_for_review
from trialbox.service.dashboard import DashboardConfig, install


def dashboard_app(config: DashboardConfig | None = None) -> FastAPI:
    app = FastAPI()
    install(app, config or DashboardConfig(review_db=None))
    return app


@contextmanager
def serve(app: Any) -> Iterator[str]:
    """Serve `app` on 127.0.0.1:<free port>; yields the base URL."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning",
                                           lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def graded_rows(n: int = 20) -> list[dict[str, Any]]:
    """Rows shaped like `trialbox eval` output, plus the code a rollout would carry."""
    rows = []
    for i in range(n):
        passed = i % 3 != 0
        rows.append({
            "task_id": "HumanEval/0", "passed": passed, "reward": 1.0 if passed else 0.0,
            "outcome": "passed" if passed else "failed", "message": "" if passed else
            "test 1: assertion failed", "flags": ["exit-hook"] if i == 4 else [],
            "tests": [{"name": "test 1", "passed": passed, "message": "", "ms": 0.4,
                       "hidden": True}],
            "turns": [{"code": f"    return {i} > 0\n", "stdout": "", "stderr": "",
                       "status": "ok"}]})
    return rows


def make_queue(path: Path, run_id: str = "run-a") -> None:
    rows = graded_rows()
    with ReviewQueue(path) as q:
        q.add(run_id, rows, select_for_review(rows, fraction=0.25, seed=1))
