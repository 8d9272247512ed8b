"""`cluster/sessions.py` without Ray: `RemoteProvider`/`RemoteSandbox` over an in-process
`Node` (its `run` and `end_session`, what `RayBackend` calls over the channel), fake tier.
The real thing — Ray, real sessions, a node killed — is test_remote_sessions.py."""

from __future__ import annotations

import asyncio
import itertools
import os
from pathlib import Path
from typing import Any

import pytest

from trialbox.cluster.node import Node, NodeConfig
from trialbox.errors import NodeLost
from trialbox.cluster.sessions import RemoteProvider, SessionWorkload, workload_name
from trialbox.errors import SandboxUnavailable, UsageError
from trialbox.sandbox.base import Sandbox, SandboxProvider
from trialbox.sandbox.fake import FAKE_RUNTIME, FakeSandbox
from trialbox.types import ExecStatus, Limits


class InProcess:
    """The two calls `RemoteProvider` makes of `RayBackend`, on one in-process node;
    `lost = True` plays the node's loss (every call raises NodeLost, as the placer does
    for a session whose node was lost)."""

    def __init__(self, node: Node):
        self.node = node
        self.lost = False
        self.ids = itertools.count(1)
        self.ended: list[str] = []

    async def run(self, name: str, payload: Any, *, tier: str, priority: int = 1,
                  session: str | None = None) -> Any:
        if self.lost:
            raise NodeLost("node n1 lost (test)")
        return await self.node.run(next(self.ids), name, payload, session)

    async def end_session(self, session: str) -> None:
        self.ended.append(session)
        if not self.lost:
            await self.node.end_session(session)


async def started() -> tuple[Node, InProcess, RemoteProvider]:
    node = Node(NodeConfig("n1", 2, ("fake",)))
    await node.start()
    await node.load(workload_name("fake"), SessionWorkload("fake"))
    backend = InProcess(node)
    return node, backend, RemoteProvider(backend, "fake", FAKE_RUNTIME)  # type: ignore[arg-type]


def test_a_remote_session_is_the_nodes_session() -> None:
    async def body() -> None:
        node, backend, provider = await started()
        assert isinstance(provider, SandboxProvider) and provider.passes_fds is False
        async with await provider.open(Limits(wall_s=3)) as sb:
            assert isinstance(sb, Sandbox) and sb.node == "n1" and sb.tier == "fake"
            assert sb.limits == Limits(wall_s=3) and sb.where["pid"] == os.getpid()
            [state] = node.sessions.values()
            real = state["sandbox"]
            assert isinstance(real, FakeSandbox)
            await sb.write_file("a.txt", b"kept")
            r = await sb.exec(("python3", "a.txt"), stdin=b"x", env={"K": "v"})
            assert r.status is ExecStatus.OK and real.calls == [["python3", "a.txt"]]
            await sb.park()
            assert real.parks == 1
            assert await sb.list_files() == ["a.txt"]
            assert await sb.read_file("a.txt", 2) == b"ke"
            with pytest.raises(UsageError, match="no file"):  # the node's, as raised
                await sb.read_file("b.txt")
            w = os.pipe()
            with pytest.raises(SandboxUnavailable, match="another machine"):
                await sb.exec(["true"], pass_fds={3: w[1]})
            with pytest.raises(OSError):
                os.close(w[1])  # ours was closed: the fd was handed over, as on any tier
            os.close(w[0])
        assert sb.closed and real.closed and not node.sessions and not provider.live
        with pytest.raises(UsageError, match="closed"):
            await sb.exec(["true"])
        with pytest.raises(UsageError, match="limits must be"):
            await provider.open({"wall_s": 1})  # type: ignore[arg-type]
        assert (await node.close())["runs"] == 6  # the fd-passing exec never left here
    asyncio.run(body())


def test_a_lost_node_makes_every_call_nodelost_and_close_quiet() -> None:
    async def body() -> None:
        node, backend, provider = await started()
        sb = await provider.open()
        other = await provider.open()
        backend.lost = True
        with pytest.raises(NodeLost):
            await sb.exec(["true"])
        with pytest.raises(NodeLost):
            await sb.write_file("a", b"")
        await sb.park()  # nothing to give back
        await sb.close()
        assert sb.session in backend.ended and sb.session not in provider.live
        await provider.close()  # closes what an episode left open
        assert other.closed and not provider.live
        backend.lost = False
        # a session its node no longer holds (drained, restarted): NodeLost, not a
        # UsageError — the caller did nothing wrong
        third = await provider.open()
        await node.end_session(third.session)
        with pytest.raises(NodeLost, match="no longer on node n1"):
            await third.list_files()
        await third.close()
        await node.close()
    asyncio.run(body())


def test_a_session_that_cannot_open_leaves_nothing() -> None:
    async def body() -> None:
        node, backend, provider = await started()

        async def broken(limits: Limits | None = None) -> Any:
            raise SandboxUnavailable("no cell (test)")
        node.providers["fake"].open = broken  # type: ignore[method-assign]
        with pytest.raises(SandboxUnavailable, match="no cell"):
            await provider.open()
        assert len(backend.ended) == 1 and not node.sessions and not provider.live
        await node.close()
    asyncio.run(body())


def test_session_checkpoints_without_a_cluster_is_refused_before_anything(
        tmp_path: Path) -> None:
    """`train --session-checkpoints` is for --backend ray: locally there is no node to
    lose, and the flag is refused naming the fix (exit 2), before any config is read."""
    from trialbox.cli import main
    assert main(["train", str(tmp_path / "none.toml"), "--session-checkpoints",
                 str(tmp_path / "ckpt")]) == 2
    assert not (tmp_path / "ckpt").exists()
