"""Metrics recorded by the real sandbox and judge paths, into a fresh registry; task and
queue gauges; the JSON log format; OTLP export to a real HTTP receiver on loopback."""

from __future__ import annotations

import gzip
import http.server
import io
import json
import logging
import threading
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests.conftest import load_scaled
from trialbox import telemetry
from trialbox.errors import UsageError
from trialbox.judge.function import judge_function
from trialbox.judge.reward import RewardSpec, reward
from trialbox.sandbox import NamespaceSandbox, run_code
from trialbox.store.tasks import load_humaneval
from trialbox.telemetry import tracing
from trialbox.telemetry.metrics import infra_ratio
from trialbox.types import Grade, Limits, Outcome

LIMITS = Limits(wall_s=1, cpu_s=1, memory_mb=128, disk_mb=16)
TASK = next(t for t in load_humaneval() if t.task_id == "HumanEval/0")


def test_real_runs_and_gradings_are_counted(runner: Any) -> None:
    async def work() -> None:
        async with await NamespaceSandbox.open(runner.pool, LIMITS) as sb:
            await run_code(sb, "print(1)")
            await run_code(sb, "import sys; sys.exit(3)")
            await run_code(sb, "while True: pass")
        passed = await judge_function(TASK, TASK.canonical_solution, runner.pool)
        failed = await judge_function(TASK, "    return False\n", runner.pool)
        for g in (passed, failed, Grade("x", Outcome.INFRA)):
            reward(g, RewardSpec())

    with telemetry.use_metrics() as m:
        runner.run(work())
        v = m.value
        assert v("trialbox_sandbox_executions_total", status="ok") >= 1
        assert v("trialbox_sandbox_executions_total", status="exit") == 1
        assert v("trialbox_sandbox_executions_total", status="timeout") == 1
        # each grading is two runs (candidate + harness): 4 more, none infra
        total = sum(val for _l, val in m.samples()["trialbox_sandbox_executions_total"])
        assert total == 3 + 4
        assert v("trialbox_sandbox_execution_seconds_count") == total
        assert v("trialbox_judge_outcomes_total", outcome="passed", kind="function") == 1
        assert v("trialbox_judge_outcomes_total", outcome="failed", kind="function") == 1
        assert v("trialbox_judge_seconds_count") == 2
        assert v("trialbox_rewards_count") == 2 and v("trialbox_rewards_sum") == 1.0
        assert v("trialbox_rewards_bucket", le="0.0") == 1
        assert v("trialbox_rewards_excluded_total") == 1
        assert v("trialbox_infra_failures_total", stage="sandbox") == 0
        assert infra_ratio(m.recent) == 0.0
        # The pool the runs used is watched: its ready cells are reported.
        assert v("trialbox_pool_cells", state="ready") >= runner.pool.ready_count
        text = m.exposition().decode()
        assert 'trialbox_sandbox_executions_total{status="timeout"} 1.0' in text


def test_cell_starts_are_counted_with_latency(runner: Any) -> None:
    async def work() -> None:
        # a network session never gets a warm cell: a cell is started for it
        async with await NamespaceSandbox.open(runner.pool, LIMITS.with_(network=True)) as sb:
            await run_code(sb, "print(1)")

    with telemetry.use_metrics() as m:
        runner.run(work())
        assert m.value("trialbox_sandbox_starts_total", result="ok") >= 1
        assert m.value("trialbox_sandbox_start_seconds_count") >= 1
        assert 0 < m.value("trialbox_sandbox_start_seconds_sum") < load_scaled(5)  # seconds
        assert m.recent.starts and all(ms > 0 for _t, ms in m.recent.starts)


def test_infra_outcomes_count_as_infra_failures() -> None:
    with telemetry.use_metrics() as m:
        telemetry.record_grade(Grade("t1", Outcome.INFRA, message="node lost"), "function",
                               0.1)
        telemetry.record_grade(Grade("t2", Outcome.PASSED), "function", 0.1)
        telemetry.record_grade(Grade("t3", Outcome.CHEAT, message="exit hook",
                                     flags=("exit-hook",)), "function", 0.1)
        assert m.value("trialbox_infra_failures_total", stage="judge") == 1
        assert m.value("trialbox_infra_failure_ratio") == pytest.approx(1 / 3)
        assert m.value("trialbox_anticheat_flags_total", detector="exit-hook") == 1
        kinds = [e["kind"] for e in m.recent.events]
        assert kinds == ["infra", "cheat"]


def test_task_and_queue_gauges() -> None:
    depth = [3]
    with telemetry.use_metrics() as m:
        telemetry.task_moved(None, "queued")
        telemetry.task_moved(None, "queued")
        telemetry.task_moved("queued", "running")
        telemetry.watch_queue("test-q", lambda: depth[0])
        telemetry.watch_tasks("test-src", lambda: {"done": 5, "running": 1})
        try:
            assert m.value("trialbox_tasks", state="queued") == 1
            assert m.value("trialbox_tasks", state="running") == 2
            assert m.value("trialbox_tasks", state="done") == 5
            assert m.value("trialbox_queue_depth", queue="test-q") == 3
            depth[0] = 7
            assert m.value("trialbox_queue_depth", queue="test-q") == 7
        finally:
            telemetry.unwatch("test-q")
            telemetry.unwatch("test-src")
        assert m.value("trialbox_queue_depth", queue="test-q") == 0


