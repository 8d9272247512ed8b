"""The shipped alert rules (trialbox/telemetry/alerts.yml): checked by Prometheus's own
rule tester (`promtool test rules`, Debian's `prometheus` package) on synthetic series
for each alert — quiet while healthy, pending during its `for:`, firing after — and the
same conditions evaluated in-process for the dashboard."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from typing import Any

import pytest
import yaml

from trialbox.service import dashboard_data
from trialbox.telemetry import use_metrics
from trialbox.telemetry.alerts import RULES_FILE, Evaluator, conditions, load_rules
from trialbox.telemetry.metrics import unwatch, watch_pool, watch_queue

RULES = {r.name: r for r in load_rules()}


def _promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool not found: run scripts/setup-system.sh (apt-get install "
                    "prometheus) — the alert rules are checked with Prometheus's own tester")
    return path


def _expect(name: str, **labels: str) -> dict[str, Any]:
    """An alert as promtool reports it: the rule's labels plus the series', and its
    annotations rendered ({{ $labels.x }} only: alerts.yml uses nothing else)."""
    rule = yaml.safe_load(open(RULES_FILE))["groups"][0]["rules"]
    (r,) = [x for x in rule if x.get("alert") == name]
    ann = {k: re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels.get(m.group(1), ""), v)
           for k, v in r["annotations"].items()}
    return {"exp_labels": {**r["labels"], **labels}, "exp_annotations": ann}


def _case(name: str, series: list[tuple[str, str]],
          checks: list[tuple[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    return {"interval": "1m",
            "input_series": [{"series": s, "values": v} for s, v in series],
            "alert_rule_test": [{"eval_time": t, "alertname": name, "exp_alerts": exp}
                                for t, exp in checks]}


HEALTHY_STARTS = [(f'trialbox_sandbox_start_seconds_bucket{{le="{le}",instance="n1"}}',
                   "0+60x30") for le in ("0.005", "0.05", "0.1", "+Inf")]
SLOW_STARTS = [(f'trialbox_sandbox_start_seconds_bucket{{le="{le}",instance="n1"}}',
                "0+60x10 600+0x20") for le in ("0.005", "0.05")] + [
    (f'trialbox_sandbox_start_seconds_bucket{{le="{le}",instance="n1"}}', "0+60x30")
    for le in ("0.1", "+Inf")]
# rewards: 90 min at a mean of 0.8, then 30 min at 0.2 (collapse) or the other way (jump)
COLLAPSE = [("trialbox_rewards_sum", "0+8x90 722+2x30"), ("trialbox_rewards_count",
                                                          "0+10x120")]
JUMP = [("trialbox_rewards_sum", "0+2x90 189+9x30"), ("trialbox_rewards_count", "0+10x120")]

CASES = [
    _case("TrialboxNodeDown",
          [('trialbox_node_up{node="n1"}', "1 1 0 0 0 0 1"),
           ('trialbox_node_up{node="n2"}', "1x6")],
          [("1m", []), ("2m", []),  # down at 2m: pending for its minute
           ("4m", [_expect("TrialboxNodeDown", node="n1")]),
           ("6m", [])]),  # back
    _case("TrialboxInfraFailureRate",
          [('trialbox_infra_failure_ratio{instance="n1"}', "0.01x5 0.2x15")],
          [("5m", []), ("9m", []),
           ("12m", [_expect("TrialboxInfraFailureRate", instance="n1")])]),
    _case("TrialboxSandboxStartSlow", HEALTHY_STARTS, [("20m", [])]),
    _case("TrialboxSandboxStartSlow", SLOW_STARTS,
          [("9m", []), ("13m", []),
           ("20m", [_expect("TrialboxSandboxStartSlow", instance="n1")])]),
    _case("TrialboxQueueBacklog",
          [('trialbox_queue_depth{queue="train",instance="n1"}', "0+200x20"),
           ('trialbox_queue_depth{queue="eval",instance="n1"}', "5x20")],
          [("10m", []),
           ("18m", [_expect("TrialboxQueueBacklog", queue="train", instance="n1")])]),
    _case("TrialboxSessionsWaitingForCapacity",
          [('trialbox_sessions{state="waiting",instance="n1"}', "0 0 5x10"),
           ('trialbox_sessions{state="open",instance="n1"}', "9000x12")],
          [("4m", []),
           ("9m", [_expect("TrialboxSessionsWaitingForCapacity", instance="n1")])]),
    _case("TrialboxRewardCollapse", COLLAPSE,
          [("85m", []), ("118m", [_expect("TrialboxRewardCollapse")])]),
    _case("TrialboxRewardJump", COLLAPSE, [("118m", [])]),
    _case("TrialboxRewardJump", JUMP, [("85m", []), ("118m", [_expect("TrialboxRewardJump")])]),
    _case("TrialboxRewardCollapse", JUMP, [("118m", [])]),
]


def _run_promtool(tmp_path, cases: list[dict[str, Any]]) -> subprocess.CompletedProcess[str]:
    test = tmp_path / "alerts_test.yml"
    test.write_text(yaml.safe_dump({"rule_files": [RULES_FILE], "evaluation_interval": "1m",
                                    "tests": cases}, sort_keys=False))
    return subprocess.run([_promtool(), "test", "rules", str(test)], capture_output=True,
                          text=True, timeout=120)


def test_rules_file_is_valid_prometheus():
    out = subprocess.run([_promtool(), "check", "rules", RULES_FILE], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"{len(RULES)} rules found" in out.stdout


def test_every_alert_fires_when_it_should_and_only_then(tmp_path):
    assert {c["alert_rule_test"][0]["alertname"] for c in CASES} == set(RULES)
    out = _run_promtool(tmp_path, CASES)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_rule_tester_catches_a_wrong_expectation(tmp_path):
    """The harness can fail: a node down for 0 s is not an alert yet (for: 1m)."""
    wrong = _case("TrialboxNodeDown", [('trialbox_node_up{node="n1"}', "1 1 0 0")],
                  [("2m", [_expect("TrialboxNodeDown", node="n1")])])
    out = _run_promtool(tmp_path, [wrong])
    assert out.returncode != 0 and "FAILED" in out.stdout + out.stderr


class _Pool:
    """What the metrics read from a pool: open and waiting sessions, its capacity."""

    closed = False
    ready_count = 0

    def __init__(self, waiting: int):
        cap = type("Cap", (), {"sessions": 10})()
        self.admission = type("Adm", (), {"open": 10, "waiting": waiting, "capacity": cap})()


def test_in_process_evaluation_pending_then_firing_then_gone():
    with use_metrics() as m:
        ev = Evaluator()
        now = time.time()
        m.set_node_up("n1", True)
        assert ev.evaluate(m, now) == []
        m.set_node_up("n1", False)
        (a,) = ev.evaluate(m, now)
        assert (a.name, a.state, a.labels) == ("TrialboxNodeDown", "pending", {"node": "n1"})
        (a,) = ev.evaluate(m, now + RULES["TrialboxNodeDown"].for_s)
        assert a.state == "firing" and a.severity == "critical"
        m.set_node_up("n1", True)
        assert ev.evaluate(m, now + 120) == []
        m.set_node_up("n1", False)
        m.forget_node("n1")  # drained: no series, no alert
        assert ev.evaluate(m, now + 180) == []
        assert b'trialbox_node_up' in m.exposition()


def test_in_process_conditions_match_the_rules():
    with use_metrics() as m:
        now = time.time()
        r = m.recent
        with r.lock:  # 10% infra, starts at 80 ms, rewards 0.9 -> 0.1
            r.execs.extend((now - i, 5.0, "infra" if i % 10 == 0 else "ok")
                           for i in range(100))
            r.starts.extend((now - i, 80.0) for i in range(50))
            r.rewards.extend((now - 1800 - i, 0.9) for i in range(100))
            r.rewards.extend((now - i, 0.1) for i in range(100))
        watch_queue("test-backlog", lambda: 5000)
        pool = _Pool(waiting=3)
        watch_pool(pool)
        try:
            fired = {rule: conditions(RULES[rule], m, now) for rule in RULES}
        finally:
            unwatch("test-backlog")
            pool.closed = True
        assert fired["TrialboxNodeDown"] == []
        assert fired["TrialboxInfraFailureRate"] == [({}, pytest.approx(0.1))]
        assert fired["TrialboxSandboxStartSlow"] == [({}, pytest.approx(0.08))]
        assert fired["TrialboxQueueBacklog"] == [({"queue": "test-backlog"}, 5000.0)]
        assert fired["TrialboxSessionsWaitingForCapacity"] == [({}, 3.0)]
        assert fired["TrialboxRewardCollapse"] == [({}, pytest.approx(0.8))]
        assert fired["TrialboxRewardJump"] == []
        text = m.exposition().decode()
        assert 'trialbox_sessions{state="waiting"}' in text
        assert "trialbox_session_capacity" in text


def test_healthy_process_raises_nothing():
    with use_metrics() as m:
        now = time.time()
        with m.recent.lock:
            m.recent.execs.extend((now - i, 5.0, "ok") for i in range(100))
            m.recent.starts.extend((now - i, 2.0) for i in range(50))
            m.recent.rewards.extend((now - i * 30, 0.5) for i in range(150))
        assert Evaluator().evaluate(m, now) == []


def test_dashboard_shows_what_fires():
    with use_metrics() as m:
        m.set_node_up("worker-3", False)
        body = dashboard_data.summary(m)
        names = [(a["name"], a["labels"]) for a in body["alerts"]]
        assert ("TrialboxNodeDown", {"node": "worker-3"}) in names
