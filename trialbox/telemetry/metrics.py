"""Prometheus metrics and the recent-activity series the dashboard draws.

One `Metrics` object owns a private `CollectorRegistry` (never prometheus_client's
global one), so a test can swap in a fresh object with `use_metrics()` and read exact
counts. Lower layers never touch the instruments directly: they call the small
`record_*` helpers in `instrument.py`, which read `current()` on every call.

    trialbox_tasks{state}                    gauge   tasks by lifecycle state
    trialbox_queue_depth{queue}              gauge   watched queues (`watch_queue`)
    trialbox_pool_cells{state}               gauge   ready / in_use / warming cells
    trialbox_sandbox_starts_total{result}    counter cells started (ok / failed)
    trialbox_sandbox_start_seconds           histogram  time to start a cell
    trialbox_sandbox_executions_total{status} counter runs by ExecStatus value
    trialbox_sandbox_execution_seconds       histogram  wall time of a run
    trialbox_judge_outcomes_total{outcome,kind} counter graded attempts
    trialbox_judge_seconds                   histogram  time to grade one attempt
    trialbox_anticheat_flags_total{detector} counter detectors that fired
    trialbox_rewards                         histogram  rewards given (excluded: none)
    trialbox_rewards_excluded_total          counter  rewards that were None
    trialbox_infra_failures_total{stage}     counter  sandbox / judge infra failures
    trialbox_infra_failure_ratio             gauge    infra share of the last 5 min
    trialbox_train_steps_total{run}          counter  training steps
    trialbox_train_reward_mean{run}          gauge    mean reward of the last step
    trialbox_node_up{node}                   gauge    1 while a node serves, 0 once lost
                                                      (`set_node_up`: trialbox.cluster)
    trialbox_sessions{state}                 gauge    open / waiting sessions of the
                                                      watched pools (capacity.py)
    trialbox_session_capacity                gauge    sessions those pools allow open

alerts.yml holds Prometheus alert rules over these; alerts.py evaluates the same
conditions in-process for the dashboard.

Why the extra in-memory series (`Recent`): the dashboard needs throughput, latency
percentiles and reward distributions *over time*, which a scrape of counters cannot
give without a Prometheus server; a bounded deque per series costs ~0.2 µs an append.
"""

from __future__ import annotations

import threading
import time
import weakref
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

START_BUCKETS = (0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0,
                 2.5, 10.0)
EXEC_BUCKETS = (0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                60.0)
JUDGE_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
REWARD_BUCKETS = tuple(round(0.1 * i, 1) for i in range(11))
WINDOW_S = 300.0
"""How far back the infra-failure ratio and the dashboard's series look."""


class PoolLike(Protocol):
    """What the pool gauge reads from a sandbox pool (no import of the sandbox layer)."""

    closed: bool

    @property
    def ready_count(self) -> int: ...


_pools: weakref.WeakSet[Any] = weakref.WeakSet()
_queues: dict[str, Callable[[], int]] = {}
_task_sources: dict[str, Callable[[], Mapping[str, int]]] = {}


def watch_pool(pool: PoolLike) -> None:
    """Report this pool's cells in `trialbox_pool_cells` (weakly held; idempotent)."""
    _pools.add(pool)


def watch_queue(name: str, depth: Callable[[], int]) -> None:
    """Report `depth()` as `trialbox_queue_depth{queue=name}` at each scrape."""
    _queues[name] = depth


def watch_tasks(name: str, counts: Callable[[], Mapping[str, int]]) -> None:
    """Report `counts()` ({state: n}) in `trialbox_tasks` at each scrape — for a
    scheduler that already keeps its counts; added to those from `task_moved`."""
    _task_sources[name] = counts


def unwatch(name: str) -> None:
    """Stop reporting a queue or task source registered under `name`."""
    _queues.pop(name, None)
    _task_sources.pop(name, None)


def pool_sessions() -> dict[str, int]:
    """Sessions of every live watched pool against its capacity: open, waiting (for a
    place past capacity), capacity."""
    out = {"open": 0, "waiting": 0, "capacity": 0}
    for pool in list(_pools):
        admission = getattr(pool, "admission", None)
        if getattr(pool, "closed", False) or admission is None:
            continue
        out["open"] += int(admission.open)
        out["waiting"] += int(admission.waiting)
        out["capacity"] += int(admission.capacity.sessions)
    return out


def pool_cells() -> dict[str, int]:
    """Cells of every live watched pool: ready, in_use, warming."""
    out = {"ready": 0, "in_use": 0, "warming": 0}
    for pool in list(_pools):
        if getattr(pool, "closed", False):
            continue
        out["ready"] += int(pool.ready_count)
        # The pool keeps these private; reading them here (rather than adding public
        # properties to pool.py) keeps the sandbox layer's edit to one decorator line.
        out["in_use"] += int(getattr(pool, "_in_use", 0))
        out["warming"] += int(getattr(pool, "_warming", 0))
    return out


