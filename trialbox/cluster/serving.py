"""`trialbox serve --backend ray`: the service's sandbox work placed on the nodes of a
Ray cluster — its trusted grading (`/v1/submissions`, `ClusterGrader`), its one-shot runs
(`/run_code`, `/v1/exec`, `/run_jupyter`) and its `/v1/sessions` (`ServingProvider`, the
`RemoteProvider` of cluster/sessions.py). Admission, the journal and the HTTP front stay
in the server process; it needs no sandbox pool of its own.

    serving = await ClusterServing.start(ClusterConfig(address="HEAD:6379"), "namespace")
    app = create_app(config, provider=serving.provider, grader=serving.grader)
    ...
    await serving.close()

Started before the server binds its port: an unreachable address, nodes running other
code or a tier no node offers is refused (a `UsageError`, exit 2) with nothing started.
"""

from __future__ import annotations

from typing import Any

from trialbox.cluster.backend import ClusterConfig, RayBackend
from trialbox.cluster.node import JudgeWorkload
from trialbox.cluster.sessions import RemoteProvider, RemoteSandbox
from trialbox.errors import InfraError
from trialbox.judge.seeds import derive_seed
from trialbox.types import Grade, Limits, Task, TaskKind

WORKLOAD = "serve:judge"
PRIORITY = 0
"""The placer's most urgent priority: a client is waiting on each of these."""


class ClusterGrader:
    def __init__(self, backend: RayBackend, tier: str):
        self.backend, self.tier = backend, tier

    @classmethod
    async def start(cls, config: ClusterConfig, tier: str) -> ClusterGrader:
        backend = await RayBackend(config).start()
        try:
            backend.check_tier(tier)
            await backend.load(WORKLOAD, JudgeWorkload(tier))
        except BaseException:
            await backend.close()
            raise
        return cls(backend, tier)

    async def grade(self, task: Task, answer: Any, language: str,
                    seed: int | None = None) -> Grade:
        """Judged whole on one node; a node lost meanwhile raises `NodeLost`. A function
        task's seed is derived here, on the driver, when not given (judge/seeds.py): the
        same code draws alike on every node."""
        if seed is None and task.kind is TaskKind.FUNCTION and isinstance(answer, str):
            seed = derive_seed(task.task_id, answer)
        out: Grade = await self.backend.run(WORKLOAD, (task, answer, language, seed),
                                            tier=self.tier, priority=PRIORITY)
        return out

    def status(self) -> dict[str, Any]:
        s = self.backend.placer.stats
        return {"backend": "ray", "address": self.backend.config.address,
                "tier": self.tier, "nodes": len(self.backend.placer.nodes),
                "placed": s.placed, "waiting": self.backend.placer.waiting(),
                "nodes_lost": s.nodes_lost, "fenced": s.fenced,
                "late_discarded": s.late_discarded}

    async def close(self) -> None:
        await self.backend.close()


class ServingProvider(RemoteProvider):
    """The service's `SandboxProvider` on the cluster: every session it opens (a
    one-shot run's, a `/v1/sessions` session's) lives on a node offering the tier, at
    the placer's most urgent priority. No fd crosses machines (`passes_fds` False)."""

    def unavailable(self) -> str:
        """Why nothing can be placed now ("" when a live node offers the tier)."""
        if self.tier in self.backend.placer.offered():  # a dormant node is admitted again
            return ""
        lost = self.backend.placer.stats.nodes_lost
        return (f"no live cluster node offers the {self.tier!r} tier any more ({lost} "
                f"node(s) lost since the server started); nothing was run. Start a node "
                f"with `ray start --address {self.backend.config.address} --resources "
                f"'{{\"trialbox_node\": 1, \"trialbox_slots\": 8, "
                f"\"trialbox_tier_{self.tier}\": 1}}'` (the server admits it at once), "
                "then retry")

    async def open(self, limits: Limits | None = None) -> RemoteSandbox:
        """A session on the least loaded live node; `InfraError` at once (not a wait
        until the request's deadline) when no live node offers the tier."""
        why = self.unavailable()
        if why:
            raise InfraError(why)
        return await super().open(limits)

    def languages(self) -> list[str] | None:
        """The languages every live node offering the tier can run (the toolchains
        installed there, `Node.info`): a one-shot may be placed on any of them, so this
        is what the server offers and checks requests against — not its own machine's.
        None while no live node offers the tier (nothing to ask)."""
        placer = self.backend.placer
        offers = [set(m.info.get("languages", ()))
                  for nid, m in getattr(self.backend, "members", {}).items()
                  if nid in placer.nodes and self.tier in placer.nodes[nid].info.tiers]
        return sorted(set.intersection(*offers)) if offers else None

    def cluster_status(self) -> dict[str, Any]:
        """What /v1/status shows under `pool`: where the sessions are, per node."""
        placer = self.backend.placer
        on: dict[str, int] = {}
        for sb in self.live.values():
            on[sb.node] = on.get(sb.node, 0) + 1
        return {"backend": "ray", "tier": self.tier, "warm_cells": None,
                "sessions_open": len(self.live), "sessions_opened": self.opened,
                "nodes": {nid: {"slots": n.info.slots, "in_flight": len(n.inflight),
                                "placed": n.placed, "sessions": on.get(nid, 0),
                                "draining": n.draining}
                          for nid, n in placer.nodes.items()},
                "nodes_lost": sorted(placer.gone - set(self.backend.close_reports)),
                "nodes_dormant": sorted(placer.dormant)}


class ClusterServing:
    """The cluster side of one `trialbox serve --backend ray` process: one backend
    (`RayBackend`), its `grader` and its sandbox `provider`."""

    def __init__(self, grader: ClusterGrader, provider: ServingProvider):
        self.grader, self.provider = grader, provider
        self.backend = grader.backend

    @classmethod
    async def start(cls, config: ClusterConfig, tier: str) -> ClusterServing:
        grader = await ClusterGrader.start(config, tier)
        try:
            provider = await ServingProvider.start(grader.backend, tier, priority=PRIORITY)
        except BaseException:
            await grader.close()
            raise
        assert isinstance(provider, ServingProvider)
        return cls(grader, provider)

    async def close(self) -> None:
        """Close the sessions still open (the server closes its own first), then the
        backend: every node's sessions and pools."""
        try:
            await self.provider.close()
        finally:
            await self.grader.close()
