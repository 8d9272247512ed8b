"""Where each piece of work runs: the driver's view of the nodes, their free sandbox
slots, session affinity, and the fencing that keeps a node presumed dead from recording
anything. Pure bookkeeping — no Ray here — so the rules are tested on their own and the
Ray backend (`backend.py`) only feeds it events.

    placer = Placer()
    placer.add(NodeInfo("n1", slots=4, tiers=("namespace",)))
    lease = await placer.acquire("namespace", priority=1)     # waits while all are busy
    ...                                                       # run it on lease.node
    if placer.release(lease):                                 # False: fenced, discard
        record(answer)

Rules:

* A node offers tiers and `slots` (sandbox sessions in flight at once). Work of a tier
  goes only to nodes offering it, to the one with the lowest load (in-flight / slots),
  ties to the node used least recently: load spreads.
* Past every node's capacity work *waits* (no failure); waiters are served by priority
  (0 most urgent), first come first served within one.
* A session (a multi-turn episode) stays on the node of its first lease (affinity).
* A lost node (`lose`) fences every lease it held: each waiter gets `NodeLost` (an
  `InfraError`: the scheduler retries the task, elsewhere), and `release` of a fenced
  lease returns False — a late answer from a node presumed dead is discarded. A lost
  node never comes back under the same id (a restarted node registers anew).
* A draining node (`drain`) takes no new work; `drained(node)` resolves when its last
  lease is released.
* Work of a tier that no live node offers any more (its last node lost or drained)
  waits `orphan_wait_s` for one to join (elastic), then every waiter for that tier gets
  `NoNodeForTier` (an `InfraError`: never scored; the scheduler's retries end it as
  infra) instead of waiting forever.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from dataclasses import dataclass, field

from trialbox.errors import InfraError, NodeLost, UsageError


class TierUnavailable(UsageError):
    """No node of the cluster offers the requested sandbox tier."""


class NoNodeForTier(InfraError):
    """The cluster's nodes offering a tier are all gone and none joined within
    `orphan_wait_s`: the work waiting for that tier ends as an infrastructure failure."""


@dataclass(frozen=True)
class NodeInfo:
    """One machine's offer, as its node actor declared it."""

    node_id: str
    slots: int
    """Sandbox sessions this node runs at once (its `trialbox_slots` Ray resource)."""
    tiers: tuple[str, ...]
    """Isolation tiers it offers (its `trialbox_tier_<name>` Ray resources)."""
    address: str = ""


@dataclass(eq=False)
class Lease:
    """One placement of one piece of work on one node. `lease_id` is unique; the node's
    answer counts only while the lease is live (not fenced)."""

    lease_id: int
    node: str
    tier: str
    session: str | None
    fenced: bool = False
    lost: asyncio.Future[None] | None = None
    """Resolved with NodeLost when the node is presumed dead (the waiter races it)."""


@dataclass
class _Node:
    info: NodeInfo
    inflight: dict[int, Lease] = field(default_factory=dict)
    draining: bool = False
    last_used: float = 0.0
    placed: int = 0
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    idle_since: float = 0.0
    """When its last piece of work ended (or it joined)."""


@dataclass
class PlacerStats:
    placed: int = 0
    fenced: int = 0
    """Leases of lost nodes (their work retried elsewhere)."""
    late_discarded: int = 0
    """Answers that arrived for a fenced lease and were thrown away."""
    nodes_lost: int = 0
    nodes_joined: int = 0
    nodes_drained: int = 0
    nodes_released: int = 0
    """Nodes closed for being idle (`ClusterConfig.idle_release_s`): dormant, their
    machine free for the cluster's autoscaler to take away."""


