"""The hot path between the driver and a node: one TCP connection per node, beside Ray.

Ray places the node actors, watches their health, loads workloads and closes them; a
piece of work (`Node.run`) goes over this channel instead of a Ray actor call. Why: on
the project's machine a Ray actor call costs ~1.6 ms of round trip and ~1 ms of CPU
across the driver's and the actor's core workers (`trialbox bench cluster`, BENCHMARKS.md),
more than the whole ≤ 1 ms a judged attempt may add over the local backend; a frame on a
socket the node's event loop already watches costs a few hundred microseconds.

    server = ChannelServer(handler, host)        # on the node (inside its actor)
    where = await server.start()                 # {"host", "port", "token"}: via Ray
    client = await ChannelClient.connect(where, timeout=5)   # on the driver
    answer = await client.call(args)             # handler(args) on the node

Frames are a 4-byte big-endian length and a pickle: `(request_id, args)` one way,
`(request_id, ok, value)` the other. Both ends are trialbox's own processes (the driver
and a node of the same code fingerprint), which is why pickle is acceptable — but the
port is on the node's network, so nothing is unpickled before the client proved it knows
the token the node handed the driver through Ray (32 random bytes, the first thing on
the connection, compared in constant time). The token is as secret as Ray's own traffic:
on a network where that is not enough, run Ray with TLS and set `ClusterConfig.channel`
to "ray".

Failure semantics are the backend's: a connection that breaks fails every call in flight
with `ChannelClosed` and the driver treats the node as lost (its leases fenced, the
work re-queued elsewhere); an answer that arrives for a lease already fenced is dropped
by the backend exactly as a late Ray answer is.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import itertools
import logging
import pickle
import secrets
import socket
import struct
from collections.abc import Awaitable, Callable
from typing import Any

from trialbox.errors import InfraError, TrialboxError

log = logging.getLogger("trialbox.cluster")

TOKEN_BYTES = 32
MAX_FRAME = 1 << 30
"""A frame past 1 GiB is refused (the connection closed): no payload or answer of a
judging comes near it; a corrupt length must not allocate the node's memory."""
AUTH_TIMEOUT_S = 5.0
_LEN = struct.Struct(">I")


class ChannelClosed(InfraError):
    """The connection to a node broke (its process died, the network cut it, the node
    closed): every call in flight fails with this; the backend treats the node as lost."""


def _frame(obj: Any) -> bytes:
    body = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return _LEN.pack(len(body)) + body


class _Frames:
    """Length-prefixed frames out of a byte stream, as they complete. Both ends are
    `asyncio.Protocol`s parsing in `data_received`, not stream readers: no reader task to
    wake per frame. Measured in session 12 (BENCHMARKS.md, `scripts/channel_echo_ab.py`),
    the two alternating in one run: a ~700-byte call echoed over loopback, 4 in flight,
    cost 30-40 µs of the caller's CPU and 26-31 µs of the server's as protocols, against
    38-58 and ~48 µs with asyncio streams."""

    def __init__(self) -> None:
        self.buf = bytearray()

    def feed(self, data: bytes) -> None:
        self.buf += data

    def next(self) -> bytearray | None:
        """The next whole frame's body, or None until more bytes come. ValueError for a
        length past MAX_FRAME (checked before anything is held for it)."""
        buf = self.buf
        if len(buf) < _LEN.size:
            return None
        (n,) = _LEN.unpack_from(buf)
        if n > MAX_FRAME:
            raise ValueError(f"frame of {n} bytes is over the {MAX_FRAME} limit")
        if len(buf) < _LEN.size + n:
            return None
        body = buf[_LEN.size:_LEN.size + n]
        del buf[:_LEN.size + n]
        return body


