"""What runs on each machine: one `Node` per host (a Ray actor, made one by
`backend.py`), owning that host's sandbox providers — one per tier it offers — and the
workloads the driver loaded onto it. A piece of work (a judging: the candidate's sandbox
and the trusted harness) runs whole on the node, so a node grades, not just executes.

A *workload* is a small picklable object the driver sends once per run:

    class Workload(Protocol):
        async def start(self, node: NodeContext) -> None: ...       # on the node
        async def run(self, payload, session: dict | None) -> Any: ...
        async def close(self) -> None: ...

`EvalWorkload` grades eval attempts (`judge.evaluate.Evaluator` on the node's pool);
`FakeWorkload` (tests, the scale bench) opens `FakeSandbox` sessions and sleeps.

Nothing here imports Ray: the class is plain Python; `backend.py` wraps it.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from trialbox.errors import SandboxUnavailable, UsageError
from trialbox.judge.evaluate import Evaluator, Reference
from trialbox.judge.function import JudgeConfig
from trialbox.judge.stdio import StdioJudgeConfig
from trialbox.judge.reward import RewardSpec
from trialbox.sandbox.base import SandboxProvider
from trialbox.sandbox.fake import FakeProvider
from trialbox.sandbox.languages import offered
from trialbox.types import Grade, Task
from trialbox.versions import software_versions

TIERS = ("namespace", "gvisor", "container", "fake")
"""Tiers a node can offer (the names of its `trialbox_tier_<name>` resources): the
judging providers of `judge/provider.py` (`container` runs `runc`), and `fake` (tests)."""


@dataclass(frozen=True)
class NodeConfig:
    """One node's offer, read from its Ray resources by the driver."""

    node_id: str
    slots: int
    """Sandbox sessions in flight at once (`trialbox_slots`)."""
    tiers: tuple[str, ...]
    """Tiers offered (`trialbox_tier_<name>`)."""
    warm: int = 2
    """Warm cells per namespace pool."""

    def __post_init__(self) -> None:
        unknown = [t for t in self.tiers if t not in TIERS]
        if unknown:
            raise UsageError(f"node {self.node_id}: unknown tier(s) {unknown}; a node "
                             f"offers some of {list(TIERS)} (trialbox_tier_<name>)")
        if self.slots < 1:
            raise UsageError(f"node {self.node_id}: trialbox_slots must be >= 1")


@dataclass
class NodeContext:
    """What a workload sees of its node."""

    config: NodeConfig
    providers: dict[str, SandboxProvider]


class Workload(Protocol):
    tier: str
    """The sandbox tier it runs on: loaded only on nodes offering it."""

    async def start(self, node: NodeContext) -> None: ...

    async def run(self, payload: Any, session: dict[str, Any] | None) -> Any: ...

    async def close(self) -> None: ...


@dataclass
class NodeStats:
    runs: int = 0
    inflight: int = 0
    lease_ids: list[int] = field(default_factory=list)
    """Every lease this node ran to the end (what the driver may or may not accept)."""
    run_ms: deque[float] = field(default_factory=lambda: deque(maxlen=10_000))


