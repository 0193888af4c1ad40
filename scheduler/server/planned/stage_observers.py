"""What a measured stage call feeds besides the driver: one ``StageObserver`` sink that the executor hands each
``StageRecord`` to, and the observers hung off it (metrics, the overhead meter, the learned lead, the batch log,
the KServe statistics' marks, tracing), each keeping its own books, in that order."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from model_repository_gen.manifest import PipelineInfo
from scheduler.core.api import Dispatch, RequestRow, StageAssignment
from scheduler.server.common.metrics import SidecarMetrics
from scheduler.server.common.tracing import DispatchTraces
from scheduler.server.planned.calls import Answers
from scheduler.server.planned.overhead_meter import OverheadMeter
from scheduler.server.planned.stage_io import StageTiming

log = logging.getLogger("poolpipe.sidecar.executor")


@dataclass(frozen=True)
class StageRecord:
    """One measured stage of a dispatch."""

    dispatch: Dispatch
    assignment: StageAssignment  # the reservation it ran at (the dispatched one, or the one the policy moved)
    live: list[RequestRow]  # the rows it ran for
    timing: StageTiming
    idle: bool  # sent to an idle server (its send-to-compute shows the real lead, not the server's queue)
    first: StageTiming | None  # this dispatch's stage 0 timing, when it ran it
    traces: DispatchTraces | None  # the traced calls riding it
    hop: str | None  # how its input came from the previous stage (shm, http, grpc; None for the first)

    @property
    def stage(self) -> int:
        """The pipeline's stage index."""
        return self.assignment.stage

    @property
    def vgpu(self) -> str:
        return self.assignment.vgpu

    @property
    def batch(self) -> int:
        return len(self.live)


class StageObserver(Protocol):
    def stage_done(self, r: StageRecord) -> None: ...


class StageObservers:
    """The one sink the executor feeds: hands each record to every observer, in order."""

    def __init__(self, observers: Sequence[StageObserver]) -> None:
        self.observers = list(observers)

    def stage_done(self, r: StageRecord) -> None:
        for o in self.observers:
            o.stage_done(r)


class StageMetrics:
    """The vGPUs' busy seconds (and, at debug level, one log line per stage against its reservation)."""

    def __init__(self, metrics: SidecarMetrics) -> None:
        self.metrics = metrics

    def stage_done(self, r: StageRecord) -> None:
        t = r.timing
        self.metrics.child(self.metrics.vgpu_busy, r.vgpu).inc(max(t.end_us - t.start_us, 0.0) / 1e6)
        if log.isEnabledFor(logging.DEBUG):
            d, a = r.dispatch, r.assignment
            log.debug("event=stage dispatch=%d stage=%d vgpu=%s batch=%d planned_us=%.0f-%.0f measured_us=%.0f-%.0f "
                      "send_to_compute=%.0f compute_to_recv=%.0f", d.id, r.stage, r.vgpu, r.batch, a.start_us,
                      a.end_us, t.start_us, t.end_us, t.start_us - t.send_us, t.recv_us - t.end_us)


class MeterObserver:
    """The overhead meter's per-stage samples (tail, slowdown against the profile, the learned lead)."""

    def __init__(self, meter: OverheadMeter, pipelines: dict[str, PipelineInfo]) -> None:
        self.meter = meter
        self.pipelines = pipelines
        self.free_us: dict[str, float] = {}  # each vGPU's last compute end: a call sent before it waited for it

    def stage_done(self, r: StageRecord) -> None:
        t = r.timing
        planned = self.pipelines[r.dispatch.pipeline_id].stages[r.stage].latency_us.get(r.batch, 0.0)
        self.meter.stage(planned, t.start_us, t.end_us, t.recv_us)
        # its lead as the simulator counts it: from when it was sent, or its vGPU came free, to its compute start
        lead = t.start_us - max(t.send_us, self.free_us.get(r.vgpu, t.send_us))
        self.free_us[r.vgpu] = max(t.end_us, self.free_us.get(r.vgpu, 0.0))
        self.meter.call((r.dispatch.pipeline_id, r.stage, r.batch), lead, t.recv_us - t.end_us)


class StatisticsMarks:
    """The KServe statistics' marks: stage 0 ends the requests' queueing, the last stage their compute; a dispatch
    that ran both (``first``: its stage 0's timing) is one execution at its batch size."""

    def __init__(self, answers: Answers, pipelines: dict[str, PipelineInfo]) -> None:
        self.answers = answers
        self.pipelines = pipelines

    def stage_done(self, r: StageRecord) -> None:
        t, d = r.timing, r.dispatch
        if r.stage == 0:
            for row in r.live:
                row.call.marks.first_stage(t.ready_us, t.start_us)
        if r.stage == len(self.pipelines[d.pipeline_id].stages) - 1:
            for row in r.live:
                row.call.marks.last_stage(t.end_us)
            if r.first is not None:
                self.answers.stats[d.model].executed(r.batch, r.first.ready_us, r.first.start_us, t.end_us, t.recv_us)


class TraceObserver:
    """Each stage into the traced calls' spans (when tracing is on)."""

    def __init__(self, pipelines: dict[str, PipelineInfo], server_url: Callable[[str], str]) -> None:
        self.pipelines = pipelines
        self.server_url = server_url  # vGPU -> its tritonserver's gRPC address

    def stage_done(self, r: StageRecord) -> None:
        if r.traces is not None:
            stage_info = self.pipelines[r.dispatch.pipeline_id].stages[r.stage]
            r.traces.stage(r.stage, stage_info.triton_model, r.vgpu, self.server_url(r.vgpu), r.hop, r.timing)


def stage_sink(metrics: SidecarMetrics, meter: OverheadMeter, leads: StageObserver, batch_log: StageObserver | None,
               answers: Answers, pipelines: dict[str, PipelineInfo], server_url: Callable[[str], str],
               *more: StageObserver) -> StageObservers:
    """The planned service's sink, in the order the books depend on: the meter samples the learned lead before a
    stage can move it; the statistics' marks are in before the driver answers the calls."""
    return StageObservers([StageMetrics(metrics), MeterObserver(meter, pipelines), leads,
                           *([batch_log] if batch_log is not None else []), StatisticsMarks(answers, pipelines),
                           TraceObserver(pipelines, server_url), *more])
