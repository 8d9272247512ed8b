"""A trace of one episode, exported with the in-memory exporter, has a span for every
stage with the right parent links.

Stages wired for real here: sandbox acquire / start / execution (a real NamespaceSandbox
run), grading and reward (the real judge on HumanEval/0). The model output and the
training step come from a scripted episode through the span helpers that the rollout and
training layers call.
"""

from __future__ import annotations

import io
import json
import logging
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan

from trialbox import telemetry
from trialbox.judge.function import judge_function
from trialbox.judge.reward import RewardSpec, reward
from trialbox.sandbox import CellPool, NamespaceSandbox, PoolConfig, run_code
from trialbox.store.tasks import load_humaneval
from trialbox.types import ExecStatus, Limits, Outcome

TASK = next(t for t in load_humaneval() if t.task_id == "HumanEval/0")
LIMITS = Limits(wall_s=5, cpu_s=5, memory_mb=256, disk_mb=16)


def _children(spans: list[ReadableSpan], parent: ReadableSpan) -> list[ReadableSpan]:
    pid = parent.context.span_id if parent.context else None
    return [s for s in spans if s.parent is not None and s.parent.span_id == pid]


def _one(spans: list[ReadableSpan], name: str) -> ReadableSpan:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, f"{name}: {len(found)} spans; names: {[s.name for s in spans]}"
    return found[0]


def test_one_episode_trace_has_every_stage_with_parent_links(runner: Any) -> None:
    log_out = io.StringIO()
    handler = telemetry.setup_logging(logging.INFO, stream=log_out)
    log = logging.getLogger("trialbox.test.episode")

    async def episode() -> dict[str, Any]:
        # A pool with no warm cells: the episode's first run must start one, so the
        # trace shows the start under the acquire.
        pool = await CellPool(PoolConfig(warm=0)).start()
        try:
            with telemetry.capture() as exported:
                with telemetry.span("train.iteration", {"run.id": "run-t"}):
                    with telemetry.episode("ep-1", task_id=TASK.task_id) as ep:
                        with telemetry.model_output(tokens=42):
                            completion = TASK.canonical_solution  # the scripted model
                        async with await NamespaceSandbox.open(pool, LIMITS) as sb:
                            run = await run_code(sb, TASK.prompt + completion +
                                                 "\nprint('loaded')\n")
                        grade = await judge_function(TASK, completion, pool)
                        value = reward(grade, RewardSpec())
                        log.info("episode graded", extra={"outcome": grade.outcome.value})
                        assert ep is not None
                        ep_ctx = ep.get_span_context()
                    with telemetry.train_step("run-t", 1, links=[ep_ctx]):
                        telemetry.record_train_step("run-t", 1, reward_mean=value or 0.0)
            return {"spans": list(exported.get_finished_spans()), "run": run,
                    "grade": grade, "reward": value}
        finally:
            await pool.close()

    try:
        out = runner.run(episode())
    finally:
        logging.getLogger().removeHandler(handler)
    assert out["run"].status is ExecStatus.OK, out["run"]
    assert out["grade"].outcome is Outcome.PASSED and out["reward"] == 1.0

    spans: list[ReadableSpan] = out["spans"]
    root = _one(spans, "train.iteration")
    trace_id = root.context.trace_id
    assert root.parent is None
    ours = [s for s in spans if s.context.trace_id == trace_id]
    # Warm-ups the pool started in the background are traces of their own.
    assert all(s.name == "sandbox.warm" or s.name == "sandbox.start"
               for s in spans if s.context.trace_id != trace_id)

    ep = _one(ours, "episode")
    assert ep.parent is not None and ep.parent.span_id == root.context.span_id
    assert ep.attributes is not None and ep.attributes["episode.id"] == "ep-1"
    names = [s.name for s in _children(ours, ep)]
    assert names == ["model.generate", "sandbox.exec", "judge.grade", "judge.reward"], names

    # The episode's own run: exec → acquire → start (a cell started for it).
    run_span = next(s for s in _children(ours, ep) if s.name == "sandbox.exec")
    assert run_span.attributes["sandbox.status"] == "ok"
    acquire = _children(ours, run_span)
    assert [s.name for s in acquire] == ["sandbox.acquire"]
    assert [s.name for s in _children(ours, acquire[0])] == ["sandbox.start"]

    # Grading runs the candidate and the trusted harness: two runs under judge.grade.
    grade_span = next(s for s in _children(ours, ep) if s.name == "judge.grade")
    assert grade_span.attributes["judge.outcome"] == "passed"
    assert grade_span.attributes["task.id"] == "HumanEval/0"
    runs = [s for s in _children(ours, grade_span) if s.name == "sandbox.exec"]
    assert len(runs) == 2, [s.name for s in _children(ours, grade_span)]
    reward_span = next(s for s in _children(ours, ep) if s.name == "judge.reward")
    assert reward_span.attributes["reward.value"] == 1.0

    # The training step sits beside the episode and links to it.
    step = _one(ours, "train.step")
    assert step.parent is not None and step.parent.span_id == root.context.span_id
    assert [link.context.span_id for link in step.links] == [ep.context.span_id]

    # Every span of the trace ends inside its parent (the chain is well formed).
    by_id = {s.context.span_id: s for s in ours}
    for s in ours:
        if s.parent is not None:
            p = by_id[s.parent.span_id]
            assert p.start_time <= s.start_time and s.end_time <= p.end_time, s.name

    # The log line written inside the episode carries the episode's trace and span id.
    lines = [json.loads(x) for x in log_out.getvalue().splitlines() if x.strip()]
    mine = [x for x in lines if x["message"] == "episode graded"]
    assert len(mine) == 1
    assert mine[0]["trace_id"] == f"{trace_id:032x}"
    assert mine[0]["span_id"] == f"{ep.context.span_id:016x}"
    assert mine[0]["outcome"] == "passed" and mine[0]["level"] == "INFO"


def test_spans_are_noops_when_nobody_listens() -> None:
    from trialbox.telemetry import tracing
    with telemetry.capture() as exported:
        assert telemetry.enabled()
        with telemetry.span("outer") as sp:
            assert sp is not None
            assert telemetry.current_ids() is not None
    assert [s.name for s in exported.get_finished_spans()] == ["outer"]
    # With no processor at all (no dashboard keeper, no exporter) a span is the shared
    # no-op: nothing recorded, no current span.
    saved = tracing._S.fanout.processors
    tracing._S.fanout.processors = ()
    try:
        assert not telemetry.enabled()
        with telemetry.span("ignored") as sp:
            assert sp is None
            assert telemetry.current_ids() is None
    finally:
        tracing._S.fanout.processors = saved


def test_sample_ratio_zero_records_no_trace() -> None:
    from trialbox.telemetry.tracing import TracingConfig
    telemetry.setup_tracing(TracingConfig(otlp_endpoint=None, keep_spans=0, sample_ratio=0.0))
    try:
        with telemetry.capture() as exported:
            with telemetry.span("root"):
                with telemetry.span("child"):
                    pass
        assert exported.get_finished_spans() == ()
    finally:
        telemetry.setup_tracing(TracingConfig(otlp_endpoint=None, keep_spans=0))
    with telemetry.capture() as exported:
        with telemetry.span("root"):
            pass
    assert [s.name for s in exported.get_finished_spans()] == ["root"]
