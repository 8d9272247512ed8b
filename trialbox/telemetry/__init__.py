"""Observability used by every layer: Prometheus metrics, OpenTelemetry spans, JSON logs.

    from trialbox import telemetry
    telemetry.setup_tracing()                  # once per process (serve does it)
    telemetry.setup_logging()                  # JSON lines with trace ids on stderr
    with telemetry.episode("ep-1", task_id="HumanEval/0"):
        ...                                    # sandbox/judge spans nest inside
    telemetry.current().exposition()           # Prometheus text format

Metrics: metrics.py (names listed there). Spans: tracing.py (provider, cheap `span`,
`capture` for tests). Logs: logs.py. The hooks the sandbox and judge use, and the span
helpers for the rollout and training layers: instrument.py. docs/observability.md has the
whole picture. This package imports nothing above `trialbox.types`.
"""

from trialbox.telemetry.instrument import (
    episode,
    model_output,
    note,
    record_exec,
    record_grade,
    record_reward,
    record_train_step,
    set_tasks,
    task_moved,
    traced_acquire,
    traced_cell_start,
    traced_exec,
    traced_grade,
    traced_reward,
    traced_warm,
    train_step,
)
from trialbox.telemetry.logs import JsonFormatter, recent_logs, setup_logging
from trialbox.telemetry.metrics import (
    Metrics,
    current,
    pool_cells,
    unwatch,
    use_metrics,
    watch_pool,
    watch_queue,
    watch_tasks,
)
from trialbox.telemetry.tracing import (
    TracingConfig,
    capture,
    current_ids,
    enabled,
    flush,
    setup_tracing,
    span,
)

__all__ = ["episode", "model_output", "note", "record_exec", "record_grade", "record_reward",
           "record_train_step", "set_tasks", "task_moved", "traced_acquire",
           "traced_cell_start", "traced_exec", "traced_grade", "traced_reward", "traced_warm",
           "train_step", "JsonFormatter", "recent_logs", "setup_logging", "Metrics", "current",
           "pool_cells", "unwatch", "use_metrics", "watch_pool", "watch_queue", "watch_tasks",
           "TracingConfig", "capture", "current_ids", "enabled", "flush", "setup_tracing",
           "span"]
