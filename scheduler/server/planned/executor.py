"""The live executor: runs the core's dispatches on real Triton servers (the simulator's twin is
scheduler.sim.virtual).

A dispatched batch stacks its rows' inputs, runs each stage on the chosen vGPU's tritonserver (sent
ahead of its reserved compute start by the stage's calibrated lead time), hands the boundary tensors to
the next stage through a shared-memory region of the machine's pool when both servers share it (else as
gRPC bytes through the sidecar), and hands the last stage's outputs back. Measured compute intervals,
outputs and failures go back to the shared driver, one StageOutcome per stage through the report it gave with
the dispatch; its answer says what follows (the next stage and its assignment, or the end), and the driver, not
the executor, answers the calls (scheduler.server.planned.calls.PlannedCallers).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import grpc

from model_repository_gen.manifest import ModelInfo, PipelineInfo, StageInfo
from model_repository_gen.triton_config import COMPUTE_END_OUTPUT, COMPUTE_START_OUTPUT
from scheduler.core.api import Dispatch, RequestRow
from scheduler.core.driver import EARLY_SEND_US, Action, NextStep, Report, StageOutcome
from scheduler.server.common.errors import ServeError
from scheduler.server.common.metrics import SidecarMetrics
from scheduler.server.common.tracing import DispatchTraces, Tracer
from scheduler.server.planned.calls import Answers, now_us, shutting_down, waits
from scheduler.server.planned.fleet import Fleet
from scheduler.server.planned.lead import Leads
from scheduler.server.planned.shm_pool import Region
from scheduler.server.planned.stage_http import StageCallError
from scheduler.server.planned.stage_io import (
    HopTensor,
    StageFault,
    StageTiming,
    stacked,
    wall_ns_to_mono_us,
)
from scheduler.server.planned.stage_observers import StageObserver, StageRecord
from scheduler.server.planned.stage_parameters import Value, stage_parameters
from scheduler.server.planned.vgpu_occupancy import VgpuOccupancy

log = logging.getLogger("poolpipe.sidecar.executor")

# Codes that say "this request is wrong", not "this server is broken": the batch fails, the server stays.
CLIENT_FAULTS = (grpc.StatusCode.INVALID_ARGUMENT,)


async def _until_all_gone(rows: list[RequestRow], timeout_s: float) -> None:
    """Sleep ``timeout_s``, or less if every caller of ``rows`` goes away meanwhile."""
    futures = {id(r.call.future): r.call.future for r in rows}
    await asyncio.wait(list(futures.values()), timeout=timeout_s)


class LiveExecutor:
    """The Executor of the shared driver on the event loop; it holds no driver.

    ``kick`` wakes the planned service's scheduler loop when something changed (a batch finished or failed);
    ``leads`` says how far ahead of its reservation to send a stage; each measured stage goes to ``observer``
    (scheduler/server/planned/stage_observers.py), which also learns the leads. The vGPU occupancy is asked, not
    told: what a stage held its vGPU for is part of the outcome the driver hears."""

    def __init__(self, fleet: Fleet, models: dict[str, ModelInfo], pipelines: dict[str, PipelineInfo],
                 answers: Answers, metrics: SidecarMetrics, kick: Callable[[], None], leads: Leads,
                 observer: StageObserver, padded: frozenset[str] = frozenset(), tracer: Tracer | None = None) -> None:
        self.fleet = fleet
        self.padded = padded  # models whose first-stage batches are padded to the planned batch (dummy requests)
        self.tracer = tracer or Tracer()  # records each stage into the traced calls' spans (when tracing is on)
        self.models = models
        self.pipelines = pipelines
        self.answers = answers
        self.metrics = metrics
        self.kick = kick
        self.leads = leads  # each stage's send-to-compute lead, calibrated and learned under load
        self.observer = observer  # what each measured stage feeds (metrics, meter, leads, batch log, marks, traces)
        self.occupancy = VgpuOccupancy()  # what a stage holds its vGPU for: compute and the server's turnaround
        self.tasks: set[asyncio.Task] = set()

    # -- the Executor protocol ------------------------------------------------------------------------------
    def execute(self, dispatch: Dispatch, rows: list[RequestRow], report: Report) -> None:
        task = asyncio.ensure_future(self._run(dispatch, rows, report))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    # -- one dispatch ---------------------------------------------------------------------------------------
    def _lead(self, pipeline_id: str, stage: int, batch: int) -> float:
        return self.leads.lead_us(pipeline_id, stage, batch)

    def _inputs(self, d: Dispatch, live: list[RequestRow]) -> list[HopTensor]:
        """The batch's input: the model's inputs for stage 0, else what the previous dispatch carried; each
        tensor's rows joined as bytes, the padded model's dummy rows as zero bytes."""
        first = d.stages[0].stage
        pipe = self.pipelines[d.pipeline_id]
        if first == 0:
            pad = max(0, pipe.batch - len(live)) if d.model in self.padded else 0
            return [HopTensor(t, [len(live) + pad, *t.shape], stacked(
                [r.call.inputs[t.name][r.index] for r in live], pad * t.bytes_per_request()))
                    for t in self.models[d.model].inputs]
        return [HopTensor(t, [len(live), *t.shape], stacked([r.carry[t.name] for r in live]))
                for t in pipe.stages[first].inputs]

    async def _run(self, d: Dispatch, rows: list[RequestRow], report: Report) -> None:
        """Run the dispatch's stages, each reported to the driver, as long as it answers NEXT_STAGE (with the
        assignment to run the next one at); the last stage's report carries the outputs."""
        live = [r for r in rows if waits(r)]
        if not live:
            report(StageOutcome(d, 0, now_us(), gave_up=True))
            return
        pipe = self.pipelines[d.pipeline_id]
        self.metrics.child(self.metrics.batch_size, d.model).observe(len(live))
        self.answers.stats[d.model].executions += 1
        hops: list[HopTensor] = []
        k, step, a = 0, NextStep(Action.STOP), d.stages[0]
        first: StageTiming | None = None  # stage 0's timing in this dispatch (the batch statistics)
        traces = DispatchTraces.of([r.call for r in live], d.id, d.pipeline_id, now_us()) if self.tracer.on else None
        try:
            hops = self._inputs(d, live)
            params = stage_parameters([r.call.parameters for r in live], hops[0].shape[0] - len(live) if hops else 0)
            deadline_us = max(r.call.deadline_us for r in live)
            for k in range(len(d.stages)):
                if d.reserved:  # send ahead of the reserved compute start by the stage's lead time
                    wait_us = a.start_us - self._lead(d.pipeline_id, a.stage, len(live)) - now_us()
                    if wait_us >= EARLY_SEND_US:
                        await _until_all_gone(live, wait_us / 1e6)
                if not any(waits(r) for r in live):  # every caller went away before this stage was sent
                    step = report(StageOutcome(d, k, now_us(), gave_up=True))  # its reservations go back
                    break
                following = d.stages[k + 1] if k + 1 < len(d.stages) else None  # this dispatch's next stage
                hop = (None if a.stage == 0 or not hops else "shm" if hops[0].region is not None
                       else self.fleet.stage_protocol)
                if hop is not None:
                    self.metrics.child(self.metrics.hops, hop).inc()
                hops, timing = await self.run_stage(a.vgpu, pipe.stages[a.stage], hops,
                                                    following.vgpu if following else None, deadline_us,
                                                    f"{d.id}.{a.stage}",
                                                    traces.call_context(a.stage) if traces is not None else None,
                                                    params)
                held = None
                if timing is not None:
                    idle = self.occupancy.measured(a.vgpu, timing.send_us, timing.start_us, timing.end_us)
                    held = self.occupancy.held(a.vgpu, *timing.compute_us)
                    first = timing if a.stage == 0 else first
                    record = StageRecord(d, a, live, timing, idle, first, traces, hop)
                    if following is not None:  # after the next stage's call is written: off the request's path
                        asyncio.get_running_loop().call_soon(self.observer.stage_done, record)
                    else:  # before the answers, whose statistics read the marks
                        self.observer.stage_done(record)
                if following is None:
                    outputs = {h.spec.name: (h.data, h.spec.bytes_per_request()) for h in hops}
                    step = report(StageOutcome(d, k, now_us(), held, wanted=live, outputs=outputs))
                    break
                nxt_lead = self._lead(d.pipeline_id, following.stage, len(live))
                step = report(StageOutcome(d, k, now_us(), held, wanted=live, next_lead_us=nxt_lead))
                if step.action is not Action.NEXT_STAGE:
                    break
                a = step.next or following
        except StageFault as f:
            self.release(hops)
            self._on_fault(report, d, k, f, live)
            return
        except asyncio.CancelledError:  # close(): its calls get an explicit error, never silence
            self.release(hops)
            report(StageOutcome(d, k, now_us(), gave_up=True, wanted=live, error=shutting_down()))
            raise
        except Exception as e:  # noqa: BLE001 - never leave a client waiting on a bug: answer, log, go on
            log.exception("event=dispatch_failed dispatch=%d", d.id)
            self.release(hops)
            report(StageOutcome(d, k, now_us(), gave_up=True, wanted=live,
                                error=ServeError(grpc.StatusCode.INTERNAL, f"dispatch {d.id} failed: {e}")))
            return
        if step.action is not Action.FINISH:
            self.release(hops)
        self.kick()

    def _on_fault(self, report: Report, d: Dispatch, k: int, fault: StageFault, live: list[RequestRow]) -> None:
        code = fault.code
        # A server restarted between health checks has lost our shm registrations: treat it as down; the
        # health loop registers the pool again when it rejoins.
        lost_shm = "shared memory" in (fault.details or "")
        if (code in CLIENT_FAULTS and not lost_shm) or code == grpc.StatusCode.DEADLINE_EXCEEDED:
            # The request is wrong, or the server answered too slowly (overload, not down: the call's
            # timeout is the deadline plus a second): fail the batch, keep the vGPU.
            err = (ServeError(grpc.StatusCode.DEADLINE_EXCEEDED, f"request failed: stage on vGPU {fault.vgpu} ran "
                                                                 "past the request's deadline (server overloaded)")
                   if code == grpc.StatusCode.DEADLINE_EXCEEDED else
                   ServeError(grpc.StatusCode.INTERNAL, f"stage {fault.vgpu} of pipeline {d.pipeline_id} rejected "
                                                        f"the batch: {fault.details}"))
            report(StageOutcome(d, k, now_us(), gave_up=True, wanted=live, error=err))
            return
        self.fleet.set_up(self.fleet.servers[fault.vgpu], False, f"{code.name}: {fault.details}")
        retried = report(StageOutcome(d, k, now_us(), failed=f"Triton server of vGPU {fault.vgpu} failed ({code.name})",
                                      wanted=live)).retried
        if retried:
            self.metrics.retries.labels(d.model).inc(retried)
        log.warning("event=batch_retry dispatch=%d pipeline=%s vgpu=%s retried=%d of=%d", d.id, d.pipeline_id,
                    fault.vgpu, retried, len(live))
        self.kick()

    # -- one stage ------------------------------------------------------------------------------------------
    async def run_stage(self, vgpu: str, stage: StageInfo, inputs: list[HopTensor], next_vgpu: str | None,
                        deadline_us: float, request_id: str, traceparent: str | None = None,
                        parameters: dict[str, Value] | None = None) -> tuple[list[HopTensor], StageTiming | None]:
        """Run one stage on ``vgpu``; its outputs go to a shared-memory region when ``next_vgpu`` shares the
        machine's pool; ``traceparent``: the W3C trace context the call carries (traced batches); ``parameters``:
        its rows' request parameters (stage_parameters.py). Returns the outputs and the stage's timing (None if the
        server sent no timestamps)."""
        t_ready = now_us()
        srv = self.fleet.servers[vgpu]
        batch = inputs[0].shape[0]
        out_region = None
        if next_vgpu is not None and self.fleet.shares_pool(vgpu, next_vgpu):
            out_region = await self.fleet.take_region(srv.host)
        timeout = max(deadline_us - now_us(), 0.0) / 1e6 + 1.0
        t_send = now_us()
        try:
            raw, offsets = await srv.stage.call(stage, inputs, out_region, batch, request_id, timeout, traceparent,
                                                parameters)
            t_recv = now_us()
        except StageCallError as e:
            if out_region is not None:
                self.fleet.give_region(out_region)
            raise StageFault(vgpu, e.code, e.details) from None
        self.release(inputs)
        outputs = self._outputs(stage, raw, batch, out_region, offsets)
        start, end = raw.get(COMPUTE_START_OUTPUT), raw.get(COMPUTE_END_OUTPUT)
        if start is None or end is None:
            return outputs, None
        s_us = wall_ns_to_mono_us(float(min(memoryview(start[1]).cast("q"))))  # INT64, one per row
        e_us = wall_ns_to_mono_us(float(max(memoryview(end[1]).cast("q"))))
        return outputs, StageTiming(t_ready, t_send, s_us, e_us, t_recv)

    def _outputs(self, stage: StageInfo, raw: dict[str, tuple[list[int], bytes]], batch: int,
                 out_region: Region | None, offsets: dict[str, int]) -> list[HopTensor]:
        out = []
        for spec in stage.outputs:
            shape = raw[spec.name][0] if spec.name in raw else [batch, *spec.shape]
            if out_region is not None:
                out.append(HopTensor(spec, shape, region=out_region, offset=offsets[spec.name]))
            else:
                out.append(HopTensor(spec, shape, raw[spec.name][1]))
        if out_region is not None and not out:
            self.fleet.give_region(out_region)
        return out

    def release(self, hops: list[HopTensor]) -> None:
        seen = set()
        for h in hops:
            if h.region is not None and h.region.name not in seen:
                seen.add(h.region.name)
                self.fleet.give_region(h.region)

    async def close(self) -> None:
        for t in list(self.tasks):
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