def test_json_log_lines() -> None:
    out = io.StringIO()
    handler = telemetry.setup_logging(logging.INFO, stream=out)
    log = logging.getLogger("trialbox.test.logs")
    try:
        log.info("outside %s", "any span")
        with telemetry.capture():
            with telemetry.span("work"):
                ids = telemetry.current_ids()
                try:
                    raise ValueError("boom")
                except ValueError:
                    log.exception("inside", extra={"task_id": "T1"})
    finally:
        logging.getLogger().removeHandler(handler)
    first, second = (json.loads(line) for line in out.getvalue().splitlines())
    assert first["message"] == "outside any span" and "trace_id" not in first
    assert ids is not None
    assert (second["trace_id"], second["span_id"]) == ids
    assert second["task_id"] == "T1" and second["level"] == "ERROR"
    assert "ValueError: boom" in second["exc"]


class _Collector(http.server.BaseHTTPRequestHandler):
    bodies: list[bytes] = []

    def do_POST(self) -> None:
        data = self.rfile.read(int(self.headers["Content-Length"]))
        if self.headers.get("Content-Encoding") == "gzip":
            data = gzip.decompress(data)
        type(self).bodies.append(data)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_otlp_export_reaches_a_real_receiver() -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Collector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    url = f"http://127.0.0.1:{server.server_address[1]}/v1/traces"
    try:
        # The same exporter setup_tracing installs for an endpoint, synchronous here.
        with telemetry.capture(OTLPSpanExporter(endpoint=url)):
            with telemetry.span("exported", {"task.id": "T9"}):
                pass
    finally:
        server.shutdown()
    names = []
    for body in _Collector.bodies:
        req = ExportTraceServiceRequest.FromString(body)
        for rs in req.resource_spans:
            for ss in rs.scope_spans:
                names += [s.name for s in ss.spans]
    assert "exported" in names


def test_otlp_endpoint_from_the_environment(tmp_path: Any) -> None:
    """The configured path for real: a fresh process with OTEL_EXPORTER_OTLP_ENDPOINT set
    calls setup_tracing() (batching exporter), makes a span, flushes."""
    import os
    import subprocess
    import sys
    _Collector.bodies = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Collector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    code = ("from trialbox import telemetry\n"
            "telemetry.setup_tracing()\n"
            "with telemetry.span('from-env'):\n    pass\n"
            "assert telemetry.flush(10)\n")
    env = {**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT":
           f"http://127.0.0.1:{server.server_address[1]}", "OTEL_SERVICE_NAME": "tb-test"}
    try:
        done = subprocess.run([sys.executable, "-c", code], env=env, timeout=60,
                              capture_output=True, text=True)
    finally:
        server.shutdown()
    assert done.returncode == 0, done.stderr
    [body] = _Collector.bodies
    req = ExportTraceServiceRequest.FromString(body)
    [rs] = req.resource_spans
    service = {a.key: a.value.string_value for a in rs.resource.attributes}["service.name"]
    assert service == "tb-test"
    assert [s.name for ss in rs.scope_spans for s in ss.spans] == ["from-env"]


def test_bad_tracing_config_says_what_to_change() -> None:
    with pytest.raises(UsageError, match="otlp_endpoint"):
        tracing.TracingConfig(otlp_endpoint="localhost:4318")


def test_cheats_are_counted_every_time_and_logged_once_per_interval(caplog, monkeypatch):
    """Issue 30: a reward function called per completion logged a line for every cheat
    ("cheat detected: cheat detected — ..." at WARNING). Now: one WARNING per
    CHEAT_LOG_EVERY_S that says how many more there were, the rest at INFO (kept in
    each cheat's trace); the metric counts each one."""
    from trialbox.telemetry import instrument
    clock = [1000.0]
    monkeypatch.setattr(instrument.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(instrument, "_last_said", {})
    cheat = Grade("t/1", Outcome.CHEAT, message="cheat detected — canary-passed")
    with telemetry.use_metrics() as m, caplog.at_level(logging.INFO,
                                                       logger=instrument.log.name):
        for _ in range(5):
            instrument.record_grade(cheat, "function", 0.01)
        clock[0] += instrument.CHEAT_LOG_EVERY_S
        instrument.record_grade(cheat, "function", 0.01)
        assert m.value("trialbox_judge_outcomes_total", outcome="cheat",
                       kind="function") == 6.0
    lines = [(r.levelname, r.getMessage()) for r in caplog.records
             if "canary-passed" in r.getMessage()]
    assert lines == [("WARNING", "t/1: cheat detected — canary-passed")] + [
        ("INFO", "t/1: cheat detected — canary-passed")] * 4 + [
        ("WARNING", "t/1: cheat detected — canary-passed (and 4 more at INFO in the last "
                    "10 s)")]
