"""The dashboard and `/metrics`, served by the same process as the API.

    app = FastAPI()
    install(app, DashboardConfig(review_db="review.db"))   # trialbox serve does this

Pages (static HTML + small ES modules under static/, preact+htm and uPlot vendored, no
network at run time) poll JSON endpoints:

    GET /                      live view                 GET /api/dashboard
    GET /runs/{run_id}         a run's reward curve      GET /api/runs, /api/runs/{id}
    GET /traces/{trace_id}     a trace's spans and logs  GET /api/traces/{id}
    GET /review                the spot-check audit      /api/review/... (review.py)
    GET /metrics               Prometheus text format

Authentication is the server's (the Guard in front of every route): on loopback no
token is needed; elsewhere every route here, `/metrics` included, wants the bearer
token like the rest of the API (a Prometheus scrape config can send one).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI, HTTPException, Request
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from prometheus_client import CONTENT_TYPE_LATEST

from trialbox import telemetry
from trialbox.errors import UsageError
from trialbox.service import dashboard_data, review
from trialbox.telemetry.asgi import TraceRequests
from trialbox.telemetry.tracing import TracingConfig

STATIC = Path(__file__).with_name("static")
TRACE_ID = re.compile(r"^[0-9a-f]{32}$")


@dataclass(frozen=True)
class DashboardConfig:
    """What the dashboard shows and where it reads the review queue."""

    review_db: str | None = field(
        default_factory=lambda: os.environ.get("TRIALBOX_REVIEW_DB") or None)
    """SQLite review queue (`trialbox audit queue --db …`) the review page works on;
    None: the review page says how to set one. Default: $TRIALBOX_REVIEW_DB."""
    trace_url: str | None = field(
        default_factory=lambda: os.environ.get("TRIALBOX_TRACE_URL") or None)
    """Link template to a tracing UI, e.g. http://jaeger:16686/trace/{trace_id}; the
    dashboard's own trace page is used when None."""
    poll_ms: int = 1000
    """How often the pages poll their JSON endpoints."""
    tracing: TracingConfig | None = None
    """Tracing setup (default: `TracingConfig()`, OTLP from the OTEL_* variables)."""

    def __post_init__(self) -> None:
        if not 100 <= self.poll_ms <= 60_000:
            raise UsageError(f"DashboardConfig.poll_ms must be 100..60000, got {self.poll_ms}")
        if self.trace_url is not None and "{trace_id}" not in self.trace_url:
            raise UsageError("DashboardConfig.trace_url must contain '{trace_id}', e.g. "
                             "http://127.0.0.1:16686/trace/{trace_id}")


def install(app: FastAPI, config: DashboardConfig | None = None) -> None:
    """Mount the dashboard, the review pages and `/metrics` on `app`; set up tracing
    (once per process) and the in-memory log keeper the trace page reads; trace every
    request (`TraceRequests`); report the service's admission queue (when
    `app.state.service` has one) as queue depth and tasks by state."""
    config = config or DashboardConfig()
    telemetry.setup_tracing(config.tracing)
    telemetry.recent_logs()
    app.state.dashboard = config
    service = getattr(app.state, "service", None)
    admission = getattr(service, "admission", None)
    if admission is not None:
        telemetry.watch_queue("admission.waiting", lambda: int(admission.waiting))
        telemetry.watch_queue("admission.running", lambda: int(admission.running))
        # Until the scheduler reports task states, the service's own sandbox-using
        # requests are the tasks: waiting for a slot, or running.
        telemetry.watch_tasks("service", lambda: {"queued": int(admission.waiting),
                                                  "running": int(admission.running)})
    app.include_router(router)
    app.include_router(review.router)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    # Outermost (added last): a span per request, refused ones included; X-Trace-Id.
    app.add_middleware(TraceRequests)


def _config(request: Request) -> DashboardConfig:
    config = getattr(request.app.state, "dashboard", None)
    return config if isinstance(config, DashboardConfig) else DashboardConfig()


router = APIRouter(tags=["dashboard"])


@router.get("/", include_in_schema=False)
async def index() -> FileResponse:
    return FileResponse(STATIC / "index.html")


@router.get("/runs/{run_id}", include_in_schema=False)
async def run_page(run_id: str) -> FileResponse:
    return FileResponse(STATIC / "run.html")


@router.get("/traces/{trace_id}", include_in_schema=False)
async def trace_page(trace_id: str) -> FileResponse:
    return FileResponse(STATIC / "trace.html")


@router.get("/review", include_in_schema=False)
async def review_page() -> FileResponse:
    return FileResponse(STATIC / "review.html")


@router.get("/metrics", tags=["health"])
async def metrics() -> Response:
    """Prometheus metrics (text exposition format)."""
    return Response(telemetry.current().exposition(), media_type=CONTENT_TYPE_LATEST)


@router.get("/api/dashboard")
async def dashboard(request: Request) -> JSONResponse:
    """The live view: tasks by state, queues, pool, totals, throughput, latency, rewards
    over time, recent failures and anti-cheat flags, training runs."""
    config = _config(request)
    body: dict[str, Any] = dashboard_data.summary(
        telemetry.current(), getattr(request.app.state, "service", None))
    body["config"] = {"poll_ms": config.poll_ms, "trace_url": config.trace_url,
                      "review": config.review_db is not None}
    return JSONResponse(body)


@router.get("/api/runs")
async def runs() -> dict[str, Any]:
    """Training runs this process has seen steps of."""
    return {"runs": dashboard_data.summary(telemetry.current())["runs"]}


@router.get("/api/runs/{run_id}")
async def run(run_id: str) -> dict[str, Any]:
    """One run's steps: reward_mean (and other scalars) per step."""
    view = dashboard_data.run_view(telemetry.current(), run_id)
    if view is None:
        raise HTTPException(404, f"no training run {run_id!r} in this process (runs: "
                                 f"{', '.join(telemetry.current().recent.run_ids()) or 'none'})")
    return view


@router.get("/api/traces/{trace_id}")
async def trace(trace_id: str) -> dict[str, Any]:
    """The spans of one trace this process still keeps, and its log lines."""
    if not TRACE_ID.match(trace_id):
        raise HTTPException(422, f"trace_id must be 32 lowercase hex digits, got {trace_id!r}")
    return dashboard_data.trace_view(trace_id, telemetry.recent_logs().of_trace(trace_id))
