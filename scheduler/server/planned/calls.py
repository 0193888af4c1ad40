"""Client calls on the planned path: one call's samples ride batches; their outputs are gathered and the call
is answered (outputs, or an explicit error) exactly once; per-model statistics as Triton reports them."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import grpc
import numpy as np
from tritonclient.grpc import service_pb2

from model_repository_gen.manifest import ModelInfo
from scheduler.server.common.client_shm import ClientShmRegistry
from scheduler.server.common.errors import ServeError
from scheduler.server.common.metrics import SidecarMetrics
from scheduler.server.common.tracing import CallTrace, Tracer
from scheduler.server.planned.validate import CheckedRequest


def now_us() -> float:
    return time.monotonic() * 1e6


def request_deadline_us(arrival_us: float, slo_us: float, timeout_us: float | None,
                        deadline_s: float | None) -> float:
    """A request's deadline: its SLO from arrival, or sooner when the client's timeout or its RPC deadline says."""
    deadline = arrival_us + slo_us
    if timeout_us is not None:
        deadline = min(deadline, arrival_us + timeout_us)
    if deadline_s is not None:
        deadline = min(deadline, deadline_s * 1e6)
    return deadline


@dataclass
class ClientCall:
    """One client request; its samples may ride different batches."""

    model: ModelInfo
    request: service_pb2.ModelInferRequest
    checked: CheckedRequest
    future: asyncio.Future
    arrival_us: float
    deadline_us: float
    rows: list[dict[str, np.ndarray] | None]
    left: int
    internal: bool = False  # an application module's request: answered with its output arrays, not a response
    trace: CallTrace | None = None  # its spans, when the request is sampled for tracing


@dataclass
class Sample:
    """One row of a call: the unit the scheduler batches. ``carry`` holds its boundary tensors between the
    dispatches of a per-stage policy (``Dispatch.final`` False)."""

    call: ClientCall
    row: int
    carry: dict[str, np.ndarray] | None = None

    @property
    def wanted(self) -> bool:
        return not self.call.future.done()


@dataclass
class ModelCounters:
    success: int = 0
    success_ns: int = 0
    fail: int = 0
    inferences: int = 0
    executions: int = 0
    last_ms: int = 0


@dataclass
class Answers:
    """Answers calls and counts them (KServe statistics and the sidecar's metrics)."""

    metrics: SidecarMetrics
    models: list[str]
    client_shm: ClientShmRegistry  # outputs a client asked for in its shared memory are written there
    counters: dict[str, ModelCounters] = field(default_factory=dict)
    tracer: Tracer | None = None  # exports a traced call's spans once it is answered

    def __post_init__(self) -> None:
        self.counters = {m: ModelCounters() for m in self.models}

    def complete(self, samples: list[Sample], outputs: dict[str, np.ndarray]) -> None:
        """Rows i of ``outputs`` belong to ``samples[i]``; a call is answered when its last row is in."""
        for i, s in enumerate(samples):
            call = s.call
            if call.future.done():
                continue
            call.rows[s.row] = {n: a[i:i + 1] for n, a in outputs.items()}
            call.left -= 1
            if call.left == 0:
                self.answer(call)

    def answer(self, call: ClientCall) -> None:
        t = now_us()
        if call.internal:
            self._counted(call, t)
            call.future.set_result({o.spec.name: np.concatenate([r[o.spec.name] for r in call.rows])  # type: ignore[index]
                                    for o in call.checked.outputs})
            return
        resp = service_pb2.ModelInferResponse(model_name=call.model.name, model_version="1", id=call.request.id)
        try:
            for target in call.checked.outputs:
                arr = np.concatenate([r[target.spec.name] for r in call.rows])  # type: ignore[index]
                resp.outputs.add(name=target.spec.name, datatype=target.spec.datatype, shape=list(arr.shape))
                data = np.ascontiguousarray(arr).tobytes()
                if target.region is not None:
                    self.client_shm.get(target.region).view(target.offset, len(data),
                                                            f"output '{target.spec.name}'")[:] = data
                    resp.raw_output_contents.append(b"")
                else:
                    resp.raw_output_contents.append(data)
        except ServeError as e:  # e.g. the client unregistered its output region meanwhile
            self.fail(call, e)
            return
        self._counted(call, t)
        call.future.set_result(resp)
        if call.trace is not None and self.tracer is not None:
            self.tracer.finish(call.trace, t)

    def _counted(self, call: ClientCall, t: float) -> None:
        c = self.counters[call.model.name]
        c.success += 1
        c.success_ns += int((t - call.arrival_us) * 1e3)
        c.inferences += call.checked.batch
        c.last_ms = int(time.time() * 1e3)
        self.metrics.finished(call.model.name, t <= call.deadline_us)

    def fail(self, call: ClientCall, error: ServeError) -> None:
        if not call.future.done():
            call.future.set_exception(error)
            self.counters[call.model.name].fail += 1
            self.metrics.finished(call.model.name, False)
            if call.trace is not None and self.tracer is not None:
                self.tracer.finish(call.trace, now_us(), error.message)

    def statistics(self, model: str) -> service_pb2.ModelStatistics:
        c = self.counters[model]
        s = service_pb2.ModelStatistics(name=model, version="1", last_inference=c.last_ms,
                                        inference_count=c.inferences, execution_count=c.executions)
        s.inference_stats.success.count = c.success
        s.inference_stats.success.ns = c.success_ns
        s.inference_stats.fail.count = c.fail
        return s


def shutting_down() -> ServeError:
    return ServeError(grpc.StatusCode.UNAVAILABLE, "the sidecar is shutting down")
