"""Sandbox sessions on cluster nodes: a multi-turn episode's own session (the code it
runs each turn, its files between turns) lives on one node, and the driver holds a
`RemoteSandbox` that speaks the `Sandbox` interface (sandbox/base.py) — so the agent
loop, the leasers and the scheduler use it unchanged.

    provider = await RemoteProvider.start(backend, "namespace")   # driver
    async with await provider.open(Limits(wall_s=2)) as sb:       # placed on a node
        await sb.write_file("main.py", b"print(1)")
        r = await sb.exec(["python3", "main.py"])                 # runs on sb.node

Each call is one piece of `RayBackend.run(..., session=<id>)` work of the node's
`SessionWorkload`, which holds the real session (the node's provider of the tier). The
placer keeps a session on the node of its first call (affinity) and a call holds one of
the node's slots only while it runs: a parked session between turns holds none.

Failures keep their kind. What the candidate did is in the `ExecResult`, as locally; the
node's own `UsageError`s and `InfraError`s arrive as raised there. A node lost with the
session (killed, cut off, drained) makes the call in flight and every later one raise
`NodeLost` (an `InfraError`: the episode is excluded, never graded as a wrong answer);
`park` and `close` of a lost session are quiet (nothing of it can be given back). `close`
ends the session on its node (`RayBackend.end_session`). No fd crosses machines:
`passes_fds` is False and `exec(pass_fds=...)` is refused (`SandboxUnavailable`).

**Moving a session when its node goes** (`RemoteProvider(checkpoints=URL)`, namespace
tier): after every command the node snapshots the session's files and saves them to the
artifact store at URL (s3://… on a real cluster; any store every node reaches) —
`Snapshot.save`, O(files) — and the driver keeps the name, plus the `write_file`s made
since. When a call finds the node lost, the driver opens the session again on another
node from that checkpoint (`Snapshot.load` + a fork), replays the writes, and makes the
call again: the episode goes on instead of being excluded. A command that was running on
the lost node runs again on the new one (its effects there were lost with the node; its
answer, if it ever comes, is discarded), so a turn is never counted twice. At most
`MAX_MOVES` moves per call; past them, or without checkpoints, `NodeLost` as above.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trialbox.cluster.node import NodeContext
from trialbox.errors import NodeLost, SandboxUnavailable, UsageError
from trialbox.sandbox.base import Sandbox, SandboxProvider
from trialbox.sandbox.languages import offered
from trialbox.types import ExecResult, Limits, Runtime

if TYPE_CHECKING:
    from trialbox.cluster.backend import RayBackend

MAX_MOVES = 2
"""Moves one call may make (each to another live node) before NodeLost stands."""

OPS = frozenset({"exec", "stop", "park", "write_file", "read_file", "list_files"})
"""The `Sandbox` calls a node serves for a session (opening is `open`, closing is the
backend's `end_session`)."""


def workload_name(tier: str) -> str:
    return f"sessions:{tier}"


@dataclass
class SessionWorkload:
    """On the node: one real session of the node's `tier` provider per driver session.
    The payload is `(op, args, kwargs)`; `open` answers where the session lives."""

    tier: str = "namespace"
    checkpoints: str | None = None
    """The artifact store's URL sessions are checkpointed to (None: no checkpoints)."""
    _node: NodeContext | None = None
    _store: Any = None

    async def start(self, node: NodeContext) -> None:
        if self.tier not in node.providers:
            raise UsageError(f"node {node.config.node_id} does not offer tier {self.tier!r}")
        self._node = node
        if self.checkpoints is not None:
            from trialbox.store.artifacts import ArtifactStore
            self._store = ArtifactStore(self.checkpoints)

    def _where(self, sb: Sandbox) -> dict[str, Any]:
        assert self._node is not None
        return {"node": self._node.config.node_id, "pid": os.getpid(),
                "host": socket.gethostname(), "tier": sb.tier, "limits": sb.limits,
                "languages": offered()}

    async def run(self, payload: Any, session: dict[str, Any] | None) -> Any:
        assert self._node is not None
        op, args, kwargs = payload
        if session is None:
            raise UsageError("session work needs a session id (RayBackend.run(..., "
                             "session=...))")
        node_id = self._node.config.node_id
        sb: Sandbox | None = session.get("sandbox")
        if op == "open":
            if sb is not None:
                raise UsageError(f"session already open on node {node_id}")
            sb = await self._node.providers[self.tier].open(*args)
            session["sandbox"] = sb
            return self._where(sb)
        if op == "restore":  # (checkpoint name, limits): a moved session, opened here
            if sb is not None:
                raise UsageError(f"session already open on node {node_id}")
            from trialbox.sandbox.snapshot import Snapshot
            name, limits = args
            snap = await Snapshot.load(self._node.providers[self.tier],  # type: ignore[arg-type]
                                       self._checkpoint_store(), name)
            try:
                sb = await snap.open(limits)
            finally:
                await snap.close()
            session["sandbox"] = sb
            return self._where(sb)
        if sb is None:  # ended here (the node drained, or closed) and asked again
            raise NodeLost(f"the session is no longer on node {node_id} (the node was "
                           "drained or restarted): its files are gone")
        if op == "checkpoint":  # (name, previous name or None)
            name, previous = args
            store = self._checkpoint_store()
            snap = await sb.snapshot()  # type: ignore[attr-defined]
            try:
                meta = await snap.save(store, name)
            finally:
                await snap.close()
            if previous:
                for suffix in (".json", ".tar.zst"):
                    store.delete(previous + suffix)
            return {"bytes": meta.get("size"), "files": meta.get("files")}
        if op not in OPS:
            raise UsageError(f"unknown session operation {op!r}")
        return await getattr(sb, op)(*args, **kwargs)

    def _checkpoint_store(self) -> Any:
        if self._store is None:
            raise UsageError("this node's session workload keeps no checkpoints: give "
                             "RemoteProvider.start(..., checkpoints=URL)")
        return self._store

    async def close(self) -> None:
        """The sessions close with the node (`Node.close` ends every one)."""
        self._node = None


class RemoteSandbox:
    """A `Sandbox` whose session lives on a cluster node (`node`: its Ray node id;
    `where`: the node's answer to `open` — pid and hostname of the node process)."""

    def __init__(self, provider: RemoteProvider, session: str, where: dict[str, Any]):
        self.provider, self.session, self.where = provider, session, where
        self.node: str = where["node"]
        self.tier: str = where["tier"]
        self.limits: Limits = where["limits"]
        self.languages: list[str] = where["languages"]
        """What its node can run (`run_code` checks against it, not the driver's)."""
        self.closed = False
        self.moves = 0
        """Times this session was moved to another node (its node lost)."""
        self._name = session  # checkpoint names stay under the first id
        self._checkpoint: str | None = None
        self._checkpoints = 0
        self._writes: list[tuple[str, bytes, int]] = []
        """write_file calls since the last checkpoint (replayed after a move)."""

    async def _call(self, op: str, *args: Any, **kwargs: Any) -> Any:
        if self.closed:
            raise UsageError("this sandbox session is closed; open a new one")
        for moves in range(MAX_MOVES + 1):
            try:
                out = await self.provider.call(self.session, op, args, kwargs)
                if op == "exec" and self.provider.checkpoints is not None \
                        and not kwargs.get("last"):
                    await self._save_checkpoint()
                elif op == "write_file" and self.provider.checkpoints is not None:
                    self._writes.append(args)
                return out
            except NodeLost:
                if self.provider.checkpoints is None or op in ("park", "stop") \
                        or moves == MAX_MOVES:
                    raise
                await self._move()
        raise AssertionError("unreachable")

    async def _save_checkpoint(self) -> None:
        self._checkpoints += 1
        name = f"{self._name}/{self._checkpoints}"
        await self.provider.call(self.session, "checkpoint", (name, self._checkpoint), {})
        self._checkpoint = name
        self._writes.clear()

    async def _move(self) -> None:
        """Open this session again on another node: from its last checkpoint (or
        empty, before the first), with the writes made since replayed."""
        old = self.session
        new = f"session-{uuid.uuid4().hex[:16]}"
        try:
            if self._checkpoint is None:
                where = await self.provider.call(new, "open", (self.limits,), {})
            else:
                where = await self.provider.call(new, "restore",
                                                 (self._checkpoint, self.limits), {})
        except BaseException:
            await self.provider.backend.end_session(new)
            raise
        self.provider.moved(old, new, self)
        self.session, self.where, self.node = new, where, where["node"]
        self.languages = where["languages"]
        self.moves += 1
        for path, data, mode in self._writes:
            await self.provider.call(new, "write_file", (path, data, mode), {})

    async def exec(self, argv: Sequence[str], *, stdin: bytes = b"",
                   limits: Limits | None = None, env: Mapping[str, str] | None = None,
                   cwd: str = "/workspace",
                   pass_fds: Mapping[int, int] | None = None,
                   last: bool = False) -> ExecResult:
        if pass_fds:
            for fd in pass_fds.values():  # ours once handed over, as on every tier
                os.close(fd)
            raise SandboxUnavailable("this session runs on another machine: an fd cannot "
                                     "be handed into it (passes_fds is False)")
        if not isinstance(argv, (str, bytes)):
            argv = list(argv)  # a str is the node's to refuse, as locally
        out: ExecResult = await self._call("exec", argv, stdin=bytes(stdin), limits=limits,
                                           env=dict(env) if env is not None else None,
                                           cwd=cwd, last=last)
        return out

    async def stop(self) -> None:
        await self._call("stop")

    async def park(self) -> None:
        try:
            await self._call("park")
        except NodeLost:
            pass  # its compute went with the node; the next call moves it or says so

    async def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        await self._call("write_file", path, data, mode)

    async def read_file(self, path: str, max_bytes: int = 16 << 20) -> bytes:
        out: bytes = await self._call("read_file", path, max_bytes)
        return out

    async def list_files(self) -> list[str]:
        out: list[str] = await self._call("list_files")
        return out

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        await self.provider.end(self.session)
        if self._checkpoint is not None and self.provider.store is not None:
            for suffix in (".json", ".tar.zst"):
                self.provider.store.delete(self._checkpoint + suffix)

    async def __aenter__(self) -> RemoteSandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class RemoteProvider:
    """A `SandboxProvider` whose sessions are placed on the cluster's nodes offering
    `tier` (load spread by the placer; each session then stays on its node)."""

    passes_fds = False
    """base.passes_fds: no fd crosses machines."""

    def __init__(self, backend: RayBackend, tier: str, runtime: Runtime, *,
                 priority: int = 1, checkpoints: str | None = None):
        self.backend, self.tier, self.runtime = backend, tier, runtime
        self.priority = priority
        self.checkpoints = checkpoints
        """The artifact store sessions are checkpointed to, so they can move."""
        self.moves = 0
        self.store: Any = None
        """The driver's handle on the checkpoint store (to delete what a closed
        session leaves there)."""
        self.name = workload_name(tier)
        self.live: dict[str, RemoteSandbox] = {}
        """Sessions opened and not yet closed, by session id."""
        self.opened = 0

    @classmethod
    async def start(cls, backend: RayBackend, tier: str = "namespace", *,
                    priority: int = 1, checkpoints: str | None = None) -> RemoteProvider:
        """Load the session workload on every node offering `tier` (and on those that
        join later). A tier no node offers, or nodes running different environments
        of it, is refused (`UsageError`). `checkpoints`: an artifact store URL every
        node reaches (s3://bucket/prefix), to checkpoint sessions to after each
        command so a session moves when its node is lost (namespace tier only)."""
        from trialbox.cluster.evaljob import runtime_of
        if checkpoints is not None:
            if tier != "namespace":
                raise UsageError(f"session checkpoints need the namespace tier (snapshots), "
                                 f"not {tier!r}; drop checkpoints= or use tier namespace")
            from trialbox.store.artifacts import ArtifactStore
            store = ArtifactStore(checkpoints)  # a bad URL or no credentials: said now
        runtime = runtime_of(backend, tier)
        name = workload_name(tier) + (f"+{checkpoints}" if checkpoints else "")
        await backend.load(name, SessionWorkload(tier, checkpoints))
        provider = cls(backend, tier, runtime, priority=priority, checkpoints=checkpoints)
        provider.name = name
        if checkpoints is not None:
            provider.store = store
        return provider

    async def open(self, limits: Limits | None = None) -> RemoteSandbox:
        if limits is not None and not isinstance(limits, Limits):
            raise UsageError(f"limits must be a trialbox.types.Limits, got "
                             f"{type(limits).__name__}; e.g. Limits(wall_s=2)")
        session = f"session-{uuid.uuid4().hex[:16]}"
        try:
            where = await self.call(session, "open", (limits,), {})
        except BaseException:
            await self.backend.end_session(session)  # nothing of it stays, here or there
            raise
        sb = RemoteSandbox(self, session, where)
        self.live[session] = sb
        self.opened += 1
        return sb

    async def call(self, session: str, op: str, args: tuple[Any, ...],
                   kwargs: dict[str, Any]) -> Any:
        return await self.backend.run(self.name, (op, args, kwargs), tier=self.tier,
                                      priority=self.priority, session=session)

    def moved(self, old: str, new: str, sb: RemoteSandbox) -> None:
        self.live.pop(old, None)
        self.live[new] = sb
        self.moves += 1
        self.backend.placer.end_session(old)  # its node is gone: nothing to end there

    async def end(self, session: str) -> None:
        self.live.pop(session, None)
        await self.backend.end_session(session)

    async def close(self) -> None:
        """Close every session still open (an episode that never ended its own)."""
        for sb in list(self.live.values()):
            await sb.close()


def _is_a_provider(x: RemoteProvider) -> SandboxProvider:
    """Never called: makes the type checker prove RemoteProvider keeps the protocol."""
    return x


def _is_a_sandbox(x: RemoteSandbox) -> Sandbox:
    return x
