"""Client calls on the planned path: one call's samples ride batches; their outputs are gathered and the call
is answered (outputs, or an explicit error) exactly once; per-model statistics as Triton reports them."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import grpc
import numpy as np
from tritonclient.grpc import service_pb2
from tritonclient.utils import triton_to_np_dtype

from model_repository_gen.manifest import ModelInfo
from poolpipe_common.overheads import SIDECAR_LATENCY_PARAMETER, sidecar_slo_us
from scheduler.server.common.client_shm import ClientShmRegistry
from scheduler.server.common.errors import ServeError
from scheduler.server.common.metrics import SidecarMetrics
from scheduler.server.common.model_stats import ModelStats, RequestMarks
from scheduler.server.common.tracing import CallTrace, Tracer
from scheduler.server.common.wire import RawAnswer
from scheduler.server.planned.stage_io import row_of
from scheduler.server.planned.validate import CheckedRequest


def now_us() -> float:
    return time.monotonic() * 1e6


def request_deadline_us(arrival_us: float, slo_us: float, timeout_us: float | None,
                        deadline_s: float | None, front_us: float = 0.0) -> float:
    """A request's deadline: its SLO from arrival less the time it spends outside the sidecar's clock
    (``front_us``, serve --front-us), or sooner when the client's timeout or its RPC deadline says."""
    deadline = arrival_us + sidecar_slo_us(slo_us, front_us)
    if timeout_us is not None:
        deadline = min(deadline, arrival_us + timeout_us)
    if deadline_s is not None:
        deadline = min(deadline, deadline_s * 1e6)
    return deadline


@dataclass
class ClientCall:
    """One client request; its samples may ride different batches."""

    model: ModelInfo
    request_id: str  # the client's request id, echoed in the answer
    checked: CheckedRequest
    future: asyncio.Future
    arrival_us: float
    deadline_us: float
    rows: list[dict[str, bytes] | None]  # each row's outputs, raw bytes
    left: int
    internal: bool = False  # an application module's request: answered with its output arrays, not a response
    raw: bool = False  # a DecodedRequest (the native front end): answered with a RawAnswer, not a response
    marks: RequestMarks = field(default_factory=RequestMarks)  # measured by the executor, for the statistics
    trace: CallTrace | None = None  # its spans, when the request is sampled for tracing


@dataclass
class Sample:
    """One row of a call: the unit the scheduler batches. ``carry`` holds its boundary tensors between the
    dispatches of a per-stage policy (``Dispatch.final`` False)."""

    call: ClientCall
    row: int
    carry: dict[str, bytes] | None = None

    @property
    def wanted(self) -> bool:
        return not self.call.future.done()


@dataclass
class Answers:
    """Answers calls and counts them (KServe statistics and the sidecar's metrics)."""

    metrics: SidecarMetrics
    models: list[str]
    client_shm: ClientShmRegistry  # outputs a client asked for in its shared memory are written there
    stats: dict[str, ModelStats] = field(default_factory=dict)
    tracer: Tracer | None = None  # exports a traced call's spans once it is answered

    def __post_init__(self) -> None:
        self.stats = {m: ModelStats() for m in self.models}

    def complete(self, samples: list[Sample], outputs: dict[str, tuple[bytes, int]]) -> None:
        """``outputs``: name -> (the batch's raw bytes, bytes per row); row i belongs to ``samples[i]``. A call is
        answered when its last row is in."""
        for i, s in enumerate(samples):
            call = s.call
            if call.future.done():
                continue
            call.rows[s.row] = row_of(outputs, i)
            call.left -= 1
            if call.left == 0:
                self.answer(call)

    def answer(self, call: ClientCall) -> None:
        t = now_us()
        if call.internal:
            self._counted(call, t)
            call.future.set_result({o.spec.name: np.frombuffer(_joined(call.rows, o.spec.name), triton_to_np_dtype(
                o.spec.datatype)).reshape(len(call.rows), *o.spec.shape) for o in call.checked.outputs})
            return
        if call.raw:  # its outputs are never in client shared memory: Triton's front end owns that
            self._counted(call, t)
            call.future.set_result(RawAnswer(tuple(
                (o.spec.name, o.spec.datatype, (len(call.rows), *o.spec.shape), _joined(call.rows, o.spec.name))
                for o in call.checked.outputs), ((SIDECAR_LATENCY_PARAMETER, int(t - call.arrival_us)),)))
            self._traced(call, t)
            return
        resp = service_pb2.ModelInferResponse(model_name=call.model.name, model_version="1", id=call.request_id)
        resp.parameters[SIDECAR_LATENCY_PARAMETER].int64_param = int(t - call.arrival_us)
        try:
            for target in call.checked.outputs:
                data = _joined(call.rows, target.spec.name)
                resp.outputs.add(name=target.spec.name, datatype=target.spec.datatype,
                                 shape=[len(call.rows), *target.spec.shape])
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
        self._traced(call, t)

    def _traced(self, call: ClientCall, t: float) -> None:
        if call.trace is not None and self.tracer is not None:
            self.tracer.finish(call.trace, t)

    def _counted(self, call: ClientCall, t: float) -> None:
        self.stats[call.model.name].succeeded(call.arrival_us, call.marks, t, call.checked.batch)
        self.metrics.finished(call.model.name, t <= call.deadline_us)

    def fail(self, call: ClientCall, error: ServeError, reason: str | None = None) -> None:
        """Answer ``call`` with ``error``; ``reason`` is Triton's failure reason (default: from the error's code)."""
        if not call.future.done():
            call.future.set_exception(error)
            self.stats[call.model.name].failed(call.arrival_us, now_us(), reason or failure_reason(error))
            self.metrics.finished(call.model.name, False)
            if call.trace is not None and self.tracer is not None:
                self.tracer.finish(call.trace, now_us(), error.message)

    def statistics(self, model: str) -> service_pb2.ModelStatistics:
        return self.stats[model].to_proto(model)


def _joined(rows: list[dict[str, bytes] | None], name: str) -> bytes:
    """A call's output ``name``: its rows' bytes back to back."""
    return rows[0][name] if len(rows) == 1 else b"".join(r[name] for r in rows)  # type: ignore[index]


def failure_reason(error: ServeError) -> str:
    """Triton's reason label for a failed request: shed (UNAVAILABLE) is REJECTED, a broken server BACKEND."""
    return {grpc.StatusCode.UNAVAILABLE: "REJECTED", grpc.StatusCode.CANCELLED: "CANCELED",
            grpc.StatusCode.INTERNAL: "BACKEND", grpc.StatusCode.DEADLINE_EXCEEDED: "BACKEND"}.get(error.code, "OTHER")


def shutting_down() -> ServeError:
    return ServeError(grpc.StatusCode.UNAVAILABLE, "the sidecar is shutting down")
