"""What the other layers call: decorators for the sandbox and judge paths, span helpers
for the stages above them, and `record_*` helpers. Nothing here imports those layers.

Wired in the sandbox and judge (one decorator line each):

    NamespaceSandbox.exec   @traced_exec        span `sandbox.exec`; runs by status, wall
    NamespaceSandbox._cell  @traced_acquire     span `sandbox.acquire` (cell for a run)
    CellPool._make_cell     @traced_cell_start  span `sandbox.start`; starts, start latency
    CellPool._warm_one      @traced_warm        root span `sandbox.warm` (background)
    judge_function/_stdio   @traced_grade       span `judge.grade`; outcomes, flags, time
    reward                  @traced_reward      span `judge.reward`; reward histogram

For the layers above (rollout, train, schedule), which call them themselves:

    with episode(episode_id, task_id=...):          # span `episode`
        with model_output(tokens=n):                # span `model.generate`
            completion = await policy.generate(...)
        ...                                         # sandbox / judge spans nest here
    with train_step(run_id, step, links=[ctx, ...]):  # span `train.step`
        ...
    record_train_step(run_id, step, reward_mean=0.4, loss=1.2)
    task_moved("queued", "running")                 # trialbox_tasks{state}

Cost: with tracing off, `traced_acquire` adds nothing but a flag test and the others a
few counter/histogram updates (~2-3 µs per run, see docs/observability.md for the
measurement); with tracing on, each span costs what the OpenTelemetry SDK costs.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, ParamSpec, TypeVar

from opentelemetry import trace
from opentelemetry.trace import Link, SpanContext, Status, StatusCode

from trialbox.telemetry import tracing
from trialbox.telemetry.metrics import current, watch_pool
from trialbox.telemetry.tracing import AttrValue, span
from trialbox.types import ExecResult, ExecStatus, Grade, Outcome

log = logging.getLogger("trialbox.telemetry")
P = ParamSpec("P")
R = TypeVar("R")

_EXCLUDED = (Outcome.INFRA, Outcome.ERROR)


def _trace_id() -> str | None:
    ids = tracing.current_ids()
    return ids[0] if ids else None


# --------------------------------------------------------------------------- records

def record_exec(result: ExecResult) -> None:
    """Count one sandbox run (status, wall time); remember infra failures."""
    m = current()
    status = result.status.value
    with m.recent.lock:  # also RunCounts' lock: one acquisition per run
        m.runs.add_locked(status, result.wall_ms / 1000)
        m.recent.execs.append((time.time(), result.wall_ms, status))
    if result.status is ExecStatus.INFRA:
        m.child(m.infra, "sandbox").inc()
        m.recent.note("infra", f"sandbox run: {result.message}", trace_id=_trace_id())
        log.warning("sandbox run failed (infra): %s", result.message)


def record_grade(grade: Grade, kind: str, seconds: float) -> None:
    """Count one graded attempt: outcome, time, flags; remember infra, errors, cheats."""
    m = current()
    outcome = grade.outcome.value
    m.child(m.judge_outcomes, outcome, kind).inc()
    m.judge_seconds.observe(seconds)
    for flag in grade.flags:
        m.child(m.flags, flag).inc()
    with m.recent.lock:
        m.recent.grades.append((time.time(), outcome))
    tid = _trace_id()
    if grade.outcome is Outcome.INFRA:
        m.child(m.infra, "judge").inc()
        m.recent.note("infra", f"{grade.task_id}: {grade.message}", task_id=grade.task_id,
                      trace_id=tid)
        log.warning("grading %s failed (infra, excluded): %s", grade.task_id, grade.message,
                    extra={"task_id": grade.task_id, "outcome": outcome})
    elif grade.outcome is Outcome.ERROR:
        m.recent.note("failure", f"{grade.task_id}: {grade.message}",
                      task_id=grade.task_id, trace_id=tid)
    elif grade.outcome is Outcome.CHEAT:
        m.recent.note("cheat", f"{grade.task_id}: {grade.message}", task_id=grade.task_id,
                      flags=list(grade.flags), trace_id=tid)
        # one WARNING per CHEAT_LOG_EVERY_S (what reaches a reward function's stderr),
        # the rest at INFO: each cheat's trace keeps its line, the metric counts them all
        said = _said("cheat")
        text = grade.message if grade.message.startswith("cheat detected") else \
            f"cheat detected: {grade.message}"
        log.log(logging.INFO if said is None else logging.WARNING, "%s: %s%s",
                grade.task_id, text, said or "",
                extra={"task_id": grade.task_id, "outcome": outcome,
                       "flags": list(grade.flags)})
    elif grade.flags:
        m.recent.note("flag", f"{grade.task_id}: {', '.join(grade.flags)}",
                      task_id=grade.task_id, flags=list(grade.flags), trace_id=tid)


CHEAT_LOG_EVERY_S = 10.0
"""At most one WARNING line per this many seconds for a kind of event that can come once
per graded sample (a reward function is called for every completion); the others are
logged at INFO (a trace keeps them; the default stderr handler does not print them), and
the metrics (`trialbox_judge_outcomes_total`) count every one."""
_last_said: dict[str, tuple[float, int]] = {}
_said_lock = threading.Lock()


def _said(kind: str) -> str | None:
    """None when a line of `kind` was logged in the last CHEAT_LOG_EVERY_S; else the
    suffix saying how many were not ("" when none)."""
    now = time.monotonic()
    with _said_lock:
        at, quiet = _last_said.get(kind, (-1e18, 0))
        if now - at < CHEAT_LOG_EVERY_S:
            _last_said[kind] = (at, quiet + 1)
            return None
        _last_said[kind] = (now, 0)
    return f" (and {quiet} more at INFO in the last {CHEAT_LOG_EVERY_S:g} s)" if quiet \
        else ""


def record_reward(value: float | None) -> None:
    """Count one reward (None: excluded from training, counted apart)."""
    m = current()
    if value is None:
        m.rewards_excluded.inc()
        return
    m.rewards.observe(value)
    with m.recent.lock:
        m.recent.rewards.append((time.time(), float(value)))


def record_train_step(run_id: str, step: int, reward_mean: float | None = None,
                      **scalars: float) -> None:
    """One training step of `run_id`: the run page draws `reward_mean` (and the other
    scalars, e.g. loss=, kl=) against `step`."""
    m = current()
    m.child(m.train_steps, run_id).inc()
    if reward_mean is not None:
        m.child(m.train_reward, run_id).set(reward_mean)
    point: dict[str, Any] = {"step": int(step), "t": time.time(), "reward_mean": reward_mean,
                             **{k: float(v) for k, v in scalars.items()}}
    with m.recent.lock:
        m.recent.runs.setdefault(run_id, deque(maxlen=10000)).append(point)


def task_moved(old: object | None, new: object | None) -> None:
    """A task left state `old` and entered `new` (None: it appeared / is forgotten).
    States may be enums (their `.value` is used) or strings."""
    m = current()
    for state, delta in ((old, -1), (new, 1)):
        if state is not None:
            key = str(getattr(state, "value", state))
            m.tasks[key] = max(0, m.tasks.get(key, 0) + delta)


def set_tasks(counts: dict[str, int]) -> None:
    """Replace the task counts by state (for a scheduler that recounts)."""
    current().tasks = {str(getattr(k, "value", k)): int(v) for k, v in counts.items()}


def note(kind: str, summary: str, **detail: Any) -> None:
    """Show something on the dashboard's recent failures/flags list (kind: `infra`,
    `failure`, `cheat` or `flag`), with the current trace id."""
    current().recent.note(kind, summary, trace_id=_trace_id(), **detail)


# --------------------------------------------------------------------------- decorators

def traced_exec(fn: Callable[P, Awaitable[ExecResult]]
                ) -> Callable[P, Coroutine[Any, Any, ExecResult]]:
    """For `Sandbox.exec(self, argv, ...)`: span `sandbox.exec` and the run's metrics."""

    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> ExecResult:
        if not tracing.enabled():
            result = await fn(*args, **kwargs)
            record_exec(result)
            return result
        sb: Any = args[0]
        argv: Any = args[1] if len(args) > 1 else kwargs.get("argv", ())
        attrs: dict[str, AttrValue] = {"sandbox.tier": str(getattr(sb, "tier", "")),
                                       "sandbox.argv0": str(argv[0]) if argv else ""}
        with span("sandbox.exec", attrs) as sp:
            result = await fn(*args, **kwargs)
            if sp is not None:
                sp.set_attributes({"sandbox.status": result.status.value,
                                   "sandbox.wall_ms": result.wall_ms,
                                   "sandbox.cpu_ms": result.cpu_ms})
                if result.exit_code is not None:
                    sp.set_attribute("sandbox.exit_code", result.exit_code)
                if result.status is ExecStatus.INFRA:
                    sp.set_status(Status(StatusCode.ERROR, result.message[:200]))
            record_exec(result)
        return result

    return wrapper


