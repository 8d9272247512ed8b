"""`Guard`: the ASGI middleware every request passes first.

In order: count the request; the bearer token (when configured; `/healthz`, `/readyz`
and `ServiceState.open_paths` are exempt); the body size (Content-Length checked before
anything is read, a chunked body counted as it arrives); the per-client token bucket;
then the request's deadline is fixed (`X-Deadline-S`, capped by the config) and put
in `request.state.deadline` (a `time.monotonic()` instant) for handlers, which stop
their sandbox runs at it and answer 504. As a backstop, a handler still running
`BACKSTOP_S` after its deadline is cancelled here and answered 504.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import math
import time
from typing import Any

from fastapi import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from trialbox.service.state import ServiceState

BACKSTOP_S = 5.0
OPEN_PATHS = ("/healthz", "/readyz")
MAX_BUCKETS = 10_000


class TokenBucket:
    """`rate` tokens per second up to `burst`; one request takes one."""

    __slots__ = ("rate", "burst", "tokens", "at")

    def __init__(self, rate: float, burst: float):
        self.rate, self.burst = rate, burst
        self.tokens, self.at = burst, time.monotonic()

    def take(self) -> float:
        """0.0 when a token was taken; otherwise seconds until one is available."""
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens >= 1:
            self.tokens -= 1
            return 0.0
        return (1 - self.tokens) / self.rate


async def send_json(send: Send, status: int, body: dict[str, Any],
                    headers: dict[str, str] | None = None) -> None:
    data = json.dumps(body).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": data})


class Guard:
    def __init__(self, app: ASGIApp, state: ServiceState):
        self.app, self.state = app, state
        self.buckets: dict[str, TokenBucket] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state, config = self.state, self.state.config
        counters = state.counters
        counters.requests += 1
        started = False

        async def counted_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                counters.responses[message["status"]] += 1
            await send(message)

        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope.get("headers", [])}
        path: str = scope.get("path", "")
        exempt = path in OPEN_PATHS or any(path.startswith(p) for p in state.open_paths)

        if config.token and not exempt:
            given = headers.get("authorization", "")
            scheme, _, value = given.partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(
                    value.strip().encode(), config.token.encode()):
                counters.rejected["auth"] += 1
                await send_json(counted_send, 401, {
                    "error": "auth", "message": "missing or wrong bearer token; send "
                    "'Authorization: Bearer <token>' (the token the server was started "
                    "with)"}, {"WWW-Authenticate": "Bearer"})
                return

        limit = config.max_body_bytes
        length = headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > limit):
            counters.rejected["size"] += 1
            await send_json(counted_send, 413, {
                "error": "too_large", "message": f"request body of {length} bytes is over "
                f"the limit of {limit} bytes; send less (e.g. fewer or smaller files)"})
            return

        client = scope.get("client")
        key = (headers.get("authorization", "") + "|" + (client[0] if client else "?"))
        wait = 0.0
        if not exempt:  # probes and open pages neither pay nor are limited
            bucket = self.buckets.get(key)
            if bucket is None:
                if len(self.buckets) >= MAX_BUCKETS:
                    self.buckets.clear()  # a flood of distinct clients: start afresh
                bucket = self.buckets[key] = TokenBucket(config.rate_per_s,
                                                         config.rate_burst)
            wait = bucket.take()
        if wait > 0:
            counters.rejected["rate"] += 1
            await send_json(counted_send, 429, {
                "error": "rate_limited", "message": f"more than {config.rate_per_s:g} "
                f"requests/s (burst {config.rate_burst}) from this client; slow down"},
                {"Retry-After": str(max(1, math.ceil(wait)))})
            return

        deadline_s = config.deadline_s
        asked = headers.get("x-deadline-s")
        if asked is not None:
            try:
                value = float(asked)
                if not (math.isfinite(value) and value > 0):
                    raise ValueError
            except ValueError:
                counters.rejected["usage"] += 1
                await send_json(counted_send, 400, {
                    "error": "usage", "field": "X-Deadline-S", "message": "X-Deadline-S "
                    f"must be a positive number of seconds, got {asked!r}"})
                return
            deadline_s = min(deadline_s, value)
        scope.setdefault("state", {})["deadline"] = time.monotonic() + deadline_s

        seen = 0

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    counters.rejected["size"] += 1
                    raise HTTPException(413, f"request body is over the limit of {limit} "
                                        "bytes; send less")
            return message

        try:
            async with asyncio.timeout(deadline_s + BACKSTOP_S):
                await self.app(scope, limited_receive, counted_send)
        except TimeoutError:
            counters.deadline_expired += 1
            if not started:
                await send_json(counted_send, 504, {
                    "error": "deadline", "message": f"the request's deadline of "
                    f"{deadline_s:g} s passed; its work was cancelled"})