class Node:
    """The body of a node actor. `start` opens the providers and returns what the driver
    checks (versions, code fingerprint); `run` does one piece of work of a loaded
    workload; `close` ends everything and reports leaks."""

    def __init__(self, config: NodeConfig):
        self.config = config
        self.providers: dict[str, SandboxProvider] = {}
        self.workloads: dict[str, Workload] = {}
        self.sessions: dict[str, dict[str, Any]] = {}
        self.stats = NodeStats()
        self._pools: list[Any] = []
        self.channel: dict[str, Any] | None = None
        self._server: Any = None

    async def start(self, channel_host: str | None = None) -> dict[str, Any]:
        """Open the providers, each tier proved first (`open_tier`); with
        `channel_host`, also serve `run` on a TCP port of that address (`channel.py`:
        the driver's hot path beside Ray)."""
        try:
            for tier in self.config.tiers:
                if tier == "fake":
                    self.providers[tier] = FakeProvider()
                    continue
                provider = await open_tier(tier, self.config)
                self._pools.append(provider)
                self.providers[tier] = provider
            if channel_host is not None:
                from trialbox.cluster.channel import ChannelServer

                async def handle(args: Any) -> Any:
                    return await self.run(*args)
                self._server = ChannelServer(handle, channel_host,
                                             label=f"node {self.config.node_id}")
                self.channel = await self._server.start()
        except BaseException:  # a tier it cannot run: nothing half-started stays
            await self._close_pools()
            raise
        return self.info()

    def versions(self) -> dict[str, Any]:
        """What the driver compares with its own before anything starts here."""
        return software_versions()

    def info(self) -> dict[str, Any]:
        return {"node_id": self.config.node_id, "pid": os.getpid(), **self.versions(),
                "tiers": list(self.config.tiers), "slots": self.config.slots,
                "runtimes": {t: p.runtime for t, p in self.providers.items()},
                "engines": {t: engine_of(p) for t, p in self.providers.items()},
                "pools": [p.id for p in self._pools], "channel": self.channel,
                "languages": offered()}

    async def ping(self) -> float:
        return time.time()

    async def load(self, name: str, workload: Workload) -> None:
        if name in self.workloads or workload.tier not in self.providers:
            return  # placement sends its work only to nodes offering its tier
        await workload.start(NodeContext(self.config, self.providers))
        self.workloads[name] = workload

    async def run(self, lease_id: int, name: str, payload: Any,
                  session: str | None = None) -> Any:
        workload = self.workloads.get(name)
        if workload is None:
            raise UsageError(f"workload {name!r} is not loaded on node "
                             f"{self.config.node_id}")
        state = None
        if session is not None:
            state = self.sessions.setdefault(session, {})
        self.stats.inflight += 1
        t0 = time.perf_counter()
        try:
            out = await workload.run(payload, state)
        finally:
            self.stats.inflight -= 1
        self.stats.run_ms.append((time.perf_counter() - t0) * 1000)
        self.stats.runs += 1
        self.stats.lease_ids.append(lease_id)
        return out

    def run_times(self) -> list[float]:
        """Milliseconds each `run` took on this node since the last call (at most the
        latest 10,000): `bench cluster` splits a judged attempt's time through Ray into
        the node's part and the transport's."""
        out = list(self.stats.run_ms)
        self.stats.run_ms.clear()
        return out

    async def end_session(self, session: str) -> None:
        state = self.sessions.pop(session, None)
        sb = (state or {}).get("sandbox")
        if sb is not None:
            await sb.close()

    def lease_ids(self) -> list[int]:
        return list(self.stats.lease_ids)

    async def _close_pools(self) -> None:
        pools, self._pools = self._pools, []
        for p in pools:
            await p.close()

    async def close(self) -> dict[str, Any]:
        """End sessions, workloads and pools; report what is left on the host of this
        node's pools (nothing, if all is well)."""
        if self._server is not None:
            await self._server.close()
            self._server = None
        for s in list(self.sessions):
            await self.end_session(s)
        for w in self.workloads.values():
            await w.close()
        self.workloads.clear()
        ids = [p.id for p in self._pools]
        await self._close_pools()
        return {"runs": self.stats.runs, "lease_ids": list(self.stats.lease_ids),
                "leaks": await asyncio.to_thread(leaks_of, ids)}


# ---------------------------------------------------------------------- tiers
async def probe_tier(tier: str) -> Any:
    """`trialbox doctor`'s verdict on `tier` here (`sandbox/doctor.py`, a `TierReport`):
    a real sandbox of the tier is started and runs /bin/true. `container` is runc's,
    the runtime `ContainerProvider` uses."""
    from trialbox.sandbox import doctor
    if tier == "namespace":
        return await doctor.check_namespace()
    if tier == "gvisor":
        return await doctor.check_gvisor()
    if tier == "container":
        return await doctor.check_container("runc")
    raise UsageError(f"no probe for tier {tier!r}")


async def open_tier(tier: str, config: NodeConfig) -> Any:
    """The started judging provider of `tier` on this node (`judge.provider.make_provider`,
    `config.warm` sessions kept ready), once doctor's probe has proved the tier runs
    here. A tier the node declares but cannot run is a `SandboxUnavailable` naming the
    tier, what is missing and the fix: the node does not start (never another tier)."""
    from trialbox.judge.provider import make_provider
    report = await probe_tier(tier)
    if not report.ok:
        raise SandboxUnavailable(
            f"this node declares trialbox_tier_{tier} but cannot run the "
            f"{tier} tier: {report.reason}" + (f" (fix: {report.fix})" if report.fix else "")
            + f". Fix it, or start the node without trialbox_tier_{tier}")
    provider = make_provider(tier, warm=config.warm)
    try:
        await provider.start()
    except BaseException:
        await provider.close()
        raise
    return provider


def engine_of(provider: SandboxProvider) -> str:
    """What runs the provider's sandboxes: the OCI runtime (`runsc`, `runc`), else the
    tier's own machinery (`namespace`: trialbox's cells; `fake`)."""
    engine = getattr(provider, "engine", None)
    return str(engine.name) if engine is not None else provider.tier