def traced_acquire(fn: Callable[P, Coroutine[Any, Any, R]]
                   ) -> Callable[P, Coroutine[Any, Any, R]]:
    """For the sandbox's "get a cell for this run" step: span `sandbox.acquire`, only when
    the session holds no cell (`parked`: its first run, or after a park) — a session
    that already holds one gets it back at no cost, and a span there would cost more
    than the step. Otherwise it hands back `fn`'s own coroutine: no extra frame."""

    async def traced(*args: P.args, **kwargs: P.kwargs) -> R:
        with span("sandbox.acquire"):
            return await fn(*args, **kwargs)

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> Coroutine[Any, Any, R]:
        if not tracing.enabled() or not getattr(args[0], "parked", True):
            return fn(*args, **kwargs)
        return traced(*args, **kwargs)

    return wrapper


def traced_cell_start(fn: Callable[P, Awaitable[R]]) -> Callable[P, Coroutine[Any, Any, R]]:
    """For the pool's "start a new cell" (`CellPool._make_cell(self, net)`): span
    `sandbox.start`, starts by result, start latency; watches the pool's size."""

    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        pool: Any = args[0]
        watch_pool(pool)
        m = current()
        t0 = time.perf_counter()
        with span("sandbox.start"):
            try:
                cell = await fn(*args, **kwargs)
            except BaseException:
                m.child(m.sandbox_starts, "failed").inc()
                raise
        seconds = time.perf_counter() - t0
        m.child(m.sandbox_starts, "ok").inc()
        m.start_seconds.observe(seconds)
        with m.recent.lock:
            m.recent.starts.append((time.time(), seconds * 1e3))
        return cell

    return wrapper


