"""Alerting: the Prometheus rules shipped in alerts.yml, and the same conditions
evaluated in-process for the dashboard.

Two ways to be told, from one rules file:

- **With a Prometheus server** (a cluster): load `RULES_FILE` as a rule file and route
  the alerts with Alertmanager. The rules are checked by Prometheus's own rule tester
  (`promtool test rules`, tests/telemetry/test_alerts.py).
- **Without one** (the embedded default): `Evaluator` computes each rule's condition
  from this process's metrics and recent series, with its `for:` hold (pending, then
  firing), and the dashboard shows what fires. Each rule's number comes from the rules
  file (its `threshold` label), so the two cannot drift apart on thresholds; the
  windows are the rules' own (5 min for rates, 15 min against the hour before it for
  rewards). In-process, a rule sees only this process: a node's own view.

Why in-process rather than querying a Prometheus alerts API: the dashboard must work on
one machine with nothing else running, and the metrics it would query live here anyway.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field
from typing import Any

from trialbox.telemetry.metrics import WINDOW_S, Metrics, infra_ratio, pool_sessions

RULES_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "alerts.yml")
REWARD_RECENT_S = 15 * 60.0
"""The reward rules compare the mean of the last 15 minutes ..."""
REWARD_BEFORE_S = 60 * 60.0
"""... with the mean of the hour before those 15 minutes."""


@dataclass(frozen=True)
class Rule:
    """One alerting rule of alerts.yml."""

    name: str
    expr: str
    for_s: float
    severity: str
    threshold: float
    summary: str
    description: str


@dataclass(frozen=True)
class Alert:
    """A rule whose condition holds: `pending` until it has held for the rule's
    `for:`, then `firing`."""

    name: str
    state: str
    severity: str
    value: float
    labels: dict[str, str] = field(default_factory=dict)
    since: float = 0.0
    description: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "state": self.state, "severity": self.severity,
                "value": self.value, "labels": self.labels, "since": self.since,
                "description": self.description}


def _duration(text: str) -> float:
    m = re.fullmatch(r"(\d+)([smh])", text.strip())
    if not m:
        raise ValueError(f"alerts.yml: unsupported duration {text!r} (use 30s, 5m, 1h)")
    return int(m.group(1)) * {"s": 1, "m": 60, "h": 3600}[m.group(2)]


def load_rules(path: str = RULES_FILE) -> list[Rule]:
    """The alerting rules of a Prometheus rule file."""
    import yaml
    with open(path) as f:
        doc = yaml.safe_load(f)
    rules = []
    for group in doc["groups"]:
        for r in group["rules"]:
            if "alert" not in r:
                continue
            labels = r.get("labels", {})
            rules.append(Rule(name=r["alert"], expr=r["expr"],
                              for_s=_duration(r.get("for", "0s")),
                              severity=labels.get("severity", "warning"),
                              threshold=float(labels["threshold"]),
                              summary=r.get("annotations", {}).get("summary", ""),
                              description=" ".join(
                                  r.get("annotations", {}).get("description", "").split())))
    return rules


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _p95(values: list[float]) -> float | None:
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, int(0.95 * len(v)))]


def conditions(rule: Rule, metrics: Metrics, now: float) -> list[tuple[dict[str, str], float]]:
    """(labels, value) of every series for which `rule`'s condition holds now."""
    t = rule.threshold
    samples = metrics.samples()
    if rule.name == "TrialboxNodeDown":
        return [(labels, v) for labels, v in samples.get("trialbox_node_up", ()) if v < t]
    if rule.name == "TrialboxInfraFailureRate":
        ratio = infra_ratio(metrics.recent, WINDOW_S)
        return [({}, ratio)] if ratio is not None and ratio > t else []
    if rule.name == "TrialboxSandboxStartSlow":
        with metrics.recent.lock:
            starts = [ms / 1e3 for at, ms in metrics.recent.starts if at >= now - WINDOW_S]
        p95 = _p95(starts)
        return [({}, p95)] if p95 is not None and p95 > t else []
    if rule.name == "TrialboxQueueBacklog":
        return [(labels, v) for labels, v in samples.get("trialbox_queue_depth", ()) if v > t]
    if rule.name == "TrialboxSessionsWaitingForCapacity":
        waiting = pool_sessions()["waiting"]
        return [({}, float(waiting))] if waiting > t else []
    if rule.name in ("TrialboxRewardCollapse", "TrialboxRewardJump"):
        with metrics.recent.lock:
            rewards = list(metrics.recent.rewards)
        split = now - REWARD_RECENT_S
        recent = _mean([r for at, r in rewards if split <= at <= now])
        before = _mean([r for at, r in rewards if split - REWARD_BEFORE_S <= at < split])
        if recent is None or before is None:
            return []
        change = before - recent if rule.name == "TrialboxRewardCollapse" else recent - before
        return [({}, change)] if change > t else []
    raise ValueError(f"alerts.yml rule {rule.name} has no in-process evaluation; add one "
                     "to trialbox/telemetry/alerts.py:conditions")


class Evaluator:
    """The rules' conditions over time, as Prometheus holds them: a condition is
    `pending` from when it first holds, `firing` once it has held for the rule's `for:`,
    and forgotten as soon as it stops holding."""

    def __init__(self, rules: list[Rule] | None = None):
        self.rules = load_rules() if rules is None else rules
        self._since: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}

    def evaluate(self, metrics: Metrics, now: float | None = None) -> list[Alert]:
        now = time.time() if now is None else now
        out: list[Alert] = []
        seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
        for rule in self.rules:
            for labels, value in conditions(rule, metrics, now):
                key = (rule.name, tuple(sorted(labels.items())))
                seen.add(key)
                since = self._since.setdefault(key, now)
                state = "firing" if now - since >= rule.for_s else "pending"
                out.append(Alert(rule.name, state, rule.severity, round(value, 6),
                                 dict(labels), since, rule.description))
        for key in list(self._since):
            if key not in seen:
                del self._since[key]
        return out


_evaluator: Evaluator | None = None


def evaluator() -> Evaluator:
    """This process's evaluator (its pending/firing state lives across calls)."""
    global _evaluator
    if _evaluator is None:
        _evaluator = Evaluator()
    return _evaluator
