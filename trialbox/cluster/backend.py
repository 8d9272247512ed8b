"""The Ray side: connect to a cluster, start one `Node` actor per trialbox machine,
watch membership and health, and run work on the node the `Placer` picks.

    async with RayBackend(ClusterConfig(address="auto")) as cluster:
        await cluster.load("run-1", FakeWorkload(seconds=0.1))
        answer = await cluster.run("run-1", payload, tier="fake")

A machine is a trialbox node when its raylet declares the resources

    trialbox_node: 1           (one node actor per machine)
    trialbox_slots: N          (sandbox sessions in flight at once)
    trialbox_tier_<tier>: 1    (per tier offered: namespace, gvisor, container, fake;
                                the node proves each with doctor's probe as it starts)

The driver (this process) holds the journal and the scheduler; nodes hold sandboxes.
Membership is polled (`poll_s`): a node that appears gets an actor pinned to it (hard
node affinity), is checked (Python, Ray, trialbox code fingerprint the same as the
driver's, or it is refused) and takes work at once. Health: every `heartbeat_s` each node
is pinged; one whose actor died, whose raylet is gone, or that has not answered for
`dead_after_s` is *lost*: its leases are fenced (their work fails with `NodeLost`, an
`InfraError` the scheduler retries elsewhere) and any answer it still sends is discarded.

The work itself travels beside Ray: each node serves `Node.run` on a TCP port of its own
address and the driver keeps one connection to it (`channel.py`, `ClusterConfig.channel`),
because a Ray actor call per judged attempt cost more than the attempt may add. A broken
connection is a lost node, exactly as an actor death is.

Idle capacity is given back (`ClusterConfig.idle_release_s`, off by default): a node with
no work in flight and no session for that long is closed (its pools, its actor) and
becomes *dormant* -- its `trialbox_node` resource is free again, so the machine holds
nothing of trialbox's and a Ray autoscaler (KubeRay's) may take it away; when work waits
for a tier a dormant node offers, the next poll admits it again (new actor, new pools).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import socket
import time
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.exceptions import RayActorError, RayError, RayTaskError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from trialbox import telemetry
from trialbox.cluster.channel import ChannelClient, ChannelClosed
from trialbox.cluster.node import Node, NodeConfig, Workload
from trialbox.cluster.placement import Lease, NodeInfo, Placer
from trialbox.errors import InfraError, NodeLost, TrialboxError, UsageError
from trialbox.versions import VersionMismatch, code_fingerprint, software_mismatch

log = logging.getLogger("trialbox.cluster")

NODE = "trialbox_node"
SLOTS = "trialbox_slots"
TIER = "trialbox_tier_"


class ClusterUnreachable(UsageError):
    """No Ray cluster answers at the given address."""


class NodeStartFailed(UsageError):
    """A live node's actor could not start (its pools, its workloads): the node is
    misconfigured. A node that *died* while joining is not this: it is only skipped."""


@dataclass
class ClusterConfig:
    """How the driver joins the cluster and watches its nodes."""

    address: str = "auto"
    """`auto` (a cluster started on this machine with `ray start`), or HOST:PORT of the
    head's GCS (default port 6379)."""
    poll_s: float = 0.5
    """How often membership is read (nodes joining, raylets gone)."""
    heartbeat_s: float = 1.0
    """How often each node is pinged."""
    dead_after_s: float = 10.0
    """A node silent this long is presumed dead (cut off, frozen); its work is fenced."""
    orphan_wait_s: float = 300.0
    """How long work waits for a tier whose every node is gone (lost or drained) for a
    node offering it to join; then it fails as infra (`NoNodeForTier`), never hangs."""
    connect_timeout_s: float = 5.0
    """How long HOST:PORT may take to accept a TCP connection before it is refused."""
    min_nodes: int = 1
    """Nodes that must have joined before `start` returns."""
    idle_release_s: float | None = None
    """Close a node idle this long (no work in flight, no session) and keep it dormant
    until work waits for its tier; None (default): nodes stay for the whole run."""
    join_timeout_s: float = 60.0
    """How long `start` waits for `min_nodes`."""
    warm: int = 8
    """Warm cells per namespace pool on each node (the judge's: two per slot in flight
    is what `trialbox eval` keeps locally; past that the pool grows with demand)."""
    node_runtime_env: dict[str, Any] | None = None
    """Ray runtime_env of the node actors (e.g. a working_dir with trialbox in it)."""
    namespace: str = "trialbox"
    channel: str = "direct"
    """How the driver sends work to a node: "direct" (a TCP connection to the node's
    actor, `channel.py`; Ray still places, watches, loads and closes the node) or "ray"
    (an actor call per piece of work). A node whose channel the driver cannot reach
    (a firewall between them) is used through Ray, with a warning."""

    def __post_init__(self) -> None:
        if self.channel not in ("direct", "ray"):
            raise UsageError(f"channel {self.channel!r}: give 'direct' (a TCP connection "
                             "to each node beside Ray) or 'ray' (Ray actor calls)")
        if not isinstance(self.address, str) or not self.address:
            raise UsageError("--address must be 'auto' or HOST:PORT of the Ray head")
        if self.address != "auto" and not self.address.startswith("ray://"):
            host, _, port = self.address.rpartition(":")
            if not host or not port.isdigit():
                raise UsageError(f"--address {self.address!r}: give 'auto' or HOST:PORT "
                                 "of the Ray head's GCS, e.g. 10.0.0.5:6379")
        for name in ("poll_s", "heartbeat_s", "dead_after_s", "connect_timeout_s",
                     "orphan_wait_s"):
            if not getattr(self, name) > 0:
                raise UsageError(f"{name} must be positive")
        if self.idle_release_s is not None and not self.idle_release_s > 0:
            raise UsageError(f"--idle-release-s must be a positive number of seconds "
                             f"(or left out: nodes stay), got {self.idle_release_s}")


