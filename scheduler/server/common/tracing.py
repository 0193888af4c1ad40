"""Traces of planned requests: per sampled request a span tree, collected on the request path as plain records
(monotonic µs) and turned into OpenTelemetry spans, exported over OTLP/HTTP, once the request is answered.

    InferRequest (the call; status ERROR with the shed or failure reason)
    ├── queue                      arrival -> its first dispatch
    └── dispatch                   one batch it rode (pipeline, batch size)
        ├── stage K: <partition>   input at hand -> response received (vGPU, server)
        │   ├── send               sent -> compute starts on the server
        │   ├── compute            the server's compute
        │   └── response           compute ends -> response received
        └── hop K-1->K             previous response -> this stage sent (shm, or http / grpc: the stage protocol)

The trace continues the client's (its W3C ``traceparent``) and goes on on the Triton servers: each stage call carries
a ``traceparent`` naming its stage span, so a tritonserver tracing in OpenTelemetry mode makes its spans children of
it. Nothing is recorded while tracing is off (``Tracer.on`` is one attribute read per request and per dispatch).
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass, field
from typing import Any

from scheduler.server.common import forwarding
from scheduler.server.common.trace_settings import TraceConfig, TraceSettings

log = logging.getLogger("poolpipe.sidecar.trace")
ROOT = -1
EXPORT_TIMEOUT_S = 3  # per export, retries included: a receiver that is down delays an orderly stop by this at most


@dataclass
class SpanRecord:
    name: str
    start_us: float
    end_us: float
    parent: int  # index in CallTrace.spans (ROOT: the request's span)
    attrs: dict[str, Any] = field(default_factory=dict)
    span_id: int | None = None  # chosen before the span is made (a stage call named it as its parent); None: random


def new_id(bits: int) -> int:
    """A random W3C trace (128 bits) or span (64 bits) id: never the invalid all-zero one."""
    return random.getrandbits(bits) or 1


class CallTrace:
    """The spans of one traced request, recorded as it is served."""

    __slots__ = ("model", "request_id", "arrival_us", "attrs", "spans", "queue_end_us", "parent", "trace_id",
                 "flags")

    def __init__(self, model: str, request_id: str, arrival_us: float, attrs: dict[str, Any],
                 traceparent: str | None = None) -> None:
        from scheduler.server.common.trace_ids import remote_parent  # noqa: PLC0415 - only when tracing

        self.model = model
        # the client's W3C trace context (a malformed one starts a new trace, as the W3C propagator decides): the
        # request's span continues its trace, and the stage calls carry its trace id and flags
        self.parent = remote_parent(traceparent)
        self.trace_id = self.parent.trace_id if self.parent is not None else new_id(128)
        self.flags = int(self.parent.trace_flags) if self.parent is not None else 1  # 1: sampled
        self.request_id = request_id
        self.arrival_us = arrival_us
        self.attrs = attrs
        self.spans: list[SpanRecord] = []
        self.queue_end_us: float | None = None

    def dispatched(self, dispatch_id: int, pipeline: str, batch: int, now_us: float) -> int:
        """A batch carrying (rows of) this request starts; returns its span's index."""
        if self.queue_end_us is None:
            self.queue_end_us = now_us
        self.spans.append(SpanRecord("dispatch", now_us, now_us, ROOT, {"poolpipe.dispatch_id": dispatch_id,
                                                                         "poolpipe.pipeline": pipeline,
                                                                         "poolpipe.batch_size": batch}))
        return len(self.spans) - 1


class DispatchTraces:
    """The traced requests riding one dispatch and their dispatch spans: each stage is recorded into all."""

    __slots__ = ("entries", "last_recv_us", "call_span_ids")

    def __init__(self, traces: list[CallTrace], dispatch_id: int, pipeline: str, batch: int, now_us: float) -> None:
        self.entries = [(ct, ct.dispatched(dispatch_id, pipeline, batch, now_us)) for ct in traces]
        self.last_recv_us: float | None = None
        self.call_span_ids: dict[int, int] = {}  # stage -> the span id its call's traceparent named

    @classmethod
    def of(cls, calls: list[Any], dispatch_id: int, pipeline: str, now_us: float) -> "DispatchTraces | None":
        """For the calls of a dispatch's samples (each call once); None when none is traced."""
        seen: dict[int, CallTrace] = {}
        for c in calls:
            if c.trace is not None:
                seen[id(c.trace)] = c.trace
        return cls(list(seen.values()), dispatch_id, pipeline, len(calls), now_us) if seen else None

    def call_context(self, k: int) -> str:
        """The W3C ``traceparent`` stage ``k``'s call carries: its parent is the stage's span, which :meth:`stage`
        records under the span id chosen here. A call carries the rows of several requests but one header names
        one parent: the first traced request's (the others' stage spans are in their traces alone)."""
        ct = self.entries[0][0]
        span_id = self.call_span_ids[k] = new_id(64)
        return f"00-{ct.trace_id:032x}-{span_id:016x}-{ct.flags:02x}"

    def stage(self, k: int, partition: str, vgpu: str, server: str, hop: str | None, t: Any) -> None:
        """Stage ``k``'s measured timing ``t`` (ready, send, start, end, recv in µs); ``hop``: how its input came
        from the previous stage (shm, grpc; None for the first)."""
        attrs = {"poolpipe.stage": k, "poolpipe.partition": partition, "poolpipe.vgpu": vgpu, "poolpipe.server": server}
        call_span_id = self.call_span_ids.pop(k, None)
        for i, (ct, parent) in enumerate(self.entries):
            if hop is not None and self.last_recv_us is not None:
                ct.spans.append(SpanRecord(f"hop {k - 1}->{k}", self.last_recv_us, t.send_us, parent,
                                           {"poolpipe.hop": hop}))
            ct.spans.append(SpanRecord(f"stage {k}: {partition}", t.ready_us, t.recv_us, parent, attrs,
                                       call_span_id if i == 0 else None))
            me = len(ct.spans) - 1
            ct.spans += [SpanRecord("send", t.send_us, t.start_us, me), SpanRecord("compute", t.start_us, t.end_us, me),
                         SpanRecord("response", t.end_us, t.recv_us, me)]
            ct.spans[parent].end_us = max(ct.spans[parent].end_us, t.recv_us)
        self.last_recv_us = t.recv_us


