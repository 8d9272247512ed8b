"""Where each training step's batch comes from (`[rollout] mode`), and how long the
policy sat idle waiting on environments.

    sync   step s: rollout with the live weights (version s) ─► update ─► step s + 1
    async  batch s is launched the moment the trainer publishes version
           launch_version(s) = max(first, s - K)  (K = max_staleness), and is rolled out
           by a private copy of exactly those weights; the trainer takes batch s when it
           is done, updates in a worker thread (the event loop keeps driving the other
           batches' generation, sandboxes and judge meanwhile), publishes version s + 1,
           which launches batch s + 1 + K.

    K = 1:  rollout 0 (v0) ──┤update 0├        ┤update 1├        ┤update 2├
            rollout 1 (v0) ───────────┤        │                 │
                           rollout 2 (v1) ─────┤                 │
                                      rollout 3 (v2) ────────────┤ …
            (a batch's generation overlaps the previous batch's judging and the update)

**Staleness, and the rule.** A version of the weights is the number of update steps
they have seen (a skipped step still counts: the count is of steps, so staleness is
never under-stated). Batch s, trained by version s and sampled by version v, is s - v
stale. The bound is kept by *waiting*, not dropping: batch s is not started before
version s - K exists, so no batch is ever more than K stale and no rollout is thrown
away (on the 2-core machine the environment is the bottleneck, and a dropped batch would
waste all of it). `AsyncBatches.get` checks the rule anyway and raises `StalenessError`
rather than train on a batch that broke it. Every trajectory records its sampler's
version (`Trajectory.policy_version`).

**Off-policy correction.** The update's importance ratio is taken against the log-probs
each trajectory recorded when it was sampled (`update.py`: `Trajectory.old_logprobs`),
never a recompute, so a stale token's ratio is pi_now / pi_sampler and PPO's clip bounds
how far it moves the weights (clip_frac > 0 in the step records shows it acting).

**A consistent snapshot, and its cost.** The trainer's model is updated in a worker
thread; generation must not read it then. So every async batch samples from a private
copy (`WeightCopies`), loaded from the live weights at launch, on the event loop thread,
after the update that produced them has been awaited and before the next one starts: a
batch never sees half an update, and its weights do not change under it (a multi-turn
episode's turns all come from one version). At most K + 1 batches are in flight (batch
s + 1 + K is launched only after batch s was trained), so K + 1 copies suffice. Cost:
(K + 1) x the model's memory (the demo's 0.66M parameters: ~2.6 MB each; a 0.5B model
in fp32 on a GPU: 2 GB each) and one copy of the weights per step (microseconds here).
A lock around the live model would not do: a multi-turn batch's later turns would be
sampled by newer weights than its first. Sync mode samples from the live model.

**One model, one thing at a time; one environment limit.** The batches in flight and
the update share two `PrioritySlots`: the model's (one generate call or update at a
time) and the environment's (`env_workers` turns judged at once), both granted to the
oldest batch first, so the batch the trainer needs next is not slowed by younger ones.
The overlap async mode buys is between the model and the environment, not between two
model computations: on one device those only compete (the first version let them run
at once; the serialised one was no slower, within this 2-core machine's noise). Async
mode adds no environment capacity either.

**Resume.** In-flight batches are not checkpointed: a resumed async run starts its
producer at the checkpoint's step with the checkpoint's weights (batches first ..
first + K all at version `first`, staleness 0 .. K), so it is not step-for-step
identical to the uninterrupted run, though it sees the same tasks (a function of the
seed and the step).

**Policy wait.** `ModelClock` keeps the union of the intervals in which the model works
(any generate call, any update); the rest of the loop's wall time the policy waited,
in practice on sandboxes and the judge (plus the trainer's logging and checkpoints,
milliseconds). Each step record carries `policy_wait_s` and its share.
"""

from __future__ import annotations

import asyncio
import copy
import heapq
import inspect
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AbstractAsyncContextManager, contextmanager, nullcontext
from dataclasses import dataclass, replace
from typing import Any, Protocol, TypeVar

from trialbox import telemetry
from trialbox.errors import InfraError
from trialbox.rollout.agent import RolloutBatch
from trialbox.rollout.policy import Generation, Policy, Tokenizer

Launch = Callable[[int, int], Awaitable[RolloutBatch]]
"""(step, version) -> that step's rollout, sampled by weights of that version. Called on
the event loop between updates: whatever it reads of the weights synchronously is a
consistent snapshot."""

T = TypeVar("T")


class StalenessError(InfraError):
    """A batch older than the staleness bound reached the trainer (a bug in the producer:
    the rule is kept by waiting, so this never happens in a correct run)."""


