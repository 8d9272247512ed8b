"""`/metrics` and the trace of a request over real HTTP: the dashboard's app served by
uvicorn on a free loopback port (metrics recorded by real sandbox runs in this
process), and the real `trialbox serve` process (runs and gradings through /v1)."""

from __future__ import annotations

import json

from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.service.conftest import wait_for
from tests.telemetry.serving import dashboard_app, serve
from trialbox import telemetry
from trialbox.sandbox import NamespaceSandbox, run_code
from trialbox.types import Limits

LIMITS = Limits(wall_s=2, cpu_s=2, memory_mb=128, disk_mb=16)


def scrape(client: httpx.Client) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    r = client.get("/metrics")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    out = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_metrics_endpoint_serves_this_process_metrics(runner: Any) -> None:
    async def work() -> None:
        async with await NamespaceSandbox.open(runner.pool, LIMITS) as sb:
            for code in ("print(1)", "print(2)", "raise SystemExit(4)"):
                await run_code(sb, code)

    with telemetry.use_metrics(), serve(dashboard_app()) as url, httpx.Client(base_url=url) as c:
        before = scrape(c)
        assert before.get(("trialbox_sandbox_executions_total", (("status", "ok"),)), 0) == 0
        runner.run(work())
        after = scrape(c)
        assert after[("trialbox_sandbox_executions_total", (("status", "ok"),))] == 2
        assert after[("trialbox_sandbox_executions_total", (("status", "exit"),))] == 1
        assert after[("trialbox_sandbox_execution_seconds_count", ())] == 3
        assert after[("trialbox_pool_cells", (("state", "ready"),))] >= 0
        assert ("trialbox_infra_failure_ratio", ()) in after
        # The dashboard's JSON reads the same numbers.
        d = c.get("/api/dashboard").json()
        assert d["totals"]["executions"] == 3
        assert d["totals"]["executions_by_status"] == {"ok": 2.0, "exit": 1.0}
        assert d["latency_ms"]["exec_p50"] is not None


def test_real_server_metrics_move_with_runs_and_gradings(server: Any) -> None:
    with server.client() as c:
        before = scrape(c)
        ok = c.post("/v1/exec", json={"code": "print('hi')"})
        assert ok.status_code == 200, ok.text
        bad = c.post("/v1/exec", json={"code": "import sys; sys.exit(2)"})
        assert bad.status_code == 200, bad.text
        graded = c.post("/v1/submissions", json={
            "task_id": "HumanEval/0", "completion": "    return False\n"})
        assert graded.status_code == 200, graded.text
        after = scrape(c)

    def delta(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert delta("trialbox_sandbox_executions_total", status="ok") >= 1
    assert delta("trialbox_sandbox_executions_total", status="exit") >= 1
    assert delta("trialbox_judge_outcomes_total", outcome="failed", kind="function") == 1
    assert delta("trialbox_rewards_count") == 1
    assert delta("trialbox_rewards_bucket", le="0.0") == 1
    assert ("trialbox_queue_depth", (("queue", "admission.waiting"),)) in after
    assert after[("trialbox_pool_cells", (("state", "ready"),))] >= 0

    # The response names its trace; the trace holds the request, the grading and the
    # sandbox runs beneath it.
    trace_id = graded.headers["x-trace-id"]
    with server.client() as c:
        t = c.get(f"/api/traces/{trace_id}").json()
    by_id = {s["span_id"]: s for s in t["spans"]}
    names = {s["name"] for s in t["spans"]}
    assert {"HTTP POST", "judge.grade", "sandbox.exec", "judge.reward"} <= names, names
    grade = next(s for s in t["spans"] if s["name"] == "judge.grade")
    http = next(s for s in t["spans"] if s["name"] == "HTTP POST")
    assert http["attributes"]["http.target"] == "/v1/submissions"
    assert _under(grade, http["span_id"], by_id)
    reward = next(s for s in t["spans"] if s["name"] == "judge.reward")
    assert _under(reward, http["span_id"], by_id) and reward["attributes"]["reward.value"] == 0
    runs = [s for s in t["spans"] if s["name"] == "sandbox.exec"]
    assert all(_under(s, grade["span_id"], by_id) for s in runs) and len(runs) == 2
    assert grade["attributes"]["judge.outcome"] == "failed"


def _under(span: dict[str, Any], ancestor: str, by_id: dict[str, dict[str, Any]]) -> bool:
    p = span["parent_id"]
    while p is not None and p in by_id:
        if p == ancestor:
            return True
        p = by_id[p]["parent_id"]
    return False


CANARY = {"task_id": "canary/echo", "canary": True, "prompt": "def f(x):\n",
          "entry_point": "f", "test": "def check(candidate):\n    assert candidate(1) == 1\n"}
"""A canary task (impossible by design; passable here, so the test can stand in for a
policy that gamed the judge): its pass is evidence, the one CHEAT a function task has."""


def test_a_cheat_leads_from_the_dashboard_to_its_trace_and_log_lines(server: Any) -> None:
    with server.client() as c:
        r = c.post("/v1/submissions", json={"task": CANARY, "completion": "    return x\n"})
        assert r.status_code == 200 and r.json()["outcome"] == "cheat", r.text
        events = c.get("/api/dashboard").json()["events"]
        cheat = next(e for e in events if e["kind"] == "cheat")
        assert cheat["task_id"] == "canary/echo" and cheat["trace_id"] == r.headers["x-trace-id"]
        t = c.get(f"/api/traces/{cheat['trace_id']}").json()
    grade = next(s for s in t["spans"] if s["name"] == "judge.grade")
    assert grade["attributes"]["judge.outcome"] == "cheat"
    [line] = [x for x in t["logs"] if "cheat detected" in x["message"]]
    assert line["trace_id"] == cheat["trace_id"] and line["span_id"] == grade["span_id"]
    assert line["level"] == "WARNING" and line["task_id"] == "canary/echo"
    # ...and the server's own log (stderr) has the same line as JSON with the trace id
    assert wait_for(lambda: cheat["trace_id"] in server.stderr())
    logged = [json.loads(x) for x in server.stderr().splitlines()
              if x.startswith("{") and cheat["trace_id"] in x]
    assert any("cheat detected" in x["message"] and x["span_id"] == grade["span_id"]
               for x in logged), logged
