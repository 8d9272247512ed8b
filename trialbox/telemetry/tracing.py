"""OpenTelemetry tracing: one tracer provider per process, cheap spans when nobody listens.

    setup_tracing()                       # once, at startup (serve does it); reads
                                          # OTEL_EXPORTER_OTLP_ENDPOINT for OTLP/HTTP export
    with span("judge.grade", task_id="HumanEval/0") as sp:   # sp is None when disabled
        ...
    with capture() as exporter:           # tests: every span finished inside, in memory
        ...
    exporter.get_finished_spans()

Why a fan-out processor of our own: the SDK's provider can only be set once per process
and cannot drop a processor again, but tests need an in-memory exporter for one block
only. The provider holds a single `_Fanout`; exporters come and go inside it. When it
holds none, `span()` returns a shared no-op context manager: a disabled span costs one
attribute test (~0.1 µs), so lower layers may call it on their hot paths.

The dashboard keeps the last `TracingConfig.keep_spans` finished spans (`recent_spans`)
so a run can be followed from the dashboard to its trace without a tracing backend.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
)
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_ON,
    ParentBased,
    Sampler,
    SamplingResult,
    TraceIdRatioBased,
)
from opentelemetry.trace import Link, SpanKind
from opentelemetry.trace.span import TraceState
from opentelemetry.util.types import Attributes

from trialbox.errors import UsageError

AttrValue = str | bool | int | float


@dataclass(frozen=True)
class TracingConfig:
    """How this process traces."""

    otlp_endpoint: str | None = field(
        default_factory=lambda: os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or None)
    """OTLP/HTTP collector, e.g. http://127.0.0.1:4318 (/v1/traces is added when the URL
    has no path). Default: the standard OTEL_EXPORTER_OTLP_* variables; None: no export."""
    service_name: str = field(default_factory=lambda: os.environ.get("OTEL_SERVICE_NAME")
                              or "trialbox")
    """`service.name` of every span."""
    keep_spans: int = 5000
    """Finished spans kept in memory for the dashboard's trace view (0: none)."""
    sample_ratio: float = field(default_factory=lambda: float(
        os.environ.get("TRIALBOX_TRACE_SAMPLE") or 1.0))
    """Share of new traces recorded (children follow their root's decision). Lower it
    when thousands of runs a second make spans (~15-50 µs each here) add up."""

    def __post_init__(self) -> None:
        if self.otlp_endpoint is not None:
            parts = urlsplit(self.otlp_endpoint)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise UsageError(f"TracingConfig.otlp_endpoint must be an http(s) URL such "
                                 f"as http://127.0.0.1:4318, got {self.otlp_endpoint!r}")
        if self.keep_spans < 0:
            raise UsageError("TracingConfig.keep_spans must be >= 0")
        if not 0.0 <= self.sample_ratio <= 1.0:
            raise UsageError(f"TracingConfig.sample_ratio must be in [0, 1] (or "
                             f"TRIALBOX_TRACE_SAMPLE), got {self.sample_ratio!r}")


class _Sampler(Sampler):
    """Parent-based ratio sampling whose ratio `setup_tracing` may change after the
    provider exists (the provider, and its sampler, are made once per process)."""

    def __init__(self) -> None:
        self.inner: Sampler = ParentBased(ALWAYS_ON)

    def set_ratio(self, ratio: float) -> None:
        self.inner = ParentBased(ALWAYS_ON if ratio >= 1 else TraceIdRatioBased(ratio))

    def should_sample(self, parent_context: Context | None, trace_id: int, name: str,
                      kind: SpanKind | None = None, attributes: Attributes = None,
                      links: Sequence[Link] | None = None,
                      trace_state: TraceState | None = None) -> SamplingResult:
        return self.inner.should_sample(parent_context, trace_id, name, kind, attributes,
                                        links, trace_state)

    def get_description(self) -> str:
        return f"trialbox({self.inner.get_description()})"


class _Fanout(SpanProcessor):
    """The provider's one processor; forwards to the processors registered now."""

    def __init__(self) -> None:
        self.processors: tuple[SpanProcessor, ...] = ()
        self._lock = threading.Lock()

    def add(self, p: SpanProcessor) -> None:
        with self._lock:
            self.processors = (*self.processors, p)

    def remove(self, p: SpanProcessor) -> None:
        with self._lock:
            self.processors = tuple(x for x in self.processors if x is not p)

    def on_start(self, span: Any, parent_context: Context | None = None) -> None:
        for p in self.processors:
            p.on_start(span, parent_context)

    def on_end(self, span: ReadableSpan) -> None:
        for p in self.processors:
            p.on_end(span)

    def shutdown(self) -> None:
        for p in self.processors:
            p.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return all(p.force_flush(timeout_millis) for p in self.processors)


