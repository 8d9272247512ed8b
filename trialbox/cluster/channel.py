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


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readexactly(_LEN.size)
    (n,) = _LEN.unpack(head)
    if n > MAX_FRAME:
        raise ValueError(f"frame of {n} bytes is over the {MAX_FRAME} limit")
    return await reader.readexactly(n)


def _frame(obj: Any) -> bytes:
    body = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return _LEN.pack(len(body)) + body


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
        self._conns: set[asyncio.Task[None]] = set()
        self.refused = 0
        """Connections closed for a wrong token or a malformed frame."""

    async def start(self) -> dict[str, Any]:
        self._server = await asyncio.start_server(self._serve, self.host, 0)
        port = self._server.sockets[0].getsockname()[1]
        return {"host": self.host, "port": port, "token": self.token.hex()}

    async def _serve(self, reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        tasks: set[asyncio.Task[None]] = set()
        try:
            try:
                got = await asyncio.wait_for(reader.readexactly(TOKEN_BYTES),
                                             AUTH_TIMEOUT_S)
            except (asyncio.IncompleteReadError, TimeoutError, OSError):
                self.refused += 1
                return
            if not hmac.compare_digest(got, self.token):
                self.refused += 1
                log.warning("%s channel: a connection from %s offered a wrong token; "
                            "closed", self.label, writer.get_extra_info("peername"))
                return
            with contextlib.suppress(OSError):
                sock = writer.get_extra_info("socket")
                if sock is not None:
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while True:
                try:
                    rid, args = pickle.loads(await _read_frame(reader))
                except (asyncio.IncompleteReadError, ConnectionError):
                    return  # the driver went away
                except Exception as e:  # a frame we cannot read: the stream is lost
                    self.refused += 1
                    log.warning("%s channel: unreadable frame (%s); connection closed",
                                self.label, e)
                    return
                t = asyncio.get_running_loop().create_task(self._answer(rid, args,
                                                                        writer))
                tasks.add(t)
                t.add_done_callback(tasks.discard)
        finally:
            for t in tasks:
                t.cancel()
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
            self._conns.discard(task)

    async def _answer(self, rid: int, args: Any, writer: asyncio.StreamWriter) -> None:
        try:
            out: tuple[int, bool, Any] = (rid, True, await self.handler(args))
        except asyncio.CancelledError:
            raise
        except TrialboxError as e:
            out = (rid, False, e)
        except Exception as e:  # the node's own failure: infrastructure, said plainly
            out = (rid, False, InfraError(f"{self.label}: {type(e).__name__}: {e}"))
        try:
            data = _frame(out)
        except Exception as e:  # an answer that does not pickle is the node's failure
            data = _frame((rid, False, InfraError(
                f"{self.label}: answer could not be sent: {type(e).__name__}: {e}")))
        if writer.is_closing():
            return
        writer.write(data)
        with contextlib.suppress(ConnectionError):
            await writer.drain()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for t in list(self._conns):
            t.cancel()
        await asyncio.gather(*self._conns, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None


class ChannelClient:
    """The driver's end: one connection, calls multiplexed by request id."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 label: str):
        self.label = label
        self._reader = reader
        self._writer = writer
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._closed: str | None = None
        self._task = asyncio.get_running_loop().create_task(self._read())

    @classmethod
    async def connect(cls, where: dict[str, Any], timeout: float,
                      label: str = "node") -> ChannelClient:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(where["host"], int(where["port"])), timeout)
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        writer.write(bytes.fromhex(where["token"]))
        await writer.drain()
        return cls(reader, writer, label)

    @property
    def closed(self) -> bool:
        return self._closed is not None

    def send(self, args: Any) -> asyncio.Future[Any]:
        """Write `args` to the node now (no task, no loop turn before the bytes leave)
        and return the future of its answer: the node's value, or its exception as
        raised there (a `TrialboxError`; anything else arrives as `InfraError`);
        `ChannelClosed` if the connection is (or goes) down first. Cancelling the
        future forgets the call (a late answer is dropped)."""
        if self._closed is not None:
            raise ChannelClosed(f"{self.label}: channel closed ({self._closed})")
        rid = next(self._ids)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        try:
            self._writer.write(_frame((rid, args)))
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
            await self._writer.drain()
        except (ConnectionError, OSError) as e:
            self._fail(f"{type(e).__name__}: {e}")

    async def call(self, args: Any) -> Any:
        """`send`, then wait for the answer."""
        fut = self.send(args)
        await self.drained()
        return await fut

    async def _read(self) -> None:
        why = "closed by the node"
        try:
            while True:
                rid, ok, value = pickle.loads(await _read_frame(self._reader))
                fut = self._pending.get(rid)
                if fut is None or fut.done():
                    continue  # its caller gave up (cancelled): nobody waits for it
                if ok:
                    fut.set_result(value)
                else:
                    fut.set_exception(value)
        except asyncio.CancelledError:
            why = "closed by the driver"
            raise
        except (asyncio.IncompleteReadError, ConnectionError, OSError) as e:
            why = f"{type(e).__name__}" if not isinstance(
                e, asyncio.IncompleteReadError) else "closed by the node"
        except Exception as e:  # an unreadable frame: the stream cannot be trusted on
            why = f"unreadable frame: {type(e).__name__}: {e}"
        finally:
            self._fail(why)

    def _fail(self, why: str) -> None:
        if self._closed is None:
            self._closed = why
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(ChannelClosed(f"{self.label}: channel closed ({why})"))
        self._pending.clear()
        if not self._writer.is_closing():
            self._writer.close()

    async def close(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        self._fail("closed by the driver")
