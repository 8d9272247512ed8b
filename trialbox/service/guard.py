"""`Guard`: the ASGI middleware every request passes first.

In order: count the request; without a token, the `Host` (and, on a state-changing
request, the `Origin`) must name this server (`ServiceConfig.host_names`: the bound
address, localhost, 127.0.0.1, ::1, `allowed_hosts`) — a web page whose name was
rebound to 127.0.0.1 gets 403 (with a token the token is the guard: such a page cannot
send it); the bearer token (when configured; `Authorization: Bearer`, or `X-API-KEY` as
the E2B SDK sends it; `/healthz`, `/readyz` and `ServiceState.open_paths` are exempt,
`ServiceState.own_auth_paths` check a credential of their own); the body size
(Content-Length checked before anything is read and answered 413 at once, the
connection then closed; a chunked body counted as it arrives); the per-client token
bucket (client: its address, an IPv6 one by its /64 — never a header the client
chooses); then the request's deadline is fixed
(`X-Deadline-S`, capped by the config) and put in `request.state.deadline` (a
`time.monotonic()` instant) for handlers, which stop their sandbox runs at it and answer
504, and the client in `request.state.client`. A body that stalls for
`read_timeout_s` between two pieces is answered 408 (slow headers: connection.py). As a
backstop, a handler still running `BACKSTOP_S` after its deadline is cancelled here and
answered 504.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import math
import time
from typing import Any
from urllib.parse import urlsplit

from fastapi import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from trialbox.service.config import host_name
from trialbox.service.state import ServiceState

BACKSTOP_S = 5.0
OPEN_PATHS = ("/healthz", "/readyz")
MAX_BUCKETS = 10_000
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")


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
    # `code` repeats the status: E2B's SDK parses refusals as {"code", "message"}
    data = json.dumps({**body, "code": status}).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": data})


class RateLimiter:
    """One `TokenBucket` per client key, at most `MAX_BUCKETS` of them.

    When the table is full, only buckets that have refilled to their burst are dropped —
    a dropped bucket is exactly a new one, so dropping it gives no one anything. When
    none has (more than MAX_BUCKETS clients busy at once), newcomers share one overflow
    bucket: a flood of new clients can neither reset anyone's bucket nor get fresh ones."""

    def __init__(self, rate: float, burst: float, max_buckets: int = MAX_BUCKETS):
        self.rate, self.burst, self.max_buckets = rate, burst, max_buckets
        self.buckets: dict[str, TokenBucket] = {}
        self.overflow = TokenBucket(rate, burst)

    def take(self, key: str) -> float:
        """0.0 when `key` may go on; otherwise seconds until it may."""
        bucket = self.buckets.get(key)
        if bucket is None:
            if len(self.buckets) >= self.max_buckets:
                self._drop_full()
            if len(self.buckets) >= self.max_buckets:
                return self.overflow.take()
            bucket = self.buckets[key] = TokenBucket(self.rate, self.burst)
        return bucket.take()

    def _drop_full(self) -> None:
        now = time.monotonic()
        full = [k for k, b in self.buckets.items()
                if b.tokens + (now - b.at) * b.rate >= b.burst]
        for k in full:
            del self.buckets[k]


def client_key(scope: Scope) -> str:
    """Who a request is from, for limits: its address (an IPv4-mapped IPv6 address as
    IPv4, any other IPv6 address by its /64: one host holds a whole /64)."""
    client = scope.get("client")
    if not client:
        return "?"
    try:
        addr = ipaddress.ip_address(client[0])
    except ValueError:  # a unix socket's path, or a name
        return str(client[0])
    if isinstance(addr, ipaddress.IPv6Address):
        if addr.ipv4_mapped is not None:
            return str(addr.ipv4_mapped)
        return str(ipaddress.IPv6Network((addr, 64), strict=False))
    return str(addr)


def _port(netloc: str, scheme: str) -> str:
    """The port of a `host[:port]` value, or the scheme's default."""
    rest = netloc.rpartition("]")[2] if netloc.startswith("[") else netloc
    _, colon, port = rest.partition(":")
    return port if colon and port else ("443" if scheme == "https" else "80")


def refused_origin(config: Any, headers: dict[str, str], method: str) -> tuple[str, str]:
    """("host" | "origin", message) when, without a token, the request's `Host` does not
    name this server, or a state-changing request's `Origin` is another site; ("", "")
    when it may go on."""
    names = config.host_names
    shown = ", ".join(sorted(names))
    host = headers.get("host")
    if host is not None and host_name(host) not in names:
        return "host", (f"Host {host!r} is not a name this server answers to without a "
                        f"token ({shown}): reach it by one of those, add the name with "
                        "--allowed-host NAME (TRIALBOX_ALLOWED_HOSTS), or start the "
                        "server with --token")
    origin = headers.get("origin")
    if origin is None or method in SAFE_METHODS:
        return "", ""
    parts = urlsplit(origin) if origin != "null" else None
    if parts is not None and parts.netloc:
        name = host_name(parts.netloc)
        configured = {host_name(n) for n in config.allowed_hosts}
        same_port = _port(parts.netloc, parts.scheme) == _port(host or "", "http")
        if name in configured or (name in names and same_port):
            return "", ""
    return "origin", (f"a {method} from a page of {origin!r} is refused: without a token "
                      "only pages of this server may change anything. Send it without an "
                      "Origin header (any HTTP client does), from this server's own pages, "
                      "add the page's host with --allowed-host NAME, or start the server "
                      "with --token")


class Guard:
    def __init__(self, app: ASGIApp, state: ServiceState):
        self.app, self.state = app, state
        self.limiter = RateLimiter(state.config.rate_per_s, state.config.rate_burst)

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

        if not config.token:
            kind, why = refused_origin(config, headers, scope.get("method", "GET"))
            if kind:
                counters.rejected[kind] += 1
                await send_json(counted_send, 403, {"error": f"{kind}_not_allowed",
                                                    "message": why})
                return

        own_auth = any(path == p or (p.endswith("/") and path.startswith(p))
                       for p in state.own_auth_paths)
        if config.token and not exempt and not own_auth:
            given = headers.get("authorization", "")
            scheme, _, value = given.partition(" ")
            if "x-api-key" in headers:  # the E2B SDK's carrier of the same token
                scheme, value = "bearer", headers["x-api-key"]
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
                f"the limit of {limit} bytes; send less (e.g. fewer or smaller files)"},
                {"Connection": "close"})  # the body is never read
            return

        key = client_key(scope)
        wait = 0.0
        if not exempt:  # probes and open pages neither pay nor are limited
            wait = self.limiter.take(key)
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
        scope["state"]["client"] = key

        seen = 0
        body_done = False

        async def limited_receive() -> Message:
            nonlocal seen, body_done
            if body_done:  # after the body: waiting for a disconnect is no slow client
                return await receive()
            try:
                async with asyncio.timeout(config.read_timeout_s):
                    message = await receive()
            except TimeoutError:
                counters.rejected["slow"] += 1
                raise HTTPException(408, f"the request body stalled for more than "
                                    f"{config.read_timeout_s:g} s; send it without pauses",
                                    headers={"Connection": "close"}) from None
            body_done = message["type"] != "http.request" or not message.get("more_body")
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    counters.rejected["size"] += 1
                    raise HTTPException(413, f"request body is over the limit of {limit} "
                                        "bytes; send less", headers={"Connection": "close"})
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