class RecentSpans(SpanProcessor):
    """Keeps the last N finished spans, for the dashboard's trace view."""

    def __init__(self, keep: int):
        self.spans: deque[ReadableSpan] = deque(maxlen=keep)

    def on_end(self, span: ReadableSpan) -> None:
        self.spans.append(span)

    def trace(self, trace_id: str) -> list[ReadableSpan]:
        """Finished spans of one trace (hex id), in start order."""
        want = int(trace_id, 16)
        found = [s for s in list(self.spans) if s.context is not None
                 and s.context.trace_id == want]
        return sorted(found, key=lambda s: s.start_time or 0)


class _State:
    provider: TracerProvider | None = None
    tracer: trace.Tracer | None = None
    fanout = _Fanout()
    sampler = _Sampler()
    recent: RecentSpans | None = None
    otlp: SpanProcessor | None = None
    config: TracingConfig | None = None
    lock = threading.Lock()


_S = _State()


def _provider(service_name: str) -> TracerProvider:
    with _S.lock:
        if _S.provider is None:
            provider = TracerProvider(resource=Resource.create({"service.name":
                                                                service_name}),
                                      sampler=_S.sampler)
            provider.add_span_processor(_S.fanout)
            # Global too, so spans of libraries (and other trialbox parts using the
            # OpenTelemetry API directly) join the same traces. Ours uses the provider
            # directly and does not depend on winning that race.
            trace.set_tracer_provider(provider)
            _S.provider = provider
            _S.tracer = provider.get_tracer("trialbox")
        return _S.provider


def setup_tracing(config: TracingConfig | None = None) -> TracerProvider:
    """Set up tracing for this process: the provider (once), the in-memory span keeper
    for the dashboard, and an OTLP/HTTP exporter when an endpoint is configured.
    Calling it again adds what is missing (e.g. an endpoint) and changes nothing else."""
    config = config or TracingConfig()
    provider = _provider(config.service_name)
    with _S.lock:
        _S.config = _S.config or config
        _S.sampler.set_ratio(config.sample_ratio)
        if _S.recent is None and config.keep_spans:
            _S.recent = RecentSpans(config.keep_spans)
            _S.fanout.add(_S.recent)
        if _S.otlp is None and config.otlp_endpoint:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
                OTLPSpanExporter,
            )
            url = config.otlp_endpoint
            if urlsplit(url).path in ("", "/"):
                url = url.rstrip("/") + "/v1/traces"
            _S.otlp = BatchSpanProcessor(OTLPSpanExporter(endpoint=url))
            _S.fanout.add(_S.otlp)
    return provider


def flush(timeout_s: float = 5.0) -> bool:
    """Export every finished span now (the OTLP exporter batches)."""
    return _S.fanout.force_flush(int(timeout_s * 1000))


def enabled() -> bool:
    """True when some exporter listens (spans are recorded)."""
    return bool(_S.fanout.processors)


def recent_spans() -> RecentSpans | None:
    """The dashboard's span keeper (None before `setup_tracing`)."""
    return _S.recent


@contextmanager
def capture(exporter: SpanExporter | None = None) -> Iterator[InMemorySpanExporter]:
    """Record every span finished inside the block into an in-memory exporter (or
    `exporter`, synchronously). For tests; sets up the provider if needed."""
    _provider("trialbox")
    mem = InMemorySpanExporter()
    proc = SimpleSpanProcessor(exporter or mem)
    _S.fanout.add(proc)
    try:
        yield mem
    finally:
        _S.fanout.remove(proc)


class _NoSpan:
    """The context manager `span()` returns while tracing is off: yields None."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


NO_SPAN = _NoSpan()


def span(name: str, attributes: Mapping[str, AttrValue] | None = None, *,
         root: bool = False) -> AbstractContextManager[trace.Span | None]:
    """A span around the block, current inside it (children nest under it), or a no-op
    yielding None when tracing is off. `root=True` starts a new trace, ignoring the
    current span (background work that no request is waiting for)."""
    tracer = _S.tracer
    if tracer is None or not _S.fanout.processors:
        return NO_SPAN
    return tracer.start_as_current_span(name, context=Context() if root else None,
                                        attributes=attributes)


def current_ids() -> tuple[str, str] | None:
    """(trace_id, span_id) of the current span in hex, or None outside any span."""
    ctx = trace.get_current_span().get_span_context()
    if not ctx.is_valid:
        return None
    return f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}"
