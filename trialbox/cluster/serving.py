"""`trialbox serve --backend ray`: the service's trusted grading (`/v1/submissions`,
`/v1/submissions/batch`) placed on the nodes of a Ray cluster; everything else of the
service (admission, journal, sessions, `/run_code`) stays in the server process.

    grader = await ClusterGrader.start(ClusterConfig(address="HEAD:6379"), "namespace")
    grade = await grader.grade(task, completion, "python")     # judged on a node
    await grader.close()

Started before the server binds its port: an unreachable address, nodes running other
code or a tier no node offers is refused (a `UsageError`, exit 2) with nothing started.
"""

from __future__ import annotations

from typing import Any

from trialbox.cluster.backend import ClusterConfig, RayBackend
from trialbox.cluster.node import JudgeWorkload
from trialbox.types import Grade, Task

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

    async def grade(self, task: Task, answer: Any, language: str) -> Grade:
        """Judged whole on one node; a node lost meanwhile raises `NodeLost`."""
        out: Grade = await self.backend.run(WORKLOAD, (task, answer, language),
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