def leaks_of(pool_ids: list[str]) -> dict[str, list[str]]:
    """Cgroups, state and processes still on this host for these pools: namespace pools
    (`sandbox/pool.py`: `trialbox/<id>` cgroups, `<state_dir>/<id>`) and OCI providers
    (`sandbox/oci.py`: `trialbox-oci/<id>` cgroups in every hierarchy, `<state_dir>/<id>`
    with the runtime's container state, mounts under it, and any process in those cgroups
    or naming that directory — a runsc sandbox or gofer left running)."""
    from trialbox.sandbox.cgroups import CgroupDriver
    from trialbox.sandbox.mounts import mounts_under
    from trialbox.sandbox.oci import OciConfig, cgroup_roots
    from trialbox.sandbox.pool import PoolConfig
    found: dict[str, list[str]] = {"cgroups": [], "state": [], "processes": []}
    if not pool_ids:
        return found
    try:
        driver = CgroupDriver.detect()
        tops = list(driver.dirs("trialbox"))
    except Exception:
        tops = []
    tops += [os.path.join(root, "trialbox-oci") for root in cgroup_roots()]
    for top in tops:
        for pid in pool_ids:
            d = os.path.join(top, pid)
            if os.path.isdir(d):
                found["cgroups"].append(d)
    oci_dirs = [os.path.join(OciConfig().state_dir, pid) for pid in pool_ids]
    for d in [os.path.join(PoolConfig().state_dir, pid) for pid in pool_ids] + oci_dirs:
        if os.path.exists(d):
            found["state"].append(d)
        found["state"] += [f"mount {m}" for m in mounts_under(d)]
    marks = [f"{top}/{p}{end}" for top in ("trialbox", "trialbox-oci") for p in pool_ids
             for end in ("/", "\n")]
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cgroup") as f:
                text = f.read()
            with open(f"/proc/{name}/cmdline", "rb") as fb:
                cmdline = fb.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if (any(m in text for m in marks) or any(d + "/" in cmdline for d in oci_dirs)):
            found["processes"].append(name)
    return found


# ---------------------------------------------------------------------- workloads
@dataclass
class EvalWorkload:
    """Grades eval attempts on the node: an `Evaluator` over the node's pool of `tier`,
    with the node's slots as its workers (harness sessions). The payload is `(sample,
    repeat, seed)`, the seed derived by the driver (or a bare sample); the answer
    `(Grade, Reference)`."""

    tasks: dict[str, Task]
    tier: str = "namespace"
    config: JudgeConfig | None = None
    stdio_config: StdioJudgeConfig | None = None
    reward_spec: RewardSpec | None = None
    _ev: Evaluator | None = None

    async def start(self, node: NodeContext) -> None:
        provider = node.providers.get(self.tier)
        if provider is None:
            raise UsageError(f"node {node.config.node_id} does not offer tier {self.tier!r}")
        self._ev = Evaluator(self.tasks, provider,
                             workers=node.config.slots, config=self.config,
                             stdio_config=self.stdio_config, reward_spec=self.reward_spec)
        await self._ev.start(node.config.slots)

    async def run(self, payload: Any, session: dict[str, Any] | None) -> tuple[Grade,
                                                                               Reference]:
        assert self._ev is not None
        if isinstance(payload, tuple):  # (sample, repeat, seed): the driver's seed
            return await self._ev.attempt(*payload)
        return await self._ev.attempt(payload)

    async def close(self) -> None:
        if self._ev is not None:
            await self._ev.close()


@dataclass
class FakeWorkload:
    """Fake sandboxes (no isolation): opens a session, writes the payload, runs one
    command, sleeps `seconds` (the work), returns where and what ran. With a session, the
    sandbox is kept across calls and each call adds a file (affinity is visible)."""

    seconds: float = 0.0
    tier: str = "fake"
    clock: Callable[[], float] = time.time
    _node: NodeContext | None = None

    async def start(self, node: NodeContext) -> None:
        if self.tier not in node.providers:
            raise UsageError(f"node {node.config.node_id} does not offer tier {self.tier!r}")
        self._node = node

    async def run(self, payload: Any, session: dict[str, Any] | None) -> dict[str, Any]:
        assert self._node is not None
        started = self.clock()
        provider = self._node.providers[self.tier]
        if session is not None:
            sb = session.get("sandbox")
            if sb is None:
                sb = session["sandbox"] = await provider.open()
            n = len(await sb.list_files())
            await sb.write_file(f"turn{n}", repr(payload).encode())
            files = await sb.list_files()
        else:
            async with await provider.open() as sb:
                await sb.write_file("main.py", repr(payload).encode())
                await sb.exec(["python3", "main.py"])
                files = await sb.list_files()
        if self.seconds:
            await asyncio.sleep(self.seconds)
        return {"node": self._node.config.node_id, "pid": os.getpid(),
                "payload": payload, "files": files, "started": started,
                "at": self.clock()}

    async def close(self) -> None:
        self._node = None


@dataclass
class JudgeWorkload:
    """Grades one answer with the trusted judge on the node's pool of `tier` (what
    `trialbox serve --backend ray` places for /v1/submissions). The payload is
    `(task, answer, language)` or `(task, answer, language, seed)` — the driver derives
    the seed, so every node draws alike for the same code (judge/seeds.py); the answer
    a `Grade`."""

    tier: str = "namespace"
    _provider: SandboxProvider | None = None

    async def start(self, node: NodeContext) -> None:
        self._provider = node.providers.get(self.tier)
        if self._provider is None:
            raise UsageError(f"node {node.config.node_id} does not offer tier {self.tier!r}")

    async def run(self, payload: Any, session: dict[str, Any] | None) -> Grade:
        from trialbox.judge.grade import grade
        assert self._provider is not None
        task, answer, language, *rest = payload  # + the seed, where the driver gave one
        seed = rest[0] if rest else None
        return await grade(task, answer, self._provider, language=language, seed=seed)

    async def close(self) -> None:
        self._provider = None
