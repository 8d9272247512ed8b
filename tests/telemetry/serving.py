"""A real uvicorn server on a free loopback port, in a thread of this process, for the
dashboard's tests (the metrics it reads are this process's)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn
from fastapi import FastAPI

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
