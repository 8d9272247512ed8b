"""The FastAPI application: `create_app(config)` builds one server process's app.

    app = create_app(ServiceConfig())
    uvicorn.run(app, host="127.0.0.1", port=8080)   # or: trialbox serve

Shared state lives on `app.state` (see `ServiceState` in state.py for every field):

    app.state.service   the ServiceState: config, provider, admission (the scheduler
                        and its queue depth), sessions, submissions, counters,
                        started, ready
    app.state.config    the ServiceConfig (same object as app.state.service.config)
    app.state.counters  the Counters (same object as app.state.service.counters)
    app.state.pool      the SandboxProvider, set when the lifespan has started it
                        (None before)

Layers, outermost first: `Guard` (auth, body size, per-client rate limit, the request's
deadline, response counting; guard.py) → the routes (every sandbox-using one through
the journaled scheduler at the interactive priority; admission.py): `/healthz`, `/readyz`, native
`/v1` (v1.py), SandboxFusion-compatible `/run_code` (fusion.py), the E2B SDK's
`/sandboxes` and envd API (e2b.py, e2b_envd.py). Errors become JSON
bodies `{"error": kind, "message": …, "field": …}` (errors.py): a caller's mistake is
4xx, broken machinery 503 with Retry-After, an expired deadline 504.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from trialbox.sandbox.base import SandboxProvider
from trialbox.service import dashboard, e2b, errors, fusion, jupyter, v1
from trialbox.service.config import ServiceConfig
from trialbox.service.guard import Guard
from trialbox.service.state import ServiceState

log = logging.getLogger("trialbox.service")

REAP_EVERY_S = 5.0
"""How often idle sessions are looked for and closed."""


def create_app(config: ServiceConfig | None = None,
               provider: SandboxProvider | None = None, grader: Any = None) -> FastAPI:
    """The app for one server process. Every sandbox comes from one `SandboxProvider`:
    `provider` when given (the caller starts and closes it), else the lifespan starts
    the provider of `config.tier` — the namespace tier's CellPool by default (with the
    judge's helper modules preloaded, so runs and grading share it) — and closes it.
    The lifespan also starts the scheduler every sandbox-using request goes through,
    and on shutdown closes every open session. `grader` (started and closed by the
    caller): submissions are graded there instead. With `--backend ray` both come from
    cluster/serving.py and no pool is started here (every sandbox is on a node)."""
    config = config or ServiceConfig()
    state = ServiceState.create(config)
    state.grader = grader

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        own = provider is None
        chosen = provider if provider is not None else await _start_tier(config)
        try:
            await state.admission.start(chosen)
        except BaseException:
            if own:
                await _close(chosen)
            raise
        state.provider = app.state.pool = chosen
        state.ready = True
        reaper = asyncio.create_task(_reap_idle_sessions(state))
        try:
            yield
        finally:
            state.ready = False
            reaper.cancel()
            for session in state.sessions.drain():
                await session.sandbox.close()
                state.counters.sessions_closed += 1
            await state.admission.close()
            if own:
                await _close(chosen)
            state.provider = app.state.pool = None

    app = FastAPI(title="trialbox", version="0.1.0", lifespan=lifespan,
                  description="Sandboxed execution and trusted grading of model-written "
                  "code. Native API under /v1; SandboxFusion-compatible POST /run_code.")
    app.state.service = state
    app.state.config = config
    app.state.counters = state.counters
    app.state.pool = None

    errors.install(app)

    @app.get("/healthz", tags=["health"])
    async def healthz() -> dict[str, object]:
        """Liveness: the process answers. Never needs the token."""
        return {"status": "ok"}

    @app.get("/readyz", tags=["health"])
    async def readyz() -> JSONResponse:
        """Readiness: the sandbox provider is running (503 while starting or stopping).
        Never needs the token."""
        provider = state.provider
        if not state.ready or provider is None or getattr(provider, "closed", False):
            return JSONResponse({"status": "not ready",
                                 "reason": "sandbox provider not running"},
                                status_code=503, headers={"Retry-After": "1"})
        why = getattr(provider, "unavailable", lambda: "")()
        if why:  # --backend ray: no live node offers the tier
            return JSONResponse({"status": "not ready", "reason": why},
                                status_code=503, headers={"Retry-After": "5"})
        return JSONResponse({"status": "ready", "tier": provider.tier,
                             "warm_cells": getattr(provider, "ready_count", 0),
                             "running": state.admission.running,
                             "queued": state.admission.waiting,
                             "sessions": len(state.sessions)})

    app.include_router(v1.router)
    app.include_router(fusion.router)
    app.include_router(jupyter.router)
    e2b.install(app, state)  # the E2B SDK's control API and envd API (e2b.py, e2b_envd.py)
    app.add_middleware(Guard, state=state)

    # -- telemetry and dashboard mount here (telemetry owner) --
    # /, /runs, /traces, /review, /api/dashboard, /api/review, /metrics, /static and a
    # span per request (X-Trace-Id); behind the same Guard (token) as everything else.
    dashboard.install(app)
    # Read shared state from app.state (see the module docstring). Middleware added here
    # runs *outside* Guard (Starlette: added last = outermost), so it sees refused
    # requests too. Paths that must work without the bearer token (a public dashboard):
    # add them to `state.open_paths` (prefixes).

    return app


async def _start_tier(config: ServiceConfig) -> SandboxProvider:
    """The provider of `config.tier`, started."""
    if config.tier == "namespace":
        from trialbox.judge.function import judge_pool_config
        from trialbox.sandbox.pool import CellPool
        return await CellPool(judge_pool_config(
            warm=config.warm, max_warm=max(config.warm, 2 * config.max_running))).start()
    provider: SandboxProvider
    if config.tier == "gvisor":
        from trialbox.sandbox.gvisor import GVisorProvider
        provider = GVisorProvider()
    else:
        from trialbox.sandbox.container import ContainerProvider
        provider = ContainerProvider()
    start = getattr(provider, "start", None)
    if start is not None:
        await start()
    return provider


async def _close(provider: SandboxProvider) -> None:
    close = getattr(provider, "close", None)
    if close is not None:
        await close()


async def _reap_idle_sessions(state: ServiceState) -> None:
    while True:
        await asyncio.sleep(REAP_EVERY_S)
        for session in state.sessions.idle():
            log.info("closing session %s: idle for more than %g s", session.id,
                     state.config.session_idle_s)
            try:
                await session.sandbox.close()
            except Exception:  # one broken session must not stop the reaper
                log.exception("closing idle session %s failed", session.id)
            state.counters.sessions_closed += 1
