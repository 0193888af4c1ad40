"""Client calls on the planned path: one call's rows ride batches; their outputs are gathered and the call
is answered (outputs, or an explicit error) exactly once; per-model statistics as Triton reports them."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import grpc
import numpy as np
from tritonclient.grpc import service_pb2
from tritonclient.utils import triton_to_np_dtype

from model_repository_gen.manifest import ModelInfo
from poolpipe_common.batcher import QUEUE_FULL, QUEUE_TIMEOUT
from poolpipe_common.overheads import SIDECAR_LATENCY_PARAMETER, sidecar_slo_us
from poolpipe_common.tensors import TensorSpec
from scheduler.core.api import Dispatch, RequestRow
from scheduler.core.policies.retired import POLICY_FAILED
from scheduler.server.common.client_shm import ClientShmRegistry
from scheduler.server.common.errors import ServeError, shed
from scheduler.server.common.metrics import SidecarMetrics
from scheduler.server.common.model_stats import ModelStats, RequestMarks
from scheduler.server.common.tracing import CallTrace, Tracer
from scheduler.server.common.wire import RawAnswer
from scheduler.server.planned.stage_io import row_of


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


@dataclass(frozen=True)
class OutputTarget:
    """A requested output: returned raw, or written to a client shm region at ``offset``."""

    spec: TensorSpec
    region: str | None = None
    offset: int = 0
    byte_size: int = 0


@dataclass(eq=False)
class ClientCall:
    """One client request on the planned path, from its check (scheduler/server/planned/validate.py) to its answer:
    its inputs and wanted outputs as checked, its terms, and its answer's future; its rows (each a ``RequestRow``,
    scheduler/core/api.py, whose ``call`` it is) may ride different batches."""

    model: ModelInfo
    request_id: str  # the client's request id, echoed in the answer
    batch: int  # its rows
    inputs: dict[str, np.ndarray]  # name -> [batch, *shape], read-only (the request's bytes, or a copy of shm)
    outputs: tuple[OutputTarget, ...]
    timeout_us: float | None = None  # the client's "timeout" parameter, if any
    priority: int = 0  # the client's "priority" parameter (0: the model's default level)
    arrival_us: float = 0.0
    deadline_us: float = math.inf
    future: asyncio.Future = field(default=None)  # type: ignore[assignment]  # set when it is submitted
    internal: bool = False  # an application module's request: answered with its output arrays, not a response
    raw: bool = False  # a DecodedRequest (the native front end): answered with a RawAnswer, not a response
    marks: RequestMarks = field(default_factory=RequestMarks)  # measured by the executor, for the statistics
    trace: CallTrace | None = None  # its spans, when the request is sampled for tracing
    parameters: dict | None = None  # its own request parameters, for its stage calls (stage_parameters.py)
    rows: list[dict[str, bytes] | None] = field(init=False)  # each row's outputs, raw bytes
    left: int = field(init=False)  # rows not answered yet

    def __post_init__(self) -> None:
        self.rows = [None] * self.batch
        self.left = self.batch


def waits(row: RequestRow) -> bool:
    """Whether the caller of ``row`` (its ``ClientCall``) still waits for the answer."""
    return not row.call.future.done()


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

    def complete(self, rows: Sequence[RequestRow], outputs: dict[str, tuple[bytes, int]]) -> None:
        """``outputs``: name -> (the batch's raw bytes, bytes per row); row i belongs to ``rows[i]``. A call is
        answered when its last row is in."""
        for i, r in enumerate(rows):
            call: ClientCall = r.call
            if call.future.done():
                continue
            call.rows[r.index] = row_of(outputs, i)
            call.left -= 1
            if call.left == 0:
                self.answer(call)

    def answer(self, call: ClientCall) -> None:
        t = now_us()
        if call.internal:
            self._counted(call, t)
            call.future.set_result({o.spec.name: np.frombuffer(_joined(call.rows, o.spec.name), triton_to_np_dtype(
                o.spec.datatype)).reshape(len(call.rows), *o.spec.shape) for o in call.outputs})
            return
        if call.raw:  # its outputs are never in client shared memory: Triton's front end owns that
            self._counted(call, t)
            call.future.set_result(RawAnswer(tuple(
                (o.spec.name, o.spec.datatype, (len(call.rows), *o.spec.shape), _joined(call.rows, o.spec.name))
                for o in call.outputs), ((SIDECAR_LATENCY_PARAMETER, int(t - call.arrival_us)),)))
            self._traced(call, t)
            return
        resp = service_pb2.ModelInferResponse(model_name=call.model.name, model_version="1", id=call.request_id)
        resp.parameters[SIDECAR_LATENCY_PARAMETER].int64_param = int(t - call.arrival_us)
        try:
            for target in call.outputs:
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
        self.stats[call.model.name].succeeded(call.arrival_us, call.marks, t, call.batch)
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


class PlannedCallers:
    """The shared driver's Callers on the sidecar: it answers the client calls of the rows it is handed (each row's
    ``call``), through ``Answers``, when a dispatch completes, the core sheds a row or a batch cannot run."""

    def __init__(self, answers: Answers, metrics: SidecarMetrics) -> None:
        self.answers = answers
        self.metrics = metrics

    def finish(self, dispatch: Dispatch, rows: Sequence[RequestRow], outputs: dict[str, tuple[bytes, int]],
               now_us: float) -> None:
        """A completed dispatch's outputs: its calls' answers (a final dispatch), else the next dispatch's input
        (each row carries its bytes)."""
        if dispatch.final:
            self.answers.complete(rows, outputs)
        else:
            for i, r in enumerate(rows):
                r.carry = row_of(outputs, i)

    def reject(self, row: RequestRow, reason: str, *, failure: bool = False) -> None:
        call, model = row.call, row.model
        if reason == POLICY_FAILED:  # a retry that a retired driver refused (PlannedService._step_failed)
            self.answers.fail(call, ServeError(grpc.StatusCode.INTERNAL, f"request failed: {reason}"), "BACKEND")
        elif failure:
            self.answers.fail(call, ServeError(grpc.StatusCode.UNAVAILABLE, f"request failed: {reason}"), "BACKEND")
        elif reason in (QUEUE_FULL, QUEUE_TIMEOUT):  # the queue policy's refusals, in Triton's words
            self.metrics.child(self.metrics.drops, model, reason).inc()
            self.answers.fail(call, ServeError(grpc.StatusCode.UNAVAILABLE, reason), "REJECTED")
        else:
            self.metrics.child(self.metrics.drops, model, reason).inc()
            self.answers.fail(call, shed(model, reason))

    def fail(self, dispatch: Dispatch, rows: Sequence[RequestRow], error: ServeError) -> None:
        for r in rows:
            self.answers.fail(r.call, error)


def _joined(rows: list[dict[str, bytes] | None], name: str) -> bytes:
    """A call's output ``name``: its rows' bytes back to back."""
    return rows[0][name] if len(rows) == 1 else b"".join(r[name] for r in rows)  # type: ignore[index]


def failure_reason(error: ServeError) -> str:
    """Triton's reason label for a failed request: shed (UNAVAILABLE) is REJECTED, a broken server BACKEND."""
    return {grpc.StatusCode.UNAVAILABLE: "REJECTED", grpc.StatusCode.CANCELLED: "CANCELED",
            grpc.StatusCode.INTERNAL: "BACKEND", grpc.StatusCode.DEADLINE_EXCEEDED: "BACKEND"}.get(error.code, "OTHER")


def shutting_down() -> ServeError:
    return ServeError(grpc.StatusCode.UNAVAILABLE, "the sidecar is shutting down")
