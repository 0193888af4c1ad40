"""The ids of the sidecar's spans where they must be known before the spans are made: a stage call's W3C
``traceparent`` names the stage's span (the parent of the Triton server's own spans) when the call goes out, and
that span is exported only once the request is answered. Imported only while tracing is on (it loads the
OpenTelemetry SDK)."""

from __future__ import annotations

import threading

from opentelemetry import trace
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator


def remote_parent(traceparent: str | None) -> trace.SpanContext | None:
    """The client's span from its ``traceparent`` (None: none, or one the W3C propagator rejects)."""
    if traceparent is None:
        return None
    ctx = TraceContextTextMapPropagator().extract({"traceparent": traceparent})
    span = trace.get_current_span(ctx).get_span_context()
    return span if span.is_valid else None


class ChosenIds(RandomIdGenerator):
    """OpenTelemetry's random ids, except for the next span whose ids the sidecar chose already (:meth:`choose`,
    per thread: taken by the next ``start_span`` on that thread)."""

    def __init__(self) -> None:
        self._next = threading.local()

    def choose(self, trace_id: int | None = None, span_id: int | None = None) -> None:
        self._next.trace_id, self._next.span_id = trace_id, span_id

    def _take(self, what: str) -> int | None:
        chosen = getattr(self._next, what, None)
        setattr(self._next, what, None)
        return chosen

    def generate_trace_id(self) -> int:
        return self._take("trace_id") or super().generate_trace_id()

    def generate_span_id(self) -> int:
        return self._take("span_id") or super().generate_span_id()