def launch_version(step: int, max_staleness: int, first: int = 0) -> int:
    """The version of the weights that samples batch `step` in async mode: the oldest
    allowed, max(first, step - K), because the batch is launched as soon as it is
    allowed (the earlier it starts, the more it overlaps).

    >>> [launch_version(s, 1) for s in range(5)]
    [0, 0, 1, 2, 3]
    >>> [launch_version(s, 2, first=3) for s in range(3, 8)]
    [3, 3, 3, 4, 5]
    """
    return max(first, step - max_staleness)


def may_train(step: int, version: int, max_staleness: int) -> bool:
    """Whether batch `step`, sampled by weights of `version`, may be trained on by the
    weights of version `step` (0 <= step - version <= K)."""
    return 0 <= step - version <= max_staleness


@dataclass(frozen=True)
class StepBatch:
    """A step's rollout, stamped with the version of the weights that sampled it."""

    step: int
    version: int
    batch: RolloutBatch

    @property
    def staleness(self) -> int:
        """Updates between the sampling weights and the trained ones (0: on-policy)."""
        return self.step - self.version


def stamped(step: int, version: int, batch: RolloutBatch) -> StepBatch:
    """Every trajectory records the sampling weights' version."""
    trajs = [replace(t, policy_version=version) for t in batch.trajectories]
    return StepBatch(step, version, RolloutBatch(trajs, batch.stats))


class Batches(Protocol):
    """Where the trainer's batches come from: `start()`, then per step `await get(step)`,
    update, `publish(step + 1)`; `aclose()` at the end (cancels what is in flight)."""

    def start(self) -> None: ...

    async def get(self, step: int) -> StepBatch: ...

    def publish(self, version: int) -> None: ...

    async def aclose(self) -> None: ...


class SyncBatches:
    """mode = "sync": the step's batch is rolled out when asked for, by the live
    weights (version = step)."""

    def __init__(self, launch: Launch):
        self.launch = launch

    def start(self) -> None:
        pass

    async def get(self, step: int) -> StepBatch:
        return stamped(step, step, await self.launch(step, step))

    def publish(self, version: int) -> None:
        pass

    async def aclose(self) -> None:
        pass


class AsyncBatches:
    """mode = "async": batches are launched ahead (see the module docstring) and run
    concurrently with each other and with the update.

    Each launched batch is its own trace (`train.rollout`, a root span): it starts
    under one iteration and is trained in a later one."""

    def __init__(self, launch: Launch, *, first: int, steps: int, max_staleness: int):
        self.launch, self.first, self.steps, self.k = launch, first, steps, max_staleness
        self.in_flight: dict[int, tuple[int, asyncio.Task[RolloutBatch],
                                        Awaitable[RolloutBatch]]] = {}
        """step -> (version, its task, the launched rollout the task awaits)."""
        self.launched: list[tuple[int, int]] = []
        """(step, version) in launch order."""

    def start(self) -> None:
        for step in range(self.first, min(self.first + self.k + 1, self.steps)):
            self._launch(step, self.first)

    def publish(self, version: int) -> None:
        step = version + self.k
        if step < self.steps and step not in self.in_flight \
                and step > self.first + self.k:
            self._launch(step, version)

    def _launch(self, step: int, version: int) -> None:
        assert version == launch_version(step, self.k, self.first), (step, version)
        work = self.launch(step, version)  # reads the weights now

        async def traced() -> RolloutBatch:
            with telemetry.span("train.rollout", {"train.step": step + 1,
                                                  "policy.version": version}, root=True):
                return await work

        self.in_flight[step] = (version, asyncio.ensure_future(traced()), work)
        self.launched.append((step, version))

    async def get(self, step: int) -> StepBatch:
        try:
            version, task, _ = self.in_flight[step]
        except KeyError:
            raise StalenessError(f"batch {step} was never launched (launched: "
                                 f"{sorted(self.in_flight)})") from None
        batch = await task
        del self.in_flight[step]
        if not may_train(step, version, self.k):
            raise StalenessError(f"batch {step} was sampled by version {version}: "
                                 f"{step - version} updates stale, the bound is {self.k}")
        return stamped(step, version, batch)

    async def aclose(self) -> None:
        left = list(self.in_flight.values())
        self.in_flight.clear()
        for _, task, _ in left:
            task.cancel()
        await asyncio.gather(*(task for _, task, _ in left), return_exceptions=True)
        for _, _, work in left:  # a batch cancelled before it started never ran
            if inspect.iscoroutine(work):
                work.close()


# --------------------------------------------------------------------------- shared slots