class Placer:
    def __init__(self, orphan_wait_s: float = 300.0) -> None:
        self.orphan_wait_s = orphan_wait_s
        """How long work waits for a tier no live node offers before `NoNodeForTier`."""
        self.orphan_timers: dict[str, asyncio.TimerHandle] = {}
        """Per tier without a live node: the timer that fails its waiters."""
        self.nodes: dict[str, _Node] = {}
        self.gone: set[str] = set()
        """Nodes lost or drained: never placed on again under that id."""
        self.dormant: dict[str, NodeInfo] = {}
        """Nodes released for being idle (`release_idle`): no actor, nothing placed on
        them; the backend admits one again (`add`) when work waits for its tier."""
        self.sessions: dict[str, str] = {}
        self.orphaned: dict[str, str] = {}
        """Sessions whose node was lost: their files went with it, so their next turn
        fails (NodeLost) instead of silently starting over elsewhere; end_session
        forgets them."""
        self.stats = PlacerStats()
        self._ids = itertools.count(1)
        self._seq = itertools.count()
        self._waiters: list[tuple[int, int, str, str | None, asyncio.Future[Lease]]] = []

    # ------------------------------------------------------------------ membership
    def add(self, info: NodeInfo) -> None:
        if info.node_id in self.nodes or info.node_id in self.gone:
            raise UsageError(f"node {info.node_id} is already known to this placer")
        if info.slots < 1 or not info.tiers:
            raise UsageError(f"node {info.node_id} offers {info.slots} slots and tiers "
                             f"{info.tiers}: declare trialbox_slots >= 1 and at least one "
                             "trialbox_tier_<name> resource")
        node = _Node(info, idle_since=time.monotonic())
        node.idle.set()
        self.dormant.pop(info.node_id, None)
        self.nodes[info.node_id] = node
        self.stats.nodes_joined += 1
        for tier in info.tiers:  # a node of the tier came back in time
            timer = self.orphan_timers.pop(tier, None)
            if timer is not None:
                timer.cancel()
        self._serve()

    def tiers(self) -> set[str]:
        return {t for n in self.nodes.values() if not n.draining for t in n.info.tiers}

    def offered(self) -> set[str]:
        """Tiers of the live nodes and of the dormant ones (admitted again on demand)."""
        return self.tiers() | {t for i in self.dormant.values() for t in i.tiers}

    def check_tier(self, tier: str) -> None:
        """Refuse at once a tier no live (or dormant) node offers (before anything is
        started)."""
        offered = self.offered()
        if tier not in offered:
            raise TierUnavailable(
                f"no node of the cluster offers the {tier!r} sandbox tier (offered: "
                f"{', '.join(sorted(offered)) or 'none — no trialbox node joined'}); start "
                f"nodes with `ray start ... --resources "
                f"'{{\"trialbox_node\": 1, \"trialbox_slots\": 8, \"trialbox_tier_{tier}\": 1}}'`"
                " or ask for an offered tier")

    def lose(self, node_id: str, why: str) -> list[Lease]:
        """The node is dead or cut off: fence its leases (their waiters get NodeLost),
        forget its sessions, never place on it again. Returns the fenced leases."""
        node = self.nodes.pop(node_id, None)
        if node is None:
            return []
        self.gone.add(node_id)
        self.stats.nodes_lost += 1
        fenced = list(node.inflight.values())
        for lease in fenced:
            lease.fenced = True
            self.stats.fenced += 1
            if lease.lost is not None and not lease.lost.done():
                lease.lost.set_exception(NodeLost(
                    f"node {node_id} lost while running this work ({why}); retried "
                    "elsewhere"))
        node.inflight.clear()
        node.idle.set()
        lost_sessions = {s for s, n in self.sessions.items() if n == node_id}
        for s in lost_sessions:
            del self.sessions[s]
            self.orphaned[s] = node_id
        for _, _, _, session, fut in self._waiters:  # waiters for its sessions learn now
            if session in lost_sessions and not fut.done():
                fut.set_exception(NodeLost(f"session {session!r}: node {node_id} lost "
                                           f"({why})"))
        self._orphan(node.info.tiers, f"node {node_id} lost ({why})")
        return fenced

    def _orphan(self, tiers: tuple[str, ...], why: str) -> None:
        """Start the wait of each of `tiers` no live node offers now."""
        left = self.tiers()
        for tier in tiers:
            if tier in left or tier in self.orphan_timers:
                continue
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # bookkeeping outside a loop (tests): nothing waits
                return
            self.orphan_timers[tier] = loop.call_later(
                self.orphan_wait_s, self._orphaned_tier, tier, why)

    def _orphaned_tier(self, tier: str, why: str) -> None:
        self.orphan_timers.pop(tier, None)
        if tier in self.tiers():
            return
        err = (f"no live node offers the {tier!r} tier any more (the last: {why}) and "
               f"none joined within {self.orphan_wait_s:g} s; start one (`ray start ... "
               f"--resources '{{\"trialbox_node\": 1, \"trialbox_slots\": 8, "
               f"\"trialbox_tier_{tier}\": 1}}'`) and retry — the work was not run")
        for _, _, t, _, fut in self._waiters:
            if t == tier and not fut.done():
                fut.set_exception(NoNodeForTier(err))

    def drain(self, node_id: str) -> asyncio.Event:
        """Take no new work on the node; the event is set once its last lease ends."""
        node = self.nodes.get(node_id)
        if node is None:
            raise UsageError(f"no live node {node_id!r} to drain (live: "
                             f"{', '.join(self.nodes) or 'none'})")
        node.draining = True
        return node.idle

    def idle_for(self, node_id: str) -> float:
        """Seconds the node has had no work in flight and no session (0 if it has)."""
        return self.idle_nodes(0.0).get(node_id, 0.0)

    def idle_nodes(self, longer_than: float) -> dict[str, float]:
        """Live nodes with no work in flight, no session and no drain for more than
        `longer_than` seconds, with how long (one pass over the sessions)."""
        now = time.monotonic()
        with_sessions = set(self.sessions.values())
        return {nid: now - n.idle_since for nid, n in self.nodes.items()
                if not n.inflight and not n.draining and nid not in with_sessions
                and now - n.idle_since > longer_than}

    def release_idle(self, node_id: str) -> None:
        """Take the idle node out of placement without calling it gone: it becomes
        dormant (`add` admits it again). The caller checked `idle_nodes` in this same
        step (nothing runs there, no session lives there)."""
        node = self.nodes.pop(node_id, None)
        if node is None:
            return
        self.dormant[node_id] = node.info
        self.stats.nodes_released += 1
        self._orphan(node.info.tiers, f"node {node_id} released (idle)")

    def forget_dormant(self, node_id: str) -> None:
        """A dormant node's machine is gone (its raylet left): nothing to admit again."""
        self.dormant.pop(node_id, None)

    def waiting_tiers(self) -> set[str]:
        """Tiers that work is waiting for (a free slot, or a node)."""
        return {w[2] for w in self._waiters if not w[4].done()}

    def remove_drained(self, node_id: str) -> None:
        node = self.nodes.pop(node_id, None)
        if node is not None:
            self.gone.add(node_id)
            self.stats.nodes_drained += 1
            for s in [s for s, n in self.sessions.items() if n == node_id]:
                del self.sessions[s]
            self._orphan(node.info.tiers, f"node {node_id} drained")

    # ------------------------------------------------------------------ leases
    async def acquire(self, tier: str, priority: int = 1,
                      session: str | None = None) -> Lease:
        """A lease on the best node for this tier (and session); waits for a free slot."""
        lease = self._try(tier, session)
        if lease is not None:
            return lease
        if tier not in self.tiers():  # its nodes are gone: wait orphan_wait_s at most
            self._orphan((tier,), "none live")
        fut: asyncio.Future[Lease] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (priority, next(self._seq), tier, session, fut))
        try:
            return await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                self.release(fut.result())  # granted just as we were cancelled
            raise

    def release(self, lease: Lease) -> bool:
        """The work of `lease` ended. True if its answer counts; False if the lease was
        fenced (its node presumed dead): the answer must be discarded."""
        if lease.fenced:
            self.stats.late_discarded += 1
            return False
        node = self.nodes.get(lease.node)
        if node is not None and node.inflight.pop(lease.lease_id, None) is not None:
            if not node.inflight:
                node.idle.set()
                node.idle_since = time.monotonic()
            self._serve()
        return True

    def end_session(self, session: str) -> None:
        self.sessions.pop(session, None)
        self.orphaned.pop(session, None)

    def _try(self, tier: str, session: str | None) -> Lease | None:
        if session is not None and session in self.orphaned:
            raise NodeLost(f"session {session!r}: its node {self.orphaned[session]} was "
                           "lost with the session's files")
        if session is not None and session in self.sessions:
            node = self.nodes.get(self.sessions[session])
            if node is None:
                raise NodeLost(f"session {session!r}: its node is gone")
            # a draining node still serves its sessions' next turns
            return self._grant(node, tier, session) if len(node.inflight) < \
                node.info.slots else None
        best: _Node | None = None
        for node in self.nodes.values():
            if node.draining or tier not in node.info.tiers:
                continue
            if len(node.inflight) >= node.info.slots:
                continue
            if best is None or _key(node) < _key(best):
                best = node
        return None if best is None else self._grant(best, tier, session)

    def _grant(self, node: _Node, tier: str, session: str | None) -> Lease:
        lease = Lease(next(self._ids), node.info.node_id, tier, session)
        node.inflight[lease.lease_id] = lease
        node.idle.clear()
        node.last_used = time.monotonic()
        node.placed += 1
        self.stats.placed += 1
        if session is not None:
            self.sessions[session] = node.info.node_id
        return lease

    def _serve(self) -> None:
        """Hand free slots to waiters, most urgent first; a waiter that cannot be placed
        (its tier's nodes are full) does not block those behind it."""
        kept = []
        free = sum(n.info.slots - len(n.inflight) for n in self.nodes.values())
        while self._waiters and free > 0:
            item = heapq.heappop(self._waiters)
            _, _, tier, session, fut = item
            if fut.done():
                continue
            try:
                lease = self._try(tier, session)
            except NodeLost as e:
                fut.set_exception(e)
                continue
            if lease is None:
                kept.append(item)
            else:
                free -= 1
                fut.set_result(lease)
        for item in kept:
            heapq.heappush(self._waiters, item)

    def waiting(self) -> int:
        return sum(1 for w in self._waiters if not w[4].done())

    def load(self) -> dict[str, int]:
        """In-flight leases per live node."""
        return {nid: len(n.inflight) for nid, n in self.nodes.items()}


def _key(node: _Node) -> tuple[float, float]:
    return (len(node.inflight) / node.info.slots, node.last_used)
