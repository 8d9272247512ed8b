"""Each training step's rollout: which weights sample its episodes, where they run, and
the batches (`pipeline.py`) that launch them.

    async with StepRollouts(config, sets, agent, pool, ...) as rollouts:
        batches = rollouts.batches(first=state.step)   # sync or async: [rollout] mode
        got = await batches.get(step)                  # stamped with its version

Which weights sample step s: the live model (sync), a private copy of them taken at
launch (async, `WeightCopies`), or the version the trainer published to the policy
servers (`--policy-servers`, `PolicyServers`). Where its episodes run: each a task of
the journaled scheduler (`episodes.py`: its quota pool admits `env_workers` turns at
once, the oldest step first, and a killed run resumes inside a step); with `[run]
journal = "off"`, the agent loop directly, the environment behind `PrioritySlots` too
(the previous path, kept so `bench train` can compare the two). The model is not
sandbox capacity: one generate call or update at a time on its one device, the oldest
batch first (`model_slots`, which the update shares).
"""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import asdict
from typing import Any, Protocol

from trialbox.rollout.agent import AgentConfig, Grader, RolloutBatch, rollout
from trialbox.rollout.hf_policy import HFPolicy
from trialbox.rollout.policy import ByteTokenizer, Policy
from trialbox.sandbox.base import SandboxProvider
from trialbox.store.journal import Journal
from trialbox.train import episodes as journaled
from trialbox.train.config import RolloutMode, TrainConfig
from trialbox.train.metrics import Progress
from trialbox.train.pipeline import (
    AsyncBatches,
    Batches,
    ModelClock,
    PrioritySlots,
    SyncBatches,
    TimedPolicy,
    WeightCopies,
)
from trialbox.train.tasksets import TaskSets
from trialbox.types import Trajectory


class PolicyServers(Protocol):
    """Where the policy samples when not in the trainer's process (`--policy-servers N`:
    `rollout.fleet.PolicyFleet`), given each version of the weights as the trainer
    makes it."""

    async def publish(self, model: Any, version: int) -> None:
        """The servers hold `model`'s weights as `version` (before it is asked for)."""

    def policy(self, version: int, seed: int) -> Policy:
        """A policy sampling with `version`'s weights, seeded."""

    def status(self) -> dict[str, Any]: ...

    async def servers_info(self) -> list[dict[str, Any]]: ...

    async def close(self) -> None: ...


def sampling_seed(seed: int, step: int) -> int:
    """The seed step `step`'s rollout samples with: a function of ([run] seed, step), so
    a resumed run draws as the uninterrupted one did from the step it resumes at."""
    return seed * 1_000_003 + step


class StepRollouts:
    """The rollout of every step of one run, and the journal its episodes go through
    (open while in `async with`; leaving it cancels the batches in flight)."""

    def __init__(self, config: TrainConfig, sets: TaskSets, agent: AgentConfig,
                 pool: SandboxProvider, grader: Grader | None, *, model: Any,
                 tok: ByteTokenizer, policy: HFPolicy, fleet: PolicyServers | None,
                 clock: ModelClock, model_slots: PrioritySlots, journal_file: str | None,
                 run_id: str, inputs: dict[str, Any], say: Progress):
        self.config, self.sets, self.agent, self.pool, self.grader = \
            config, sets, agent, pool, grader
        self.model, self.tok, self.policy, self.fleet = model, tok, policy, fleet
        self.clock, self.model_slots = clock, model_slots
        self.journal_file, self.run_id, self.inputs, self.say = \
            journal_file, run_id, inputs, say
        self.asynchronous = config.rollout.mode is RolloutMode.ASYNC
        # async: one private copy of the weights per batch in flight (pipeline.py);
        # with policy servers each holds the versions in flight instead
        self.copies = WeightCopies(model, config.rollout.max_staleness + 1) \
            if self.asynchronous and fleet is None else None
        self.env_slots = PrioritySlots(config.rollout.env_workers)
        self.journal: Journal | None = None
        self.eps: journaled.JournaledEpisodes | None = None
        self._batches: Batches | None = None

    async def __aenter__(self) -> StepRollouts:
        if self.journal_file is not None:
            g, r = self.config.grpo, self.config.rollout
            self.journal = Journal(self.journal_file)
            self.eps = journaled.JournaledEpisodes(
                self.journal, self.run_id, self.agent, self.pool, group_size=g.group_size,
                env_workers=r.env_workers,
                in_flight=r.max_staleness + 1 if self.asynchronous else 1,
                inputs=self.inputs, tasks_per_step=g.tasks_per_step, tokenizer=self.tok,
                grader=self.grader)
            await self.eps.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._batches is not None:
            await self._batches.aclose()
        if self.eps is not None:
            await self.eps.__aexit__(None, None, None)
            self.say("episodes", {"journal": self.journal_file, "run": self.run_id,
                                  **asdict(self.eps.counts)})
        if self.journal is not None:
            self.journal.close()

    def read_back(self, steps: int) -> list[list[Trajectory]] | None:
        """Steps 0 .. steps - 1's trajectories, read back from the journal (None: no
        journal)."""
        if self.eps is None:
            return None
        return [self.eps.step_trajectories(s, self.sets.train_step(s))
                for s in range(steps)]

    def batches(self, first: int) -> Batches:
        """The batches from step `first` on, started (async: the first K + 1 launched)."""
        r = self.config.rollout
        self._batches = AsyncBatches(
            self.launch, first=first, steps=self.config.grpo.steps,
            max_staleness=r.max_staleness) if self.asynchronous \
            else SyncBatches(self.launch)
        self._batches.start()
        return self._batches

    def launch(self, step: int, version: int) -> Awaitable[RolloutBatch]:
        """Step `step`'s rollout, sampled by the live model (sync) or by a copy of its
        weights taken now (async; `version` is what the trainer published)."""
        seed = sampling_seed(self.config.run.seed, step)
        if self.fleet is not None:  # seeded as the local policy is: (seed, step)
            return self._sample_with(step, self.fleet.policy(version, seed))
        if self.copies is None:
            if self.eps is not None:  # a resumed run draws as the uninterrupted one did
                self.policy.generator.manual_seed(seed)
            return self._sample_with(step, self.policy)
        return self.copies.run_on_snapshot(self.model, lambda weights: self._sample_with(
            step, HFPolicy(weights, self.tok, seed=seed)))

    def _sample_with(self, step: int, sampler: Policy) -> Awaitable[RolloutBatch]:
        # on policy servers, generation does not take the trainer's device
        timed = TimedPolicy(sampler, self.clock, None if self.fleet is not None
                            else self.model_slots.lane(step))
        if self.eps is not None:
            return self.eps.rollout(step, self.sets.train_step(step), timed)
        return rollout(timed, self.sets.train_step(step),
                       group_size=self.config.grpo.group_size, pool=self.pool,
                       config=self.agent, env_slots=self.env_slots.lane(step),
                       grader=self.grader)
