"""The planned service: every model of one manifest behind the Router (KServe infer, ready, metadata, config,
statistics), served by the shared driver loop (scheduler.core.driver) on the event loop's clock with the
live executor. It owns the life cycle: connect the fleet, calibrate, step the driver, shut down cleanly."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from tritonclient.grpc import service_pb2

from model_repository_gen.app_manifest import padded_models
from model_repository_gen.manifest import Manifest, load_manifest
from plans.plan_costs import front_reserve_us
from poolpipe_common.errors import InputError
from scheduler.core import make_scheduler
from scheduler.core.driver import Driver, DriverConfig
from scheduler.server.common.client_shm import ClientShmRegistry
from scheduler.server.common.errors import ServeError
from scheduler.server.common.loop_busy import LoopBusy, StallLog
from scheduler.server.common.metrics import SidecarMetrics
from scheduler.server.common.tracing import Tracer
from scheduler.server.common.triton_metrics import triton_exposition
from scheduler.server.common.wire import InferRequest
from scheduler.server.planned.applications import Applications
from scheduler.server.planned.batch_log import BatchLog
from scheduler.server.planned.calibration import (
    NotCalibratable,
    StageOverheads,
    calibrate_pipeline,
    no_slack_warning,
    recalibrate_vgpu,
)
from scheduler.server.planned.call_costs import CallCosts, call_bytes_of
from scheduler.server.planned.calls import (
    Answers,
    ClientCall,
    OutputTarget,
    PlannedCallers,
    now_us,
    request_deadline_us,
    shutting_down,
)
from scheduler.server.planned.executor import LiveExecutor
from scheduler.server.planned.fleet import Fleet, VGpuServer
from scheduler.server.planned.kserve_model import model_config, model_metadata
from scheduler.server.planned.lead import Leads
from scheduler.server.planned.manifest_shard import manifest_shard
from scheduler.server.planned.manifest_topology import topology_from_manifest
from scheduler.server.planned.overhead_meter import OverheadMeter
from scheduler.server.planned.promise_check import PromiseCheck, shard_shares
from scheduler.server.planned.shm_pool import log_reclaimed, remove_stale_regions
from scheduler.server.planned.stage_io import StageFault
from scheduler.server.planned.stage_observers import stage_sink
from scheduler.server.planned.validate import check

log = logging.getLogger("poolpipe.sidecar.planned")

DEFAULT_POLICY = "ppipe"
LIVE_POLICIES = ("ppipe", "fifs", "elsa", "reactive", "orloj")


class PlannedService:
    """The planned service of one plan: every model of one manifest, as the Router sees them (submit, ready,
    metadata, config, statistics); a reload opens the next plan's beside it (scheduler/server/control/reload.py)."""

    def __init__(self, manifest: Manifest, policy: str, metrics: SidecarMetrics, client_shm: ClientShmRegistry,
                 batch_log: Path | None = None, overheads_out: Path | None = None, generation: int = 0,
                 tracer: Tracer | None = None, front_us: float = 0.0, stage_protocol: str = "http") -> None:
        self.manifest = manifest
        self.front_us = front_us  # the way outside the sidecar's clock: deadlines come that much before the SLO
        self.policy = DEFAULT_POLICY if policy == "auto" else policy
        if self.policy not in LIVE_POLICIES:
            raise InputError(f"--policy {policy}: choose one of {', '.join(('auto',) + LIVE_POLICIES)}")
        self.metrics = metrics
        apps = [a.name for a in manifest.applications]
        metrics.declare([m.name for m in manifest.models] + apps, [v.id for v in manifest.vgpus])
        self.models = {m.name: m for m in manifest.models}
        self.pipelines = {p.id: p for m in manifest.models for p in m.pipelines}
        self.client_shm = client_shm  # the regions clients registered with the sidecar (the front end's registry)
        self.tracer = tracer or Tracer()
        self.answers = Answers(metrics, list(self.models) + apps, client_shm, tracer=self.tracer)
        self.callers = PlannedCallers(self.answers, metrics)  # whom the driver answers
        self.apps = Applications(manifest.applications, self.answers, self.run_module, front_us)
        self._kick = asyncio.Event()
        self.fleet = Fleet(manifest, self._vgpu_changed, generation, stage_protocol)
        self.meter = OverheadMeter(front_us=front_us)
        self.leads = Leads(self._lead_learned)
        self.batch_log = BatchLog(batch_log) if batch_log else None
        self.call_costs = CallCosts(call_bytes_of(manifest))  # by size, for poolpipe calibrate
        sink = stage_sink(metrics, self.meter, self.leads, self.batch_log, self.answers, self.pipelines,
                          lambda v: self.fleet.servers[v].grpc_url, self.call_costs)
        self.executor = LiveExecutor(self.fleet, self.models, self.pipelines, self.answers, metrics, self._kick_loop,
                                     self.leads, sink, padded_models(manifest.applications), self.tracer)
        self.overheads_out = overheads_out
        self.promise = PromiseCheck(manifest.plan, self.meter, self.answers.stats, metrics, overheads_out,
                                    shard_shares(manifest))
        self._promise_task: asyncio.Task | None = None
        self.overheads: dict[str, StageOverheads] = {}  # pipeline id -> calibrated lead/tail
        self.driver = self._new_driver()
        self._wake_us: float | None = None
        self._loop_task: asyncio.Task | None = None
        self._calibrating: asyncio.Task | None = None
        self._stopped = False  # set once the driver is no longer stepped (stop_dispatching, close)
        self._closing = False
        self._logged_lead_us = 0.0  # the learned lead last logged
        self._step_waiters: list[asyncio.Future] = []

    # --- life cycle ----------------------------------------------------------------------------------------
    @classmethod
    async def create(cls, manifest_path: Path, policy: str, metrics: SidecarMetrics, client_shm: ClientShmRegistry,
                     batch_log: Path | None = None, overheads_out: Path | None = None, shard: tuple[int, int] = (0, 1),
                     generation: int = 0, tracer: Tracer | None = None, front_us: float | None = None,
                     stage_protocol: str = "http") -> "PlannedService":
        """``front_us`` None: the reserve this plan was made with (so a reload brings the new plan's)."""
        manifest = load_manifest(manifest_path)
        self = cls(manifest_shard(manifest, *shard), policy, metrics, client_shm, batch_log, overheads_out, generation,
                   tracer, front_reserve_us(manifest.plan) if front_us is None else front_us, stage_protocol)
        removed = remove_stale_regions()
        await self.fleet.connect()
        log_reclaimed(removed, self.fleet.reclaimed)
        for srv in self.fleet.servers.values():
            metrics.vgpu_up.labels(srv.id).set(1 if srv.up else 0)
        await self._calibrate(None)
        self._loop_task = asyncio.ensure_future(self._scheduler_loop())
        self._promise_task = await self.promise.start()
        self.fleet.start_health()
        return self

    def _new_driver(self) -> Driver:
        """A driver over the topology with the calibrated tails; the core's clock leads by the least
        first-stage lead once every pipeline is calibrated (one clock for every model)."""
        topology = topology_from_manifest(self.manifest, {p: o.tail_us for p, o in self.overheads.items()})
        calibrated = self.overheads and len(self.overheads) == len(self.pipelines)
        lead = min(min(o.lead_us[0].values(), default=0.0) for o in self.overheads.values()) if calibrated else 0.0
        drv = Driver(make_scheduler(self.policy, topology), topology, self.executor,
                     DriverConfig.live(clock_lead_us=lead, front_us=self.front_us), callers=self.callers)
        for srv in self.fleet.servers.values():
            if not srv.up:
                drv.set_vgpu_up(srv.id, False, now_us())
        drv.extra_lead_us = self.leads.extra_us
        self.leads.calibrated = {p: o.lead_us for p, o in self.overheads.items()}
        return drv

    async def _calibrate(self, rejoined: str | None) -> None:
        """Calibrate the pipelines not calibrated yet (and, when ``rejoined`` names a vGPU, those it serves);
        a newly calibrated pipeline gets a new driver, which takes over the old one's queue."""
        todo = [p for p in self.pipelines.values()
                if p.id not in self.overheads or (rejoined and any(rejoined in s.vgpus for s in p.stages))]
        new = False
        for p in todo:
            try:
                before = self.overheads.get(p.id)
                o = (await recalibrate_vgpu(self.executor, p, rejoined, before) if rejoined and before else
                     await calibrate_pipeline(self.executor, p, self.models[p.id.rsplit("/", 1)[0]], rejoined))
            except (NotCalibratable, StageFault) as e:
                log.warning("event=calibration_skipped pipeline=%s reason=%s", p.id, e)
                continue
            log.info("event=calibrated pipeline=%s rejoined=%s", p.id, rejoined or "-")
            topo, pipe = self.driver.topology, self.driver.topology.pipeline(p.id)
            if p.id not in self.overheads and (warning := no_slack_warning(
                    p, topo.slo_us[pipe.model], o, self.front_us, topo.transfers_us(pipe))):
                log.warning("event=no_slack %s", warning)
            new = new or p.id not in self.overheads
            self.overheads[p.id] = o
            for lead in o.lead_us:
                self.meter.calibrated(lead[max(lead)])
            for k, (lead, tail) in enumerate(zip(o.lead_us, o.tail_us)):
                log.info("event=stage_lead pipeline=%s stage=%d %s", p.id, k,
                         " ".join(f"batch{b}_us={lead[b]:.0f} tail{b}_us={tail[b]:.0f}" for b in sorted(lead)))
        if new:
            old = self.driver
            self.driver = self._new_driver()
            self.driver.adopt(old.queued(), now_us())
            log.info("event=clock_lead calibrated=%d/%d lead_us=%.0f", len(self.overheads), len(self.pipelines),
                     self.driver.lead_us)
        else:
            self.leads.calibrated = {p: o.lead_us for p, o in self.overheads.items()}
        self._kick_loop()

    def _lead_learned(self, extra_us: float) -> None:
        """The executor measured a larger send-to-compute lead under load: the core's clock leads by it too
        (logged when it moved by 5 ms or more: a stalled host shows here first)."""
        self.driver.extra_lead_us = extra_us
        self.meter.learned_lead(extra_us)
        if abs(extra_us - self._logged_lead_us) >= 5000.0:
            self._logged_lead_us = extra_us
            log.info("event=lead_learned extra_us=%.0f clock_lead_us=%.0f cap_us=%.0f", extra_us,
                     self.driver.lead_us, self.driver.lead_cap_us)

    def _vgpu_changed(self, srv: VGpuServer, up: bool, why: str) -> None:
        """A vGPU left or rejoined; one that rejoins is calibrated first and then planned on (the core reserves
        nothing on it while calibration batches run there)."""
        self.metrics.vgpu_up.labels(srv.id).set(1 if up else 0)
        if up and self._loop_task is not None and not self._closing:
            self._calibrate_later(srv.id)
            return
        self.driver.set_vgpu_up(srv.id, up, now_us())
        self._kick_loop()

    def _calibrate_later(self, rejoined: str) -> None:
        prev = self._calibrating

        async def run() -> None:
            if prev is not None:
                await asyncio.gather(prev, return_exceptions=True)
            try:
                await self._calibrate(rejoined)
            finally:
                srv = self.fleet.servers[rejoined]
                self.driver.set_vgpu_up(rejoined, srv.up, now_us())
                self._kick_loop()

        self._calibrating = asyncio.ensure_future(run())

    async def stop_dispatching(self) -> None:
        """A reload hands this plan's queue to the next: the driver is no longer stepped (nothing new is
        dispatched), no calibration starts; in-flight batches run on and answer their calls."""
        self._stopped = True
        for t in (self._loop_task, self._calibrating, self._promise_task):
            if t is not None:
                t.cancel()
                await asyncio.gather(t, return_exceptions=True)
        self._loop_task = self._calibrating = None

    async def next_step_us(self) -> float:
        """Kick the scheduler loop and wait for its next step of the driver; returns when it stepped (µs)."""
        fut = asyncio.get_running_loop().create_future()
        self._step_waiters.append(fut)
        self._kick_loop()
        return await fut

    async def close(self) -> int:
        """Answer what is still queued with an error, drop connections and shm regions; returns regions removed."""
        self._closing = self._stopped = True
        for t in (self._loop_task, self._calibrating, self._promise_task):
            if t is not None:
                t.cancel()
                await asyncio.gather(t, return_exceptions=True)
        await self.executor.close()
        await asyncio.to_thread(self.promise.close)
        for held in list(self.driver.rows.values()):
            self.answers.fail(held.call, shutting_down())
        self.driver.rows.clear()
        removed = await self.fleet.close()
        if self.batch_log is not None:
            self.batch_log.close()
        if self.overheads_out is not None:
            self.meter.write(self.overheads_out, calibration=self.call_costs.to_dict())
        log.info("event=planned_closed shm_regions_removed=%d", removed)
        return removed

    # --- the scheduler loop --------------------------------------------------------------------------------
    def _kick_loop(self) -> None:
        self._kick.set()

    async def _scheduler_loop(self) -> None:
        busy = LoopBusy()  # the event loop's load: a saturated sidecar gets fuller batches from the core
        stalls = StallLog(self.metrics.loop_stalls)
        while not self._stopped:
            timeout = None if self._wake_us is None else max(0.0, (self._wake_us - now_us()) / 1e6)
            try:
                # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a cancel that arrives with the
                # kick, and the loop outlived stop_dispatching (a reload hung on it, found under CPU load)
                async with asyncio.timeout(timeout):
                    await self._kick.wait()
            except TimeoutError:
                if self._wake_us is not None:
                    self.meter.woke(now_us() - self._wake_us)
            self._kick.clear()
            t0 = time.perf_counter()
            try:
                self._wake_us = self.driver.step(now_us())
            except Exception as e:  # noqa: BLE001 - a policy bug must not stop serving, nor strand a request
                self._step_failed(e)
            self.metrics.decision.observe(time.perf_counter() - t0)
            if busy.due() and (fraction := busy.sample()) is not None:
                self._loop_load(fraction)
                stalls.add(*busy.stalls())
            if self._step_waiters:
                t = now_us()
                for f in self._step_waiters:
                    if not f.done():
                        f.set_result(t)
                self._step_waiters.clear()

    def _step_failed(self, error: Exception) -> None:
        """A policy step raised: every request the driver holds gets an explicit error (counted: Triton's
        nv_inference_request_failure with reason BACKEND, and poolpipe_sidecar_policy_failures_total), and a new
        driver with a fresh policy takes over, since the failed one's state cannot be trusted; batches in flight
        finish through the retired driver."""
        log.exception("event=step_failed policy=%s", self.policy)
        self.metrics.policy_failures.inc()
        held = self.driver.retire()
        self.driver = self._new_driver()
        err = ServeError(grpc.StatusCode.INTERNAL, f"the scheduling policy '{self.policy}' failed ({error!r}); "
                                                   "the request was not run")
        for row in held:
            self.answers.fail(row.call, err, "BACKEND")
        log.error("event=step_failed_requests_failed count=%d", len({id(row.call) for row in held}))
        self._wake_us = None

    def _loop_load(self, busy: float) -> None:
        if self.driver.executor_busy(busy):
            self._kick_loop()  # decide again now: a batch held for the saturated loop may go
        self.metrics.loop_busy.set(busy)
        self.metrics.executor_saturated.set(1 if self.driver.executor_load.saturated else 0)

    # --- what the Router asks -----------------------------------------------------------------------
    def has(self, model: str) -> bool:
        return model in self.models or self.apps.has(model)

    def names(self) -> list[str]:
        return list(self.models) + self.apps.names()

    def ready(self, model: str) -> bool:
        """Ready while some calibrated pipeline has a vGPU in service at every stage (an app: every module's)."""
        if self.apps.has(model):
            return all(self.ready(m) for m in self.apps.models_of(model))
        servers = self.fleet.servers
        return any(p.id in self.overheads and all(any(servers[v].up for v in s.vgpus) for s in p.stages)
                   for p in self.models[model].pipelines)

    def metadata(self, model: str) -> service_pb2.ModelMetadataResponse:
        return self.apps.metadata(model) if self.apps.has(model) else model_metadata(self.models[model])

    def config(self, model: str) -> service_pb2.ModelConfigResponse:
        return self.apps.config(model) if self.apps.has(model) else model_config(self.models[model])

    def statistics(self, model: str) -> service_pb2.ModelStatistics:
        return self.answers.statistics(model)

    def triton_metrics(self) -> bytes:
        """Triton's nv_inference_* families for every planned model (and application)."""
        return triton_exposition(self.answers.stats, self.driver.queue_lengths())

    def refresh_gauges(self) -> None:
        queues = self.driver.queue_lengths()
        for m in self.models:
            self.metrics.queue_length.labels(m).set(queues.get(m, 0))

    def submit(self, request: InferRequest) -> asyncio.Future:
        """Check and queue one request now; its answer (or ServeError) comes in the future returned. Raises
        ServeError for a request refused at once. Cancelling the future withdraws the request."""
        if self._closing:
            raise shutting_down()
        if self.apps.has(request.model_name):
            return asyncio.ensure_future(self.apps.infer(request.message(), request.deadline_s, self.client_shm))
        model = self.models[request.model_name]
        t = now_us()  # before decoding the input: that time counts against the deadline too
        call = check(request, model, self.client_shm)
        # with Triton's batcher controls, "timeout" is their queue timeout; without, it tightens the deadline
        controlled = model.dynamic_batching.active
        call.arrival_us = t
        call.deadline_us = request_deadline_us(t, model.slo_us, None if controlled else call.timeout_us,
                                               request.deadline_s, self.front_us)
        call.future = asyncio.get_running_loop().create_future()
        if self.tracer.on:
            call.trace = self.tracer.start(model.name, call.request_id, t, {"poolpipe.rows": call.batch,
                                                                             "triton.priority": call.priority})
        self._enqueue(call)
        return call.future

    async def run_module(self, model_name: str, inputs: dict[str, np.ndarray], deadline_us: float,
                         request_id: str) -> dict[str, np.ndarray]:
        """An application module's request (inputs [rows, ...], already checked by the app): each row goes
        to ``model_name`` like a client's, whatever the model's max batch size; returns its outputs in order."""
        if self._closing:
            raise shutting_down()
        model = self.models[model_name]
        rows = next(iter(inputs.values())).shape[0]
        call = ClientCall(model, request_id, rows, inputs, tuple(OutputTarget(t) for t in model.outputs),
                          arrival_us=now_us(), deadline_us=deadline_us,
                          future=asyncio.get_running_loop().create_future(), internal=True)
        self._enqueue(call)
        return await _awaited(call.future)

    def _enqueue(self, call: ClientCall) -> None:
        timeout = int(call.timeout_us or 0) if call.model.dynamic_batching.active else 0
        for row in range(call.batch):
            if not self.driver.submit(call, call.model.name, now_us(), call.deadline_us, call.priority, timeout,
                                      counted=row == 0, index=row):
                break  # refused (its queue is full): the call is answered; its other rows would be refused too
        self._kick_loop()


async def _awaited(future: asyncio.Future) -> Any:
    try:
        return await future
    except asyncio.CancelledError:  # the client went away: its rows are skipped when dispatched
        if not future.done():
            future.cancel()
        raise

