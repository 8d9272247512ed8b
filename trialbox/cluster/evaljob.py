"""`trialbox eval --backend ray`: the journaled eval run of `schedule/evaljob.py`, the
same scheduler and journal on the driver, with each attempt graded whole on a cluster
node (its own pool: candidate sandbox and trusted harness side by side).

Nothing is forked: `ClusterEvaluator` is the `Evaluator` whose `attempt` runs on a node
(`RayBackend.run`); rows and summaries are assembled on the driver from the journal as
on one machine. Without `--db` the journal is a temporary file, removed afterwards.
"""

from __future__ import annotations

import os
import sys
import tempfile
from dataclasses import dataclass
from typing import Any

from trialbox.cluster.backend import ClusterConfig, RayBackend
from trialbox.cluster.node import EvalWorkload
from trialbox.errors import UsageError
from trialbox.judge.evaluate import Evaluator, Reference, attempt_seed, progress_bar
from trialbox.judge.function import JudgeConfig
from trialbox.judge.reward import RewardSpec
from trialbox.judge.stdio import StdioJudgeConfig
from trialbox.schedule.evaljob import evaluate_journaled, inputs_fingerprint, open_run
from trialbox.types import EvalSample, Grade, GradedRow, Runtime, Sample, Task


@dataclass(frozen=True)
class _Environment:
    """What the driver-side Evaluator reads of "its pool": the runtime the nodes' pools
    run (checked against each task's declared image, recorded in each row)."""

    runtime: Runtime


def runtime_of(backend: RayBackend, tier: str) -> Runtime:
    """The runtime of `tier` on the nodes; every node offering it must run the same."""
    seen: dict[str, Runtime] = {nid: m.info["runtimes"][tier]
                                for nid, m in backend.members.items()
            if tier in m.info.get("runtimes", {})}
    if not seen:
        backend.check_tier(tier)  # raises TierUnavailable, naming the offered tiers
    ids = {r.id for r in seen.values()}
    if len(ids) > 1:
        raise UsageError(f"the nodes offering tier {tier!r} run different environments "
                         f"({', '.join(f'{n[:12]}: {r.id}' for n, r in seen.items())}); "
                         "give them the same runtime (image) so every attempt is graded "
                         "alike")
    return next(iter(seen.values()))


class ClusterEvaluator(Evaluator):
    """An `Evaluator` whose attempts are graded on cluster nodes (the row assembly —
    style, efficiency and memory scores — stays on the driver)."""

    def __init__(self, tasks: dict[str, Task], backend: RayBackend, name: str, *,
                 tier: str = "namespace", workers: int = 4,
                 config: JudgeConfig | None = None,
                 stdio_config: StdioJudgeConfig | None = None,
                 reward_spec: RewardSpec | None = None):
        super().__init__(tasks, _Environment(runtime_of(backend, tier)),  # type: ignore[arg-type]
                         workers=workers, config=config, stdio_config=stdio_config,
                         reward_spec=reward_spec)
        self.backend, self.name, self.tier = backend, name, tier

    async def start(self, attempts: int) -> None:
        self.backend.check_tier(self.tier)
        await self.backend.load(self.name, EvalWorkload(
            self.tasks, self.tier, self.config, self.stdio_config, self.reward_spec))

    async def close(self) -> None:
        """The nodes' harnesses close with the nodes (`RayBackend.close`)."""

    async def attempt(self, sample: EvalSample, repeat: int = 0,
                      seed: int | None = None) -> tuple[Grade, Reference]:
        if seed is None:  # derived here, so every node draws alike
            seed = attempt_seed(self.tasks[sample.task_id], sample, repeat)
        grade, reference = await self.backend.run(self.name, (sample, repeat, seed),
                                                  tier=self.tier)
        return grade, reference


async def eval_on_cluster(tasks: dict[str, Task], samples: list[Sample], *,
                          cluster: ClusterConfig, tier: str, workers: int, repeat: int,
                          db: str | None, run: str, resume: bool, samples_bytes: bytes,
                          reward: str, time_scale: float | None, amplified: str | None,
                          config: JudgeConfig | None, stdio_config: StdioJudgeConfig | None,
                          reward_spec: RewardSpec | None,
                          ) -> tuple[list[GradedRow], dict[str, Any]]:
    """Connect (refusing an unreachable cluster, mismatched nodes, a tier no node
    offers — before the journal is touched), then run the journaled eval on it."""
    fingerprint = inputs_fingerprint(samples_bytes, list(tasks), repeat=repeat,
                                     reward=reward, time_scale=time_scale,
                                     amplified=amplified)
    async with RayBackend(cluster) as backend:
        backend.check_tier(tier)
        slots = sum(m.config.slots for m in backend.members.values())
        tmpdir = None
        if db is None:
            tmpdir = tempfile.mkdtemp(prefix="trialbox-eval-")
            db = os.path.join(tmpdir, "journal.db")
        journal = open_run(db, run, fingerprint, resume)
        try:
            ev = ClusterEvaluator(tasks, backend, f"eval:{run}", tier=tier,
                                  workers=max(workers, slots), config=config,
                                  stdio_config=stdio_config, reward_spec=reward_spec)
            rows, summary, info = await evaluate_journaled(
                journal, run, ev, samples, repeat=repeat, fingerprint=fingerprint,
                resume=resume, progress=progress_bar)
        finally:
            journal.close()
            if tmpdir is not None:
                for name in os.listdir(tmpdir):
                    os.unlink(os.path.join(tmpdir, name))
                os.rmdir(tmpdir)
        stats = backend.placer.stats
        summary["cluster"] = {"nodes": len(backend.placer.nodes), "slots": slots,
                              "placed": stats.placed, "nodes_lost": stats.nodes_lost,
                              "fenced": stats.fenced,
                              "late_discarded": stats.late_discarded}
        if tmpdir is not None:
            summary.pop("db", None)
        print(f"trialbox: eval run {info.run_id!r} on {len(backend.placer.nodes)} Ray "
              f"node(s): {info.graded_now} attempts graded now, {info.read_back} read back",
              file=sys.stderr)
    return rows, summary