class _FlowControl(asyncio.Protocol):
    """`drain()` for a protocol: waits while the transport's send buffer is over its
    high-water mark (pause_writing .. resume_writing); at once otherwise."""

    def __init__(self) -> None:
        self._paused = False
        self._drain_waiters: list[asyncio.Future[None]] = []

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self._wake_drainers(None)

    def _wake_drainers(self, exc: BaseException | None) -> None:
        waiters, self._drain_waiters = self._drain_waiters, []
        for w in waiters:
            if not w.done():
                if exc is None:
                    w.set_result(None)
                else:
                    w.set_exception(exc)

    async def _drain(self) -> None:
        if not self._paused:
            return
        w = asyncio.get_running_loop().create_future()
        self._drain_waiters.append(w)
        await w


class ChannelServer:
    """Serves `handler(args)` for authenticated connections on `host` (port chosen by
    the kernel). Each request runs as its own task: answers go back as they finish."""

    def __init__(self, handler: Callable[[Any], Awaitable[Any]], host: str,
                 label: str = "node"):
        self.handler = handler
        self.host = host
        self.label = label
        self.token = secrets.token_bytes(TOKEN_BYTES)
        self._server: asyncio.Server | None = None
        self._conns: set[_ServerConnection] = set()
        self.refused = 0
        """Connections closed for a wrong token or a malformed frame."""

    async def start(self) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _ServerConnection(self),
                                                self.host, 0)
        port = self._server.sockets[0].getsockname()[1]
        return {"host": self.host, "port": port, "token": self.token.hex()}

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        tasks = []
        for conn in list(self._conns):
            tasks += conn.abort()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None


class _ServerConnection(_FlowControl):
    """One driver's connection to the node: the token first (nothing is unpickled before
    it), then request frames, each answered by its own task."""

    def __init__(self, server: ChannelServer):
        super().__init__()
        self.server = server
        self.frames = _Frames()
        self.authed = False
        self.tasks: set[asyncio.Task[None]] = set()
        self.transport: asyncio.Transport | None = None
        self._auth_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.server._conns.add(self)
        with contextlib.suppress(OSError):
            sock = transport.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._auth_timer = asyncio.get_running_loop().call_later(
            AUTH_TIMEOUT_S, self._refuse, None)

    def _refuse(self, why: str | None) -> None:
        """Close for a missing/wrong token (why None: it did not come in time) or an
        unreadable frame."""
        self.server.refused += 1
        if why is not None:
            log.warning("%s channel: %s; connection closed", self.server.label, why)
        assert self.transport is not None
        self.transport.close()

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        if self.transport.is_closing():
            return
        self.frames.feed(data)
        if not self.authed:
            buf = self.frames.buf
            if len(buf) < TOKEN_BYTES:
                return
            got = bytes(buf[:TOKEN_BYTES])
            del buf[:TOKEN_BYTES]
            if self._auth_timer is not None:
                self._auth_timer.cancel()
            if not hmac.compare_digest(got, self.token):
                self._refuse(f"a connection from "
                             f"{self.transport.get_extra_info('peername')} offered a "
                             "wrong token")
                return
            self.authed = True
        loop = asyncio.get_running_loop()
        while True:
            try:
                body = self.frames.next()
                if body is None:
                    return
                rid, args = pickle.loads(body)
            except Exception as e:  # a frame we cannot read: the stream is lost
                self._refuse(f"unreadable frame ({e})")
                return
            t = loop.create_task(self._answer(rid, args))
            self.tasks.add(t)
            t.add_done_callback(self.tasks.discard)

    @property
    def token(self) -> bytes:
        return self.server.token

    async def _answer(self, rid: int, args: Any) -> None:
        label = self.server.label
        try:
            out: tuple[int, bool, Any] = (rid, True, await self.server.handler(args))
        except asyncio.CancelledError:
            raise
        except TrialboxError as e:
            out = (rid, False, e)
        except Exception as e:  # the node's own failure: infrastructure, said plainly
            out = (rid, False, InfraError(f"{label}: {type(e).__name__}: {e}"))
        try:
            data = _frame(out)
        except Exception as e:  # an answer that does not pickle is the node's failure
            data = _frame((rid, False, InfraError(
                f"{label}: answer could not be sent: {type(e).__name__}: {e}")))
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        transport.write(data)
        with contextlib.suppress(ConnectionError):
            await self._drain()

    def connection_lost(self, exc: Exception | None) -> None:
        # the driver went away (or we closed): requests still running are cancelled
        self.abort()
        self._wake_drainers(ConnectionError("connection lost"))

    def abort(self) -> list[asyncio.Task[None]]:
        """Close the connection, cancel its requests; the tasks to wait for."""
        if self._auth_timer is not None:
            self._auth_timer.cancel()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()
        self.server._conns.discard(self)
        tasks = list(self.tasks)
        for t in tasks:
            t.cancel()
        return tasks


