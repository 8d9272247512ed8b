"""The driver-to-node channel (trialbox/cluster/channel.py) on a real socket, no Ray:
answers and errors as the node raised them, calls multiplexed out of order, a broken
connection failing what is in flight, and nothing unpickled from a client that did not
prove the token."""

from __future__ import annotations

import asyncio
import os
import pickle
import socket
import struct
from pathlib import Path
from typing import Any

import pytest

from trialbox.cluster.channel import ChannelClient, ChannelClosed, ChannelServer
from trialbox.errors import InfraError, UsageError


async def handler(args: Any) -> Any:
    kind, value = args
    if kind == "echo":
        return value
    if kind == "sleep":
        await asyncio.sleep(value)
        return value
    if kind == "usage":
        raise UsageError(value)
    if kind == "bug":
        raise KeyError(value)
    if kind == "unpicklable":
        return lambda: None
    raise AssertionError(kind)


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 30))


def test_answers_errors_and_out_of_order_calls() -> None:
    async def body() -> None:
        server = ChannelServer(handler, "127.0.0.1", label="node t")
        where = await server.start()
        client = await ChannelClient.connect(where, timeout=5, label="node t")
        try:
            assert await client.call(("echo", {"a": [1, 2]})) == {"a": [1, 2]}
            with pytest.raises(UsageError, match="change this"):
                await client.call(("usage", "change this"))
            with pytest.raises(InfraError, match="node t: KeyError"):
                await client.call(("bug", "k"))
            with pytest.raises(InfraError, match="could not be sent"):
                await client.call(("unpicklable", None))
            # the slow one was sent first and answers last: nobody waits behind it
            done: list[float] = []

            async def one(s: float) -> None:
                done.append(await client.call(("sleep", s)))
            await asyncio.gather(one(0.3), one(0.0), one(0.1))
            assert done == [0.0, 0.1, 0.3]
            # a caller that gave up: its answer comes and is dropped, the next is fine
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(client.call(("sleep", 0.2)), 0.05)
            await asyncio.sleep(0.3)
            assert await client.call(("echo", 7)) == 7
        finally:
            await client.close()
            await server.close()
    run(body())


def test_a_broken_connection_fails_calls_in_flight_and_after() -> None:
    async def body() -> None:
        server = ChannelServer(handler, "127.0.0.1")
        where = await server.start()
        client = await ChannelClient.connect(where, timeout=5)
        slow = asyncio.ensure_future(client.call(("sleep", 5)))
        await asyncio.sleep(0.2)
        await server.close()  # the node goes: its connections are cut
        with pytest.raises(ChannelClosed):
            await slow
        assert client.closed
        with pytest.raises(ChannelClosed):
            await client.call(("echo", 1))
        await client.close()
    run(body())


def test_frames_bigger_than_the_socket_buffers_arrive_whole_both_ways() -> None:
    """Frames of several MiB, several at once (the sender's buffer fills: flow control
    pauses and resumes it), and frames split across reads at every size: each answer
    whole and to its own caller."""
    async def body() -> None:
        server = ChannelServer(handler, "127.0.0.1")
        where = await server.start()
        client = await ChannelClient.connect(where, timeout=5)
        try:
            blobs = [os.urandom(n) for n in (6 << 20, 1, 3 << 20, 0, 9 << 20)]
            got = await asyncio.gather(*(client.call(("echo", b)) for b in blobs))
            assert got == blobs
            # many small calls sent in one burst, answered in any order
            got = await asyncio.gather(*(client.call(("echo", i)) for i in range(2000)))
            assert got == list(range(2000))
        finally:
            await client.close()
            await server.close()
    run(body())


class Plant:
    """Unpickling this writes a file: proof that a frame was unpickled."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.path, "w"))


@pytest.mark.parametrize("token", [b"", b"x" * 32, b"short"])
def test_nothing_is_unpickled_before_the_token(tmp_path: Path, token: bytes) -> None:
    planted = tmp_path / "planted"

    async def body() -> None:
        server = ChannelServer(handler, "127.0.0.1")
        where = await server.start()
        try:
            r, w = await asyncio.open_connection(where["host"], where["port"])
            body_ = pickle.dumps((1, Plant(str(planted))))
            w.write(token + struct.pack(">I", len(body_)) + body_)
            await w.drain()
            # the server closes the connection (at once for a wrong token; after its
            # 5 s wait for a short one) and answers nothing
            assert await asyncio.wait_for(r.read(), 10) == b""
            w.close()
            assert server.refused == 1
            # the real client still works
            client = await ChannelClient.connect(where, timeout=5)
            assert await client.call(("echo", 3)) == 3
            await client.close()
        finally:
            await server.close()
    run(body())
    assert not planted.exists()


def test_oversized_frame_closes_the_connection_without_allocating() -> None:
    async def body() -> None:
        server = ChannelServer(handler, "127.0.0.1")
        where = await server.start()
        try:
            s = socket.create_connection((where["host"], where["port"]))
            s.sendall(bytes.fromhex(where["token"]) + struct.pack(">I", 0xFFFFFFFF))
            s.settimeout(10)
            loop = asyncio.get_running_loop()
            assert await loop.run_in_executor(None, s.recv, 1) == b""
            s.close()
            assert server.refused == 1
        finally:
            await server.close()
    run(body())


def test_a_port_nobody_serves_is_refused_at_connect() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connections are refused

        async def body() -> None:
            with pytest.raises(OSError):
                await ChannelClient.connect({"host": "127.0.0.1", "port": port,
                                             "token": os.urandom(32).hex()}, timeout=5)
        run(body())