def traced_warm(fn: Callable[P, Coroutine[Any, Any, R]]
                ) -> Callable[P, Coroutine[Any, Any, R]]:
    """For the pool's background warm-up of a spare cell: a root span `sandbox.warm`, so
    a warm-up started while a request was current does not join that request's trace."""

    async def traced(*args: P.args, **kwargs: P.kwargs) -> R:
        with span("sandbox.warm", root=True):
            return await fn(*args, **kwargs)

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> Coroutine[Any, Any, R]:
        if not tracing.enabled():
            return fn(*args, **kwargs)
        return traced(*args, **kwargs)

    return wrapper


def traced_grade(fn: Callable[P, Awaitable[Grade]]) -> Callable[P, Coroutine[Any, Any, Grade]]:
    """For `judge_function(task, ...)` / `judge_stdio(task, ...)`: span `judge.grade`,
    outcomes by kind, grading time, anti-cheat flags."""

    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> Grade:
        task: Any = args[0] if args else kwargs.get("task")
        kind = str(getattr(getattr(task, "kind", None), "value", "unknown"))
        attrs: dict[str, AttrValue] = {"task.id": str(getattr(task, "task_id", "")),
                                       "task.kind": kind}
        t0 = time.perf_counter()
        with span("judge.grade", attrs) as sp:
            grade = await fn(*args, **kwargs)
            if sp is not None:
                sp.set_attributes({"judge.outcome": grade.outcome.value,
                                   "judge.attempts": grade.attempts,
                                   "judge.flags": ",".join(grade.flags),
                                   "judge.tests_passed": sum(t.passed for t in grade.tests),
                                   "judge.tests": len(grade.tests)})
                if grade.outcome is Outcome.INFRA:
                    sp.set_status(Status(StatusCode.ERROR, grade.message[:200]))
            record_grade(grade, kind, time.perf_counter() - t0)
        return grade

    return wrapper


def traced_reward(fn: Callable[P, float | None]) -> Callable[P, float | None]:
    """For `reward(grade, spec, ...)`: span `judge.reward` and the reward histogram."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> float | None:
        if not tracing.enabled():
            value = fn(*args, **kwargs)
            record_reward(value)
            return value
        grade: Any = args[0] if args else kwargs.get("grade")
        with span("judge.reward", {"task.id": str(getattr(grade, "task_id", ""))}) as sp:
            value = fn(*args, **kwargs)
            if sp is not None:
                sp.set_attribute("reward.excluded", value is None)
                if value is not None:
                    sp.set_attribute("reward.value", value)
            record_reward(value)
        return value

    return wrapper


# --------------------------------------------------------------------------- stages above

@contextmanager
def episode(episode_id: str, **attrs: AttrValue) -> Iterator[trace.Span | None]:
    """Span `episode` around one agent episode; its turns' spans nest under it. Keep the
    yielded span's `get_span_context()` to link the training step to it."""
    with span("episode", {"episode.id": episode_id, **attrs}) as sp:
        yield sp


@contextmanager
def model_output(**attrs: AttrValue) -> Iterator[trace.Span | None]:
    """Span `model.generate` around one model call (set e.g. tokens= on the span)."""
    with span("model.generate", attrs) as sp:
        yield sp


@contextmanager
def train_step(run_id: str, step: int, links: Sequence[SpanContext] = (),
               **attrs: AttrValue) -> Iterator[trace.Span | None]:
    """Span `train.step`, linked to the episodes whose rewards it learns from (a step
    consumes many episodes, so they are links, not parents)."""
    tracer = tracing._S.tracer
    if tracer is None or not tracing.enabled():
        yield None
        return
    with tracer.start_as_current_span(
            "train.step", attributes={"run.id": run_id, "train.step": step, **attrs},
            links=[Link(c) for c in links if c.is_valid]) as sp:
        yield sp