@dataclass
class _Member:
    config: NodeConfig
    actor: Any
    info: dict[str, Any]
    last_seen: float
    loaded: set[str] = field(default_factory=set)
    ping: asyncio.Task[None] | None = None
    channel: ChannelClient | None = None
    """The direct connection `run` uses (None: Ray actor calls)."""


def _check_reachable(address: str, timeout: float) -> None:
    if address == "auto" or address.startswith("ray://"):
        return
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            pass
    except OSError as e:
        raise ClusterUnreachable(
            f"no Ray cluster at --address {address}: {e.strerror or e} (within "
            f"{timeout:g} s). Start the head with `ray start --head --port {port}` there, "
            "or pass the address `ray status` prints on the head") from e


def _offer(resources: dict[str, float]) -> tuple[int, tuple[str, ...]]:
    slots = int(resources.get(SLOTS, 0))
    tiers = tuple(sorted(k[len(TIER):] for k, v in resources.items()
                         if k.startswith(TIER) and v > 0))
    return slots, tiers


class RayBackend:
    def __init__(self, config: ClusterConfig | None = None):
        self.config = config or ClusterConfig()
        self.placer = Placer(self.config.orphan_wait_s)
        self.members: dict[str, _Member] = {}
        self.workloads: dict[str, Workload] = {}
        self.refused: dict[str, str] = {}
        """Nodes not admitted (version mismatch, bad offer), with the reason."""
        self.failed: dict[str, str] = {}
        """Live nodes whose actor failed to start or load a workload, with the error."""
        self.died_joining: dict[str, str] = {}
        """Nodes whose raylet died before their actor ran (e.g. removed just before this
        driver started while Ray still listed them): skipped, never retried, no error."""
        self.close_reports: dict[str, dict[str, Any]] = {}
        """Each node's answer to `close` (runs, leaks) when it was drained or closed."""
        self._joining: set[str] = set()
        self._releasing: dict[str, asyncio.Task[None]] = {}
        """Idle nodes being closed (`_release`): not admitted meanwhile."""
        self._monitor: asyncio.Task[None] | None = None
        self._owns_ray = False
        self._closed = False
        self._joined = asyncio.Event()
        self._fingerprint = code_fingerprint()
        self._late: set[asyncio.Future[Any]] = set()
        self.lost: dict[str, Any] = {}
        """Actors of lost nodes, by node id: left running (a cut-off node may still
        answer; the answer is discarded), killed at close."""
        self._lost_channels: list[ChannelClient] = []

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> RayBackend:
        """Connect, admit the nodes present, start watching. Refuses (and leaves nothing
        started) an unreachable address, a cluster without trialbox nodes, or nodes that
        run other code than this driver."""
        c = self.config
        _check_reachable(c.address, c.connect_timeout_s)
        if not ray.is_initialized():
            try:
                ray.init(address=c.address, namespace=c.namespace, log_to_driver=False,
                         logging_level=logging.WARNING, configure_logging=False)
            except (ConnectionError, RuntimeError, ValueError) as e:
                raise ClusterUnreachable(
                    f"cannot join a Ray cluster at --address {c.address}: {e}. Start one "
                    "with `ray start --head` (and `ray start --address HEAD:6379` on each "
                    "node), or pass --address HOST:PORT of a running head") from e
            self._owns_ray = True
        try:
            await self._poll()
            deadline = time.monotonic() + c.join_timeout_s
            while len(self.members) < c.min_nodes:
                if (self.refused or self.failed) and not self._joining:
                    self._raise_refusals()  # too few nodes, and we know why
                if time.monotonic() > deadline:
                    bad = {**self.refused, **self.failed}
                    raise ClusterUnreachable(
                        f"{len(self.members)} trialbox node(s) joined the cluster at "
                        f"{c.address} within {c.join_timeout_s:g} s, {c.min_nodes} needed"
                        + (f" (refused: {'; '.join(bad.values())})" if bad else "")
                        + (f" ({len(self.died_joining)} died while joining)"
                           if self.died_joining else "")
                        + f". Start nodes with --resources '{{\"{NODE}\": 1, \"{SLOTS}\": "
                        f"8, \"{TIER}namespace\": 1}}'")
                await asyncio.sleep(c.poll_s)
                await self._poll()
            self._raise_refusals()
        except BaseException:
            await self.close()
            raise
        self._monitor = asyncio.get_running_loop().create_task(self._watch())
        return self

    def _raise_refusals(self) -> None:
        if self.refused:
            raise VersionMismatch("; ".join(self.refused.values()))
        if self.failed:
            raise NodeStartFailed("; ".join(self.failed.values()) + ". Run `trialbox "
                                  "doctor` on that node: its tiers must work there")

    async def __aenter__(self) -> RayBackend:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close every node (their sessions and pools), stop watching, disconnect."""
        if self._closed:
            return
        self._closed = True
        if self._monitor is not None:
            self._monitor.cancel()
            await asyncio.gather(self._monitor, return_exceptions=True)
        await asyncio.gather(*self._releasing.values(), return_exceptions=True)
        await asyncio.gather(*(self._close_member(nid) for nid in list(self.members)),
                             *(self._close_lost(nid, a) for nid, a in self.lost.items()))
        for ch in self._lost_channels:
            await ch.close()
        if self._owns_ray:
            ray.shutdown()

    def check_tier(self, tier: str) -> None:
        self.placer.check_tier(tier)

    # ------------------------------------------------------------------ membership
    async def _watch(self) -> None:
        c = self.config
        poll: asyncio.Task[None] | None = None
        woke = time.monotonic()
        try:
            while True:
                await asyncio.sleep(c.poll_s)
                now = time.monotonic()
                stall = now - woke - c.poll_s
                woke = now
                if stall > 0.5:  # this process stalled, not the nodes: don't blame them
                    for m in self.members.values():
                        m.last_seen += stall
                if poll is None or poll.done():  # a slow admission does not stall pings
                    poll = asyncio.get_running_loop().create_task(self._poll_logged())
                self._check_health()
                self._release_idle()
        finally:
            if poll is not None:  # a join cut short kills the actor it started
                poll.cancel()
                await asyncio.gather(poll, return_exceptions=True)

    async def _poll_logged(self) -> None:
        try:
            await self._poll()
        except Exception as e:  # the GCS may be briefly away; keep watching
            log.warning("cluster membership poll failed: %s", e)

    def _check_health(self) -> None:
        now = time.monotonic()
        for nid, m in list(self.members.items()):
            if now - m.last_seen > self.config.dead_after_s:
                self._lose(nid, f"no answer for {now - m.last_seen:.1f} s")
            elif m.ping is None or m.ping.done():
                m.ping = asyncio.get_running_loop().create_task(self._ping(nid, m))

    def _release_idle(self) -> None:
        limit = self.config.idle_release_s
        if limit is None:
            return
        for nid in self.placer.idle_nodes(limit):
            if nid in self.members and nid not in self._releasing:
                # out of placement now, in the step that saw it idle: nothing can be
                # granted there between the check and the close
                self.placer.release_idle(nid)
                self._releasing[nid] = asyncio.get_running_loop().create_task(
                    self._release(nid))

    async def _release(self, nid: str) -> None:
        """Close an idle node, already dormant in the placer (`_release_idle`); `_poll`
        admits it again on demand."""
        try:
            # as a drained node is closed; the placer already holds it dormant, so
            # `_close_member`'s remove_drained finds nothing to call gone
            await self._close_member(nid)
            log.info("node %s released after %.0f s idle; dormant until work waits "
                     "for its tiers", nid, self.config.idle_release_s or 0)
        finally:
            self._releasing.pop(nid, None)

    async def _ping(self, nid: str, m: _Member) -> None:
        try:
            await m.actor.ping.remote()
            m.last_seen = time.monotonic()
        except RayActorError as e:
            self._lose(nid, f"actor died: {type(e).__name__}")
        except RayError as e:
            log.warning("ping of node %s failed: %s", nid, e)
        await asyncio.sleep(self.config.heartbeat_s)

    async def _poll(self) -> None:
        nodes = await asyncio.to_thread(ray.nodes)
        joining = []
        for n in nodes:
            nid = n["NodeID"]
            res = n.get("Resources", {}) or {}
            if not n.get("Alive"):
                if nid in self.members:
                    self._lose(nid, "its raylet is gone")
                self.placer.forget_dormant(nid)  # e.g. the autoscaler took it away
                continue
            if res.get(NODE, 0) < 1:
                continue
            dormant = self.placer.dormant.get(nid)
            if dormant is not None and not (set(dormant.tiers)
                                            & self.placer.waiting_tiers()):
                continue  # released for being idle: admitted again when work waits
            if (nid in self.members or nid in self._joining or nid in self.placer.gone
                    or nid in self._releasing
                    or nid in self.refused or nid in self.failed
                    or nid in self.died_joining):
                continue
            self._joining.add(nid)
            joining.append(self._admit(nid, n.get("NodeManagerAddress", ""), res))
        try:
            await asyncio.gather(*joining)  # nodes start their pools side by side
        finally:
            self._joining.clear()

    async def _admit(self, nid: str, address: str, res: dict[str, float]) -> None:
        slots, tiers = _offer(res)
        try:
            config = NodeConfig(nid, slots, tiers, warm=self.config.warm)
        except UsageError as e:
            self.refused[nid] = str(e)
            return
        options: dict[str, Any] = {
            "num_cpus": 0, "max_concurrency": 10_000, "max_restarts": 0,
            "scheduling_strategy": NodeAffinitySchedulingStrategy(nid, soft=False),
            "resources": {NODE: 1}}
        if self.config.node_runtime_env is not None:
            options["runtime_env"] = self.config.node_runtime_env
        remote: Any = ray.remote(Node)
        actor: Any = remote.options(**options).remote(config)
        try:
            await self._join(nid, address, config, actor)
        except asyncio.CancelledError:
            # cut short (the backend closing while this node was joining): no actor may
            # be left holding the node's trialbox_node resource
            m = self.members.get(nid)
            if m is None or m.actor is not actor:
                _kill(actor)
            raise

    async def _join(self, nid: str, address: str, config: NodeConfig, actor: Any) -> None:
        slots, tiers = config.slots, config.tiers
        # Versions first: a node running other software is refused before its pools
        # start (nothing half-started on it).
        try:
            problem = self._mismatch(await asyncio.wait_for(
                _await(actor.versions.remote()), self.config.join_timeout_s))
            host = address if self.config.channel == "direct" and address else None
            info = None if problem else await asyncio.wait_for(
                _await(actor.start.remote(host)), self.config.join_timeout_s)
        except (RayError, TimeoutError) as e:
            _kill(actor)
            if not await asyncio.to_thread(_alive, nid):
                # Ray listed the raylet as alive, but it is gone (removed or crashed
                # moments ago: the GCS only notices after its health checks fail).
                self.died_joining[nid] = f"{type(e).__name__}"
                log.warning("node %s (%s) died while joining; skipped", nid, address)
                return
            cause = e.cause if isinstance(e, RayTaskError) else None
            why = ("did not start within "
                   f"{self.config.join_timeout_s:g} s" if isinstance(e, TimeoutError)
                   else f"failed to start: {cause}" if isinstance(cause, TrialboxError)
                   else f"failed to start: {e}")  # the node's own words, else Ray's
            self.failed[nid] = f"node {nid} ({address}) {why}"
            return
        if info is None:
            _kill(actor)
            self.refused[nid] = f"node {nid} ({address}): {problem}"
            return
        m = _Member(config, actor, info, time.monotonic())
        for name, w in self.workloads.items():
            try:
                await actor.load.remote(name, w)
            except RayError as e:
                await _quietly(actor.close.remote())
                _kill(actor)
                self.failed[nid] = f"node {nid} could not load workload {name}: {e}"
                return
            m.loaded.add(name)
        # The channel last: a node refused above never had a connection to unwind.
        where = info.pop("channel", None)  # its token stays out of what is shown
        if where is not None:
            try:
                m.channel = await ChannelClient.connect(
                    where, self.config.connect_timeout_s, label=f"node {nid}")
                info["channel"] = f"direct {where['host']}:{where['port']}"
            except (OSError, TimeoutError) as e:
                log.warning("node %s: its channel at %s:%s is out of reach (%s); work "
                            "goes through Ray actor calls instead", nid, where["host"],
                            where["port"], e)
                info["channel"] = f"ray (direct refused: {e})"
        else:
            info["channel"] = "ray"
        self.members[nid] = m
        self.placer.add(NodeInfo(nid, slots, tiers, address))
        telemetry.current().set_node_up(nid, True)  # TrialboxNodeDown watches it
        log.info("node %s joined: %d slots, tiers %s", nid, slots, tiers)

    def _mismatch(self, info: dict[str, Any]) -> str:
        return software_mismatch(info, self._fingerprint)

    def _lose(self, nid: str, why: str) -> None:
        m = self.members.pop(nid, None)
        if m is None:
            return
        fenced = self.placer.lose(nid, why)
        telemetry.current().set_node_up(nid, False)  # fires TrialboxNodeDown
        log.warning("node %s lost (%s): %d leases fenced", nid, why, len(fenced))
        if m.ping is not None:
            m.ping.cancel()
        # The actor (and its channel) is left alone: if it is only cut off, its late
        # answers arrive and are discarded (`run`); it is killed when the backend closes.
        self.lost[nid] = m.actor
        if m.channel is not None:
            self._lost_channels.append(m.channel)

    async def _close_member(self, nid: str) -> None:
        m = self.members.pop(nid, None)
        if m is None:
            return
        if m.ping is not None:
            m.ping.cancel()
        if m.channel is not None:
            await m.channel.close()
        try:
            self.close_reports[nid] = await asyncio.wait_for(
                m.actor.close.remote(), timeout=60)
        except (RayError, TimeoutError) as e:
            self.close_reports[nid] = {"error": str(e)}
        ray.kill(m.actor)
        self.placer.remove_drained(nid)
        telemetry.current().forget_node(nid)  # left cleanly (drained, idle): no alert

    async def _close_lost(self, nid: str, actor: Any) -> None:
        """A lost node that answers again (it was only cut off) closes its pools; one
        that does not within a few seconds is killed as it is."""
        try:
            self.close_reports[nid] = await asyncio.wait_for(_await(actor.close.remote()),
                                                             timeout=5)
        except (RayError, TimeoutError) as e:
            self.close_reports[nid] = {"error": f"lost: {type(e).__name__}"}
        _kill(actor)

    async def drain(self, node_id: str, timeout: float = 300.0) -> dict[str, Any]:
        """Place no new work on the node, wait for what runs there, close it (sessions,
        pools) and let it go. Returns its close report (runs, leaks)."""
        idle = self.placer.drain(node_id)
        await asyncio.wait_for(idle.wait(), timeout)
        await self._close_member(node_id)
        return self.close_reports[node_id]

    # ------------------------------------------------------------------ work
    async def load(self, name: str, workload: Workload) -> None:
        """Send a workload to every node (and to every node that joins later)."""
        self.workloads[name] = workload
        for m in list(self.members.values()):
            if name not in m.loaded:
                await m.actor.load.remote(name, workload)
                m.loaded.add(name)

    async def run(self, name: str, payload: Any, *, tier: str, priority: int = 1,
                  session: str | None = None) -> Any:
        """Run one piece of `name`'s work on a node offering `tier` (waiting for a free
        slot). Raises NodeLost (InfraError) if the node is lost meanwhile; an answer that
        comes after that is discarded, never returned."""
        if self._closed:
            raise UsageError("this cluster backend is closed")
        lease = await self.placer.acquire(tier, priority, session)
        m = self.members.get(lease.node)
        if m is None:  # lost between grant and here
            self.placer.release(lease)
            raise NodeLost(f"node {lease.node} lost before the work started")
        lease.lost = asyncio.get_running_loop().create_future()
        answer: asyncio.Future[Any]
        if m.channel is not None:
            try:  # written now: no task and no loop turn before the bytes leave
                answer = m.channel.send((lease.lease_id, name, payload, session))
            except ChannelClosed as e:
                self.placer.release(lease)
                self._lose(lease.node, str(e))
                raise NodeLost(f"node {lease.node} lost: {e}; retried elsewhere") from e
        else:
            answer = asyncio.ensure_future(_await(
                m.actor.run.remote(lease.lease_id, name, payload, session)))
        try:
            if m.channel is not None:
                await m.channel.drained()
            await asyncio.wait([answer, lease.lost], return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            answer.cancel()
            self.placer.release(lease)
            raise
        if not answer.done():  # fenced first: the answer, if any, is discarded later
            self._late.add(answer)
            answer.add_done_callback(functools.partial(self._discard, lease=lease))
            lease.lost.exception()  # retrieved: raise our own below
            raise NodeLost(f"node {lease.node} lost while running this work; retried "
                           "elsewhere")
        exc = answer.exception()
        if isinstance(exc, (RayActorError, ChannelClosed)):  # died under us: told first
            self._lose(lease.node, f"actor died: {type(exc).__name__}" if isinstance(
                exc, RayActorError) else str(exc))
            _retrieve(lease.lost)
            raise NodeLost(f"node {lease.node} died while running this work "
                           f"({type(exc).__name__}); retried elsewhere") from exc
        if not self.placer.release(lease):
            _retrieve(lease.lost)
            raise NodeLost(f"node {lease.node} presumed dead; its answer discarded")
        if isinstance(exc, RayTaskError) and isinstance(exc.cause, TrialboxError):
            raise exc.cause  # the node's own UsageError / InfraError, as it raised it
        if isinstance(exc, RayError):
            raise InfraError(f"node {lease.node}: {exc}") from exc
        if exc is not None:
            raise exc
        return answer.result()

    def _discard(self, fut: asyncio.Future[Any], lease: Lease) -> None:
        self._late.discard(fut)
        if not fut.cancelled() and fut.exception() is None:
            self.placer.release(lease)  # fenced: a late answer, counted and dropped

    async def end_session(self, session: str) -> None:
        nid = self.placer.sessions.get(session)
        self.placer.end_session(session)
        m = self.members.get(nid) if nid else None
        if m is not None:
            await _quietly(m.actor.end_session.remote(session))

    def node_of(self, lease_node: str) -> dict[str, Any]:
        return self.members[lease_node].info


def _retrieve(fut: asyncio.Future[Any] | None) -> None:
    """Mark a settled future's exception as seen (we raise our own)."""
    if fut is not None and fut.done() and not fut.cancelled():
        fut.exception()


async def _await(ref: Any) -> Any:
    return await ref


def _alive(nid: str) -> bool:
    """Whether the GCS still lists the node as alive (blocking: `ray.nodes()`)."""
    nodes: list[dict[str, Any]] = ray.nodes()  # type: ignore[no-untyped-call]
    return any(n["NodeID"] == nid and n.get("Alive") for n in nodes)


def _kill(actor: Any) -> None:
    try:
        ray.kill(actor)
    except RayError:
        pass


async def _quietly(ref: Any) -> None:
    try:
        await asyncio.wait_for(_await(ref), 30)
    except (RayError, TimeoutError):
        pass
