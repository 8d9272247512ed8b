"""ASGI middleware: one span per HTTP request, its trace id in the `X-Trace-Id` response
header, so a client (or the dashboard) can go from a response to its trace and logs.

Pure ASGI (no framework import): wrap any app, e.g. `app.add_middleware(TraceRequests)`.
Static files and `/metrics` scrapes are not traced (they would crowd out the traces of
real work in the dashboard's bounded span store).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from trialbox.telemetry.tracing import current_ids, span

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

UNTRACED = ("/static/", "/metrics", "/api/dashboard", "/healthz", "/readyz", "/favicon")


class TraceRequests:
    def __init__(self, app: ASGIApp, untraced: tuple[str, ...] = UNTRACED):
        self.app = app
        self.untraced = untraced

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = str(scope.get("path", ""))
        if scope["type"] != "http" or path.startswith(self.untraced):
            await self.app(scope, receive, send)
            return
        method = str(scope.get("method", ""))
        with span(f"HTTP {method}", {"http.method": method, "http.target": path}) as sp:
            if sp is None:
                await self.app(scope, receive, send)
                return
            ids = current_ids()
            trace_header = (b"x-trace-id", ids[0].encode()) if ids else None

            async def send_with_id(message: Message) -> None:
                if message["type"] == "http.response.start":
                    sp.set_attribute("http.status_code", int(message["status"]))
                    if trace_header is not None:
                        message["headers"] = [*message.get("headers", ()), trace_header]
                await send(message)

            await self.app(scope, receive, send_with_id)