class ChannelClient(_FlowControl):
    """The driver's end: one connection, calls multiplexed by request id."""

    def __init__(self, label: str):
        super().__init__()
        self.label = label
        self._transport: asyncio.Transport | None = None
        self._frames = _Frames()
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._closed: str | None = None

    @classmethod
    async def connect(cls, where: dict[str, Any], timeout: float,
                      label: str = "node") -> ChannelClient:
        loop = asyncio.get_running_loop()
        transport, client = await asyncio.wait_for(loop.create_connection(
            lambda: cls(label), where["host"], int(where["port"])), timeout)
        assert isinstance(transport, asyncio.Transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        transport.write(bytes.fromhex(where["token"]))
        return client

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    @property
    def closed(self) -> bool:
        return self._closed is not None

    def send(self, args: Any) -> asyncio.Future[Any]:
        """Write `args` to the node now (no task, no loop turn before the bytes leave)
        and return the future of its answer: the node's value, or its exception as
        raised there (a `TrialboxError`; anything else arrives as `InfraError`);
        `ChannelClosed` if the connection is (or goes) down first. Cancelling the
        future forgets the call (a late answer is dropped)."""
        if self._closed is not None or self._transport is None:
            raise ChannelClosed(f"{self.label}: channel closed ({self._closed})")
        rid = next(self._ids)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        try:
            self._transport.write(_frame((rid, args)))
        except (ConnectionError, OSError) as e:
            self._fail(f"{type(e).__name__}: {e}")
            raise ChannelClosed(f"{self.label}: channel closed ({self._closed})") from e
        self._pending[rid] = fut
        fut.add_done_callback(lambda _f: self._pending.pop(rid, None))
        return fut

    async def drained(self) -> None:
        """Wait while the connection's send buffer is over its high-water mark (a burst
        of calls bigger than the socket takes at once); at once otherwise."""
        try:
            await self._drain()
        except (ConnectionError, OSError) as e:
            self._fail(f"{type(e).__name__}: {e}")

    async def call(self, args: Any) -> Any:
        """`send`, then wait for the answer."""
        fut = self.send(args)
        await self.drained()
        return await fut

    def data_received(self, data: bytes) -> None:
        if self._closed is not None:
            return
        self._frames.feed(data)
        while True:
            try:
                body = self._frames.next()
                if body is None:
                    return
                rid, ok, value = pickle.loads(body)
            except Exception as e:  # an unreadable frame: the stream cannot be trusted on
                self._fail(f"unreadable frame: {type(e).__name__}: {e}")
                return
            fut = self._pending.get(rid)
            if fut is None or fut.done():
                continue  # its caller gave up (cancelled): nobody waits for it
            if ok:
                fut.set_result(value)
            else:
                fut.set_exception(value)

    def eof_received(self) -> bool:
        self._fail("closed by the node")
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail("closed by the node" if exc is None else type(exc).__name__)
        self._wake_drainers(ConnectionError("connection lost"))

    def _fail(self, why: str) -> None:
        if self._closed is None:
            self._closed = why
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(ChannelClosed(f"{self.label}: channel closed ({why})"))
        self._pending.clear()
        if self._transport is not None and not self._transport.is_closing():
            self._transport.close()

    async def close(self) -> None:
        self._fail("closed by the driver")