class PrioritySlots:
    """`n` slots shared by every batch in flight (the environment's `env_workers`, or
    the model's one): a freed slot goes to the waiter of the *oldest* batch (the lowest
    step), FIFO within a batch. Why: with a plain shared semaphore the batch the trainer
    needs next queues its second turns behind the next batch's first turns, both finish
    together and the pipeline degenerates into batches twice as large; with priorities
    the current batch finishes nearly as fast as alone and younger batches fill the
    idle slots.

        slots = PrioritySlots(4)
        async with slots.lane(step):   # what rollout(env_slots=...) wraps each turn in
            ...
    """

    def __init__(self, n: int):
        self.free = n
        self.waiting: list[tuple[int, int, asyncio.Future[None]]] = []  # a heap
        self._seq = 0

    def lane(self, priority: int) -> _Lane:
        """An async context manager holding one slot, granted by `priority` (lower
        first)."""
        return _Lane(self, priority)

    async def acquire(self, priority: int) -> None:
        if self.free > 0 and not self.waiting:
            self.free -= 1
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._seq += 1
        heapq.heappush(self.waiting, (priority, self._seq, fut))
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():  # granted, then cancelled: pass it on
                self.release()
            raise

    def release(self) -> None:
        while self.waiting:  # hand the slot straight to the most urgent live waiter
            _, _, fut = heapq.heappop(self.waiting)
            if not fut.done():
                fut.set_result(None)
                return
        self.free += 1


class _Lane:
    def __init__(self, slots: PrioritySlots, priority: int):
        self.slots, self.priority = slots, priority

    async def __aenter__(self) -> None:
        await self.slots.acquire(self.priority)

    async def __aexit__(self, *exc: object) -> None:
        self.slots.release()


# --------------------------------------------------------------------------- weights

class WeightCopies:
    """Private copies of the policy model for the producer's batches (async mode): one
    per batch in flight, loaded from the live model at launch (module docstring)."""

    def __init__(self, model: Any, n: int):
        # Copied before any update runs, so the copies start consistent; frozen (the
        # producer only samples).
        self.free = [copy.deepcopy(model).train(False).requires_grad_(False)
                     for _ in range(n)]

    def run_on_snapshot(self, live: Any, work: Callable[[Any], Awaitable[T]]) -> \
            Awaitable[T]:
        """Load a free copy with `live`'s weights now, then `work(copy)`; the copy is
        free again when the work ends."""
        if not self.free:
            raise RuntimeError("no free weight copy: more batches in flight than "
                               "max_staleness + 1")
        snapshot = self.free.pop()
        snapshot.load_state_dict(live.state_dict())

        async def run() -> T:
            try:
                return await work(snapshot)
            finally:
                self.free.append(snapshot)

        return run()


# --------------------------------------------------------------------------- policy wait

class ModelClock:
    """The wall time during which the model works (generating or being updated), as the
    union of the busy intervals, which may overlap in async mode. Used from the event
    loop thread only (the work itself may run in worker threads)."""

    def __init__(self) -> None:
        self.inside = 0
        self.since = 0.0
        self.total = 0.0
        self._lap = (time.monotonic(), 0.0)

    @contextmanager
    def busy(self) -> Iterator[None]:
        if self.inside == 0:
            self.since = time.monotonic()
        self.inside += 1
        try:
            yield
        finally:
            self.inside -= 1
            if self.inside == 0:
                self.total += time.monotonic() - self.since

    def busy_s(self) -> float:
        """Busy seconds so far, an interval still open included."""
        open_s = time.monotonic() - self.since if self.inside else 0.0
        return self.total + open_s

    def lap(self) -> tuple[float, float]:
        """(wall seconds, seconds the model was idle) since the previous lap (or since
        the clock was made)."""
        now, busy = time.monotonic(), self.busy_s()
        (t0, b0), self._lap = self._lap, (now, busy)
        wall = now - t0
        return wall, max(0.0, wall - (busy - b0))


class TimedPolicy:
    """A policy whose generate calls count as the model's busy time, each inside `lane`
    (the model's turn, shared with the updates and the other batches' generation)."""

    def __init__(self, inner: Policy, clock: ModelClock,
                 lane: AbstractAsyncContextManager[Any] | None = None):
        self.inner, self.clock, self.lane = inner, clock, lane
        self.tokenizer: Tokenizer = inner.tokenizer

    async def generate(self, prompts: list[list[int]], *, max_new_tokens: int,
                       temperature: float, stop: list[str] | None) -> list[Generation]:
        async with self.lane or nullcontext():
            with self.clock.busy():
                return await self.inner.generate(prompts, max_new_tokens=max_new_tokens,
                                                 temperature=temperature, stop=stop)
