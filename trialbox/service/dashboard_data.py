"""What the dashboard's JSON endpoints return, computed from `trialbox.telemetry` (and,
when the dashboard runs inside `trialbox serve`, the service's own state). Pure reads:
nothing here records or changes anything.

The numbers are the same ones `/metrics` exposes (read through the registry's public
`collect()`), plus series over time from the telemetry's bounded `Recent` store.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from typing import Any

from trialbox.telemetry import Metrics, alerts, pool_cells
from trialbox.telemetry.metrics import infra_ratio, task_counts
from trialbox.telemetry.tracing import recent_spans

WINDOW_S = 60.0
"""Throughput, latency percentiles and the reward histogram cover the last minute."""
SERIES_S = 300.0
"""The charts cover the last five minutes..."""
BIN_S = 5.0
"""...in bins of five seconds."""


def percentile(sorted_values: list[float], q: float) -> float | None:
    """The q-quantile (0..1) by nearest rank; None for no values.

    >>> percentile([1.0, 2.0, 3.0, 4.0], 0.5)
    2.0
    """
    if not sorted_values:
        return None
    k = max(0, math.ceil(q * len(sorted_values)) - 1)
    return sorted_values[min(k, len(sorted_values) - 1)]


def _by_label(samples: dict[str, list[tuple[dict[str, str], float]]], name: str,
              label: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for labels, value in samples.get(name, ()):
        key = labels.get(label, "")
        out[key] = out.get(key, 0.0) + value
    return out


def _one(samples: dict[str, list[tuple[dict[str, str], float]]], name: str) -> float:
    return sum(v for _l, v in samples.get(name, ()))


def summary(metrics: Metrics, service: Any | None = None,
            now: float | None = None) -> dict[str, Any]:
    """The live view: tasks, queues, pool, totals, throughput, latency, rewards over
    time, recent failures and anti-cheat flags, training runs."""
    now = time.time() if now is None else now
    s = metrics.samples()
    recent = metrics.recent.snapshot()
    window = now - WINDOW_S
    execs = [(t, ms, st) for t, ms, st in recent["execs"] if t >= window]
    grades = [(t, o) for t, o in recent["grades"] if t >= window]
    starts = sorted(ms for t, ms in recent["starts"] if t >= window)
    exec_ms = sorted(ms for _t, ms, _s in execs)
    rewards_w = [r for t, r in recent["rewards"] if t >= window]
    runs = []
    for run_id in metrics.recent.run_ids():
        steps = metrics.recent.run(run_id)
        last = steps[-1] if steps else {}
        runs.append({"run_id": run_id, "steps": len(steps), "last_step": last.get("step"),
                     "reward_mean": last.get("reward_mean")})
    queues = {labels["queue"]: v for labels, v in s.get("trialbox_queue_depth", ())}
    return {
        "now": now,
        "tasks": task_counts(metrics),
        "queues": queues,
        "pool": pool_cells(),
        "totals": {
            "executions": _one(s, "trialbox_sandbox_executions_total"),
            "executions_by_status": _by_label(s, "trialbox_sandbox_executions_total",
                                              "status"),
            "gradings": _one(s, "trialbox_judge_outcomes_total"),
            "outcomes": _by_label(s, "trialbox_judge_outcomes_total", "outcome"),
            "starts": _by_label(s, "trialbox_sandbox_starts_total", "result"),
            "infra_failures": _one(s, "trialbox_infra_failures_total"),
            "rewards": _one(s, "trialbox_rewards_count"),
            "rewards_excluded": _one(s, "trialbox_rewards_excluded_total"),
            "flags": _by_label(s, "trialbox_anticheat_flags_total", "detector"),
        },
        "window_s": WINDOW_S,
        "throughput": {"executions_per_s": len(execs) / WINDOW_S,
                       "gradings_per_s": len(grades) / WINDOW_S},
        "latency_ms": {"exec_p50": percentile(exec_ms, 0.5),
                       "exec_p95": percentile(exec_ms, 0.95),
                       "exec_p99": percentile(exec_ms, 0.99),
                       "start_p50": percentile(starts, 0.5),
                       "start_p95": percentile(starts, 0.95)},
        "infra_failure_rate": infra_ratio(metrics.recent, WINDOW_S),
        "reward_histogram": reward_histogram(rewards_w),
        "series": series(recent, now),
        "events": list(reversed(recent["events"]))[:50],
        "runs": runs,
        "service": service_view(service),
        # alerts.yml's rules evaluated in-process (telemetry/alerts.py): pending/firing
        "alerts": [a.to_json() for a in alerts.evaluator().evaluate(metrics, now)],
    }


def reward_histogram(rewards: list[float], bins: int = 10) -> list[int]:
    """Counts of rewards in [0, 0.1), [0.1, 0.2) … [0.9, 1.0] (1.0 in the last bin)."""
    counts = [0] * bins
    for r in rewards:
        counts[min(bins - 1, max(0, int(r * bins)))] += 1
    return counts


def series(recent: dict[str, list[Any]], now: float) -> dict[str, list[float | None]]:
    """Per 5-second bin over the last five minutes: bin start time, runs/s, gradings/s,
    p50 run latency, reward mean and quartiles (None where a bin has no rewards)."""
    n = int(SERIES_S / BIN_S)
    start = math.floor(now / BIN_S) * BIN_S - (n - 1) * BIN_S
    execs: list[list[float]] = [[] for _ in range(n)]
    grades = [0] * n
    rewards: list[list[float]] = [[] for _ in range(n)]

    def slot(t: float) -> int | None:
        i = int((t - start) // BIN_S)
        return i if 0 <= i < n else None

    for t, ms, _st in recent["execs"]:
        if (i := slot(t)) is not None:
            execs[i].append(ms)
    for t, _o in recent["grades"]:
        if (i := slot(t)) is not None:
            grades[i] += 1
    for t, r in recent["rewards"]:
        if (i := slot(t)) is not None:
            rewards[i].append(r)
    out: dict[str, list[float | None]] = {"t": [start + i * BIN_S for i in range(n)],
                                          "exec_per_s": [], "grade_per_s": [],
                                          "exec_p50_ms": [], "reward_mean": [],
                                          "reward_p25": [], "reward_p75": []}
    for i in range(n):
        ms = sorted(execs[i])
        rs = sorted(rewards[i])
        out["exec_per_s"].append(len(ms) / BIN_S)
        out["grade_per_s"].append(grades[i] / BIN_S)
        out["exec_p50_ms"].append(percentile(ms, 0.5))
        out["reward_mean"].append(sum(rs) / len(rs) if rs else None)
        out["reward_p25"].append(percentile(rs, 0.25))
        out["reward_p75"].append(percentile(rs, 0.75))
    return out


def service_view(service: Any | None) -> dict[str, Any] | None:
    """The HTTP service's own counts when the dashboard runs inside `trialbox serve`
    (duck-typed on `ServiceState`, so a dashboard mounted elsewhere needs none)."""
    if service is None:
        return None
    counters = getattr(service, "counters", None)
    admission = getattr(service, "admission", None)
    out: dict[str, Any] = {"started": getattr(service, "started", None),
                           "ready": bool(getattr(service, "ready", False))}
    if admission is not None:
        out["running"] = getattr(admission, "running", None)
        out["queued"] = getattr(admission, "waiting", None)
    sessions = getattr(service, "sessions", None)
    if sessions is not None:
        out["sessions"] = len(sessions)
    if counters is not None:
        responses = Counter(getattr(counters, "responses", {}))
        out["requests"] = getattr(counters, "requests", 0)
        out["responses"] = {str(k): v for k, v in sorted(responses.items())}
        out["rejected"] = dict(getattr(counters, "rejected", {}))
    cluster_status = getattr(getattr(service, "provider", None), "cluster_status", None)
    if cluster_status is not None:  # --backend ray: the nodes' view
        out["cluster"] = cluster_status()
    submissions = getattr(service, "submissions", None)
    if submissions is not None and hasattr(submissions, "recent"):
        out["recent_submissions"] = [
            {k: row.get(k) for k in ("submission_id", "task_id", "outcome", "reward", "flags")
             if isinstance(row, dict)} for row in submissions.recent(20)]
    return out


def run_view(metrics: Metrics, run_id: str) -> dict[str, Any] | None:
    """One training run's steps (for its reward curve), or None if unknown."""
    steps = metrics.recent.run(run_id)
    if not steps and run_id not in metrics.recent.run_ids():
        return None
    keys = sorted({k for p in steps for k in p} - {"step", "t"})
    return {"run_id": run_id, "steps": [p["step"] for p in steps],
            "t": [p["t"] for p in steps],
            "scalars": {k: [p.get(k) for p in steps] for k in keys}}


def trace_view(trace_id: str, logs: list[dict[str, Any]]) -> dict[str, Any]:
    """The kept spans of one trace (a tree by parent id) and its log lines."""
    keeper = recent_spans()
    spans = keeper.trace(trace_id) if keeper is not None else []
    t0 = min((sp.start_time or 0 for sp in spans), default=0)
    return {
        "trace_id": trace_id,
        "kept": keeper is not None,
        "spans": [{
            "span_id": f"{sp.context.span_id:016x}" if sp.context else "",
            "parent_id": f"{sp.parent.span_id:016x}" if sp.parent else None,
            "name": sp.name,
            "start_ms": ((sp.start_time or 0) - t0) / 1e6,
            "duration_ms": ((sp.end_time or 0) - (sp.start_time or 0)) / 1e6,
            "status": sp.status.status_code.name,
            "attributes": {k: v if isinstance(v, (str, int, float, bool)) else str(v)
                           for k, v in (sp.attributes or {}).items()},
        } for sp in spans],
        "logs": logs,
    }