@dataclass
class Recent:
    """Bounded in-memory series for the dashboard (thread-safe; the server and a
    training loop may record from different threads)."""

    execs: deque[tuple[float, float, str]] = field(default_factory=lambda: deque(maxlen=20000))
    """(time, wall_ms, status) of recent runs."""
    starts: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=5000))
    """(time, start_ms) of recent cell starts."""
    grades: deque[tuple[float, str]] = field(default_factory=lambda: deque(maxlen=20000))
    """(time, outcome) of recent graded attempts."""
    rewards: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=20000))
    """(time, reward) of recent rewards (excluded ones are not rewards)."""
    events: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=200))
    """Recent failures and anti-cheat flags, newest last (see `note`)."""
    runs: dict[str, deque[dict[str, Any]]] = field(default_factory=dict)
    """Per training run: its steps, {step, t, reward_mean, …scalars}."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def note(self, kind: str, summary: str, **detail: Any) -> None:
        """Remember a failure or a flag: kind is `infra`, `failure`, `cheat` or `flag`."""
        with self.lock:
            self.events.append({"t": time.time(), "kind": kind, "summary": summary[:500],
                                **detail})

    def snapshot(self) -> dict[str, list[Any]]:
        with self.lock:
            return {"execs": list(self.execs), "starts": list(self.starts),
                    "grades": list(self.grades), "rewards": list(self.rewards),
                    "events": list(self.events)}

    def run(self, run_id: str) -> list[dict[str, Any]]:
        with self.lock:
            return list(self.runs.get(run_id, ()))

    def run_ids(self) -> list[str]:
        with self.lock:
            return list(self.runs)


class Metrics:
    """Every instrument, in a registry of its own, plus the `Recent` series."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.recent = Recent()
        self.sandbox_starts = Counter("trialbox_sandbox_starts", "Sandbox cells started",
                                      ["result"], registry=r)
        self.start_seconds = Histogram("trialbox_sandbox_start_seconds",
                                       "Time to start a sandbox cell", buckets=START_BUCKETS,
                                       registry=r)
        self.runs = RunCounts(self.recent.lock)
        """Runs by status and their wall-time histogram (the hot path: plain ints)."""
        self.judge_outcomes = Counter("trialbox_judge_outcomes", "Graded attempts by outcome",
                                      ["outcome", "kind"], registry=r)
        self.judge_seconds = Histogram("trialbox_judge_seconds", "Time to grade one attempt",
                                       buckets=JUDGE_BUCKETS, registry=r)
        self.flags = Counter("trialbox_anticheat_flags", "Anti-cheat detectors that fired",
                             ["detector"], registry=r)
        self.rewards = Histogram("trialbox_rewards", "Rewards given", buckets=REWARD_BUCKETS,
                                 registry=r)
        self.rewards_excluded = Counter("trialbox_rewards_excluded",
                                        "Rewards that were None (excluded from training)",
                                        registry=r)
        self.infra = Counter("trialbox_infra_failures", "Infrastructure failures",
                             ["stage"], registry=r)
        self.train_steps = Counter("trialbox_train_steps", "Training steps", ["run"],
                                   registry=r)
        self.train_reward = Gauge("trialbox_train_reward_mean",
                                  "Mean reward of the run's last training step", ["run"],
                                  registry=r)
        self.node_up = Gauge("trialbox_node_up",
                             "1 while a node serves work, 0 once it is presumed lost",
                             ["node"], registry=r)
        self.tasks: dict[str, int] = {}
        """Task counts by state, maintained by `task_moved` / `set_tasks`."""
        r.register(_LiveCollector(self))
        # Label children looked up once: `.labels()` costs ~1 µs, a dict hit ~50 ns.
        self._children: dict[tuple[int, str], Any] = {}

    def child(self, metric: Counter | Gauge | Histogram, *labels: str) -> Any:
        key = (id(metric), "\x00".join(labels))
        c = self._children.get(key)
        if c is None:
            c = self._children[key] = metric.labels(*labels)
        return c

    def exposition(self) -> bytes:
        """The Prometheus text format of every metric."""
        return generate_latest(self.registry)

    def samples(self) -> dict[str, list[tuple[dict[str, str], float]]]:
        """{sample name: [(labels, value)]} — what a scrape would read, as data."""
        out: dict[str, list[tuple[dict[str, str], float]]] = {}
        for metric in self.registry.collect():
            for s in metric.samples:
                out.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
        return out

    def set_node_up(self, node: str, up: bool) -> None:
        """`trialbox_node_up{node}`: 1 while `node` serves work, 0 once it is presumed
        lost (what TrialboxNodeDown in alerts.yml watches)."""
        self.node_up.labels(node).set(1.0 if up else 0.0)

    def forget_node(self, node: str) -> None:
        """A node that left cleanly (drained): no series, so no alert."""
        try:
            self.node_up.remove(node)
        except KeyError:
            pass

    def value(self, name: str, **labels: str) -> float:
        """One sample's value (0.0 when absent), e.g.
        `value("trialbox_sandbox_executions_total", status="ok")`."""
        v = self.registry.get_sample_value(name, labels)
        return 0.0 if v is None else float(v)