class Tracer:
    """Samples requests by the trace settings and exports finished traces (OTLP/HTTP to the configured URL, or
    to ``exporter``, an OpenTelemetry SpanExporter, e.g. an in-memory one)."""

    def __init__(self, config: TraceConfig | None = None, exporter: Any = None) -> None:
        self.config = config or TraceConfig()
        self.settings = TraceSettings(self.config.sampling)
        self._exporter = exporter
        self._provider: Any = None
        self._otel: Any = None
        self._ids: Any = None  # trace_ids.ChosenIds, once tracing
        self._offset_ns = time.time_ns() - time.monotonic_ns()

    @property
    def on(self) -> bool:
        return self.settings.on

    def start(self, model: str, request_id: str, arrival_us: float, attrs: dict[str, Any]) -> CallTrace | None:
        """A new request of ``model``: its trace when sampled (None otherwise)."""
        if not self.settings.on or not self.settings.sample(model):
            return None
        return CallTrace(model, request_id, arrival_us, attrs, forwarding.traceparent())

    def finish(self, ct: CallTrace, end_us: float, error: str | None = None) -> None:
        """The request was answered (or failed with ``error``): export its spans."""
        try:
            self._export(ct, end_us, error)
        except Exception:  # noqa: BLE001 - a trace must never fail a request
            log.exception("event=trace_export_failed model=%s", ct.model)

    def _ns(self, us: float) -> int:
        return int(us * 1e3) + self._offset_ns

    def _export(self, ct: CallTrace, end_us: float, error: str | None) -> None:
        from opentelemetry import context as otel_context  # noqa: PLC0415 - only when tracing
        from opentelemetry import trace as otel_trace  # noqa: PLC0415
        from opentelemetry.trace import Status, StatusCode  # noqa: PLC0415

        tracer = self._tracer()
        parent = otel_context.Context()
        if ct.parent is not None:
            parent = otel_trace.set_span_in_context(otel_trace.NonRecordingSpan(ct.parent), parent)
        self._ids.choose(trace_id=ct.trace_id if ct.parent is None else None)  # the id its stage calls carried
        root = tracer.start_span("InferRequest", context=parent, start_time=self._ns(ct.arrival_us),
                                 attributes={"triton.model_name": ct.model, "triton.model_version": "1",
                                             "triton.request_id": ct.request_id, **ct.attrs})
        queue_end = ct.queue_end_us if ct.queue_end_us is not None else end_us
        spans = [("queue", ct.arrival_us, queue_end, ROOT, {}, None)] + [
            (s.name, s.start_us, s.end_us, s.parent + 1 if s.parent != ROOT else ROOT, s.attrs, s.span_id)
            for s in ct.spans]
        made: list[Any] = []
        for name, start, end, parent, attrs, span_id in spans:
            ctx = otel_trace.set_span_in_context(root if parent == ROOT else made[parent])
            self._ids.choose(span_id=span_id)
            sp = tracer.start_span(name, context=ctx, start_time=self._ns(start), attributes=attrs)
            made.append(sp)
            sp.end(end_time=self._ns(max(end, start)))
        if error is not None:
            root.add_event("error", {"message": error}, timestamp=self._ns(end_us))
            root.set_status(Status(StatusCode.ERROR, error))
        root.end(end_time=self._ns(end_us))

    def _tracer(self) -> Any:
        if self._otel is None:
            from opentelemetry.sdk.resources import Resource  # noqa: PLC0415
            from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415
            from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor  # noqa: PLC0415

            from scheduler.server.common.trace_ids import ChosenIds  # noqa: PLC0415

            self._ids = ChosenIds()
            self._provider = TracerProvider(resource=Resource.create(self.config.resource), id_generator=self._ids)
            if self._exporter is not None:
                self._provider.add_span_processor(SimpleSpanProcessor(self._exporter))
            else:
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter  # noqa: PLC0415
                b = self.config.bsp
                self._provider.add_span_processor(BatchSpanProcessor(
                    OTLPSpanExporter(endpoint=self.config.url, timeout=EXPORT_TIMEOUT_S),
                    max_queue_size=b["bsp_max_queue_size"], schedule_delay_millis=b["bsp_schedule_delay"],
                    max_export_batch_size=min(b["bsp_max_export_batch_size"], b["bsp_max_queue_size"])))
            self._otel = self._provider.get_tracer("poolpipe.sidecar")
        return self._otel

    def shutdown(self) -> None:
        """Flush what is batched (an orderly stop loses no trace)."""
        if self._provider is not None:
            self._provider.shutdown()