class RunCounts:
    """`trialbox_sandbox_executions_total{status}` and
    `trialbox_sandbox_execution_seconds`, kept as plain ints under one lock.

    Why not prometheus_client's Counter and Histogram: every sandbox run updates them,
    and there each `inc()`/`observe()` takes its own lock (~1 µs apiece here); one lock
    and a bisect cost a third of that (`trialbox bench telemetry`)."""

    def __init__(self, lock: threading.Lock, bounds: tuple[float, ...] = EXEC_BUCKETS):
        self.lock = lock
        self.bounds = bounds
        self.by_status: dict[str, int] = {}
        self.buckets = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.sum = 0.0

    def add_locked(self, status: str, seconds: float) -> None:
        """Count one run; the caller holds `lock`."""
        self.by_status[status] = self.by_status.get(status, 0) + 1
        self.buckets[bisect_left(self.bounds, seconds)] += 1
        self.sum += seconds

    def collect(self) -> Iterator[Metric]:
        with self.lock:
            by_status, buckets, total = dict(self.by_status), list(self.buckets), self.sum
        runs = CounterMetricFamily("trialbox_sandbox_executions", "Sandbox runs by status",
                                   labels=["status"])
        for status, n in sorted(by_status.items()):
            runs.add_metric([status], n)
        yield runs
        cumulative, acc = [], 0
        for bound, n in zip((*map(str, self.bounds), "+Inf"), buckets, strict=True):
            acc += n
            cumulative.append((bound, acc))
        yield HistogramMetricFamily("trialbox_sandbox_execution_seconds",
                                    "Wall time of one sandbox run", buckets=cumulative,
                                    sum_value=total)


class _LiveCollector:
    """Gauges read at scrape time: pools, queues, tasks, the recent infra ratio."""

    def __init__(self, metrics: Metrics):
        self.metrics = metrics

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        yield from self.metrics.runs.collect()
        cells = GaugeMetricFamily("trialbox_pool_cells", "Sandbox cells by state",
                                  labels=["state"])
        for state, n in pool_cells().items():
            cells.add_metric([state], n)
        yield cells
        sessions = pool_sessions()
        open_waiting = GaugeMetricFamily(
            "trialbox_sessions", "Open sandbox sessions, and openers waiting for a place "
            "past the node's capacity", labels=["state"])
        open_waiting.add_metric(["open"], sessions["open"])
        open_waiting.add_metric(["waiting"], sessions["waiting"])
        yield open_waiting
        yield GaugeMetricFamily("trialbox_session_capacity",
                                "Sandbox sessions the watched pools allow open at once",
                                value=sessions["capacity"])
        queues = GaugeMetricFamily("trialbox_queue_depth", "Items waiting in a queue",
                                   labels=["queue"])
        for name, depth in list(_queues.items()):
            queues.add_metric([name], _safe(depth, 0))
        yield queues
        tasks = GaugeMetricFamily("trialbox_tasks", "Tasks by lifecycle state",
                                  labels=["state"])
        for state, n in task_counts(self.metrics).items():
            tasks.add_metric([state], n)
        yield tasks
        ratio = GaugeMetricFamily("trialbox_infra_failure_ratio",
                                  f"Share of runs and gradings of the last {WINDOW_S:g} s "
                                  "that failed for infrastructure reasons")
        ratio.add_metric([], infra_ratio(self.metrics.recent) or 0.0)
        yield ratio


def _safe(fn: Callable[[], Any], default: Any) -> Any:
    """A watched source that raises must not break the scrape."""
    try:
        return fn()
    except Exception:
        return default


def task_counts(metrics: Metrics) -> dict[str, int]:
    counts = dict(metrics.tasks)
    for source in list(_task_sources.values()):
        for state, n in _safe(source, {}).items():
            counts[str(state)] = counts.get(str(state), 0) + int(n)
    return counts


def infra_ratio(recent: Recent, window_s: float = WINDOW_S) -> float | None:
    """Infra failures / (runs + gradings) over the last `window_s`; None when idle."""
    since = time.time() - window_s
    with recent.lock:
        execs = [s for t, _ms, s in recent.execs if t >= since]
        grades = [o for t, o in recent.grades if t >= since]
    total = len(execs) + len(grades)
    if not total:
        return None
    bad = sum(s == "infra" for s in execs) + sum(o == "infra" for o in grades)
    return bad / total


_active = Metrics()


def current() -> Metrics:
    """The metrics every helper records into (one per process unless swapped)."""
    return _active


@contextmanager
def use_metrics(metrics: Metrics | None = None) -> Iterator[Metrics]:
    """Record into `metrics` (a fresh `Metrics()` by default) inside the block; for
    tests that need exact counts."""
    global _active
    previous, _active = _active, metrics or Metrics()
    try:
        yield _active
    finally:
        _active = previous
