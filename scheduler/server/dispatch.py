"""Planned models on the real clock: the scheduler core decides, this module executes its dispatches.

A client request is split into samples (one scheduler Request each). A dispatched batch stacks its
samples' inputs, runs stage 1 on the chosen vGPU's tritonserver, hands the boundary tensors to the next
stage (through a shared-memory region of the host's pool when both servers share the host, else as gRPC
bytes through the sidecar), and splits the last stage's outputs back to the clients. Measured compute
intervals go back to the core (feedback); a failing server is taken out of service and its batches
re-enqueued while their deadlines allow.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import numpy as np
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import triton_to_np_dtype

from model_repository_gen.manifest import (
    Manifest,
    ModelInfo,
    PipelineInfo,
    StageInfo,
    load_manifest,
)
from model_repository_gen.triton_config import (
    COMPUTE_END_OUTPUT,
    COMPUTE_START_OUTPUT,
    TIMING_OUTPUTS,
)
from poolpipe_common.errors import InputError
from poolpipe_common.tensors import TensorSpec
from scheduler.core import make_scheduler
from scheduler.core.api import Dispatch, Request
from scheduler.server.client_shm import ClientShmRegistry
from scheduler.server.errors import ServeError, shed
from scheduler.server.manifest_topology import topology_from_manifest
from scheduler.server.metrics import SidecarMetrics
from scheduler.server.router import GRPC_OPTIONS
from scheduler.server.shm_pool import (
    HostPool,
    Region,
    align,
    remove_stale_regions,
    stale,
)
from scheduler.server.validate import CheckedRequest, check_request

log = logging.getLogger("poolpipe.sidecar.dispatch")

DEFAULT_POLICY = "ppipe"
LIVE_POLICIES = ("ppipe", "fifs", "elsa")  # policies whose dispatches carry whole batches (final=True)
MAX_ATTEMPTS = 3
# The core plans against the deadline minus this margin (the client's side of the call and Python scheduling
# jitter are not in the profiles): the larger of 5 % of the SLO and 3 ms. The plan's slo_margin_us is not
# added: it is the planner's headroom for queueing and batch forming, which the core's reservations model.
MIN_MARGIN_US = 3000.0
MARGIN_FRACTION = 0.05
# On top, the sidecar learns how late batches finish against the core's prediction (servers slower than
# profiled, CPU contention) and plans with a robust high percentile of that lateness (the p99 of a short
# window is one outlier), leaving out the first batches (warm-up), capped at half the SLO.
LATENESS_WINDOW = 256
LATENESS_EVERY = 16
LATENESS_PERCENTILE = 95
LATENESS_WARMUP = 8
MAX_MARGIN_FRACTION = 0.5
# The core's stage intervals are compute intervals, but a stage's compute starts only some time after the
# sidecar sends it (request serialisation and transfer, the backend's input copy). That lead time is measured
# at start-up by running a few batches of zeros through every pipeline (the first run is warm-up; the median
# of the rest is used). The sidecar sends each stage that much before its reserved start, and steps the core
# that much ahead of the real clock (a batch dispatched now cannot compute before now + lead), so that
# reservations match when computes really run instead of drifting behind them. The lead overlaps the previous
# batch's compute when the server is busy, so it is not added to the stage latencies (the vGPU's occupancy);
# the tail (compute end -> response at the sidecar, measured alike) is: the next stage's input, the answer, and
# the server's next compute come only after it.
CALIBRATION_RUNS = 4
CALIBRATION_TIMEOUT_S = 10.0
# A wake-up that fires late is stepped at the time the core asked for, up to half the smallest margin (the
# event loop is not a real-time clock; the core would otherwise see "too late" and drop requests it meant
# to dispatch; the other half of the margin still covers the execution).
MIN_LATE_WAKE_TOLERANCE_US = 2000.0
HEALTH_PERIOD_S = 0.5
# Codes that say "this request is wrong", not "this server is broken": the batch fails, the server stays.
CLIENT_FAULTS = (grpc.StatusCode.INVALID_ARGUMENT,)


def now_us() -> float:
    return time.monotonic() * 1e6


def wall_ns_to_mono_us(ns: float) -> float:
    return ns / 1e3 - (time.time() - time.monotonic()) * 1e6


def is_local_address(address: str) -> bool:
    """True when a server at ``address`` runs on this machine (and so shares /dev/shm with the sidecar)."""
    try:
        with socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET) as s:
            s.bind((address, 0))
        return True
    except OSError:
        return False


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


@dataclass
class Sample:
    call: ClientCall
    row: int
    attempts: int = 0


@dataclass
class HopTensor:
    """A boundary tensor between stages: bytes in the sidecar, or a region of a host pool."""

    spec: TensorSpec
    shape: list[int]
    array: np.ndarray | None = None
    region: Region | None = None
    offset: int = 0

    @property
    def nbytes(self) -> int:
        return self.spec.bytes_per_request() * self.shape[0]


class StageFault(Exception):
    def __init__(self, vgpu: str, error: grpc.aio.AioRpcError) -> None:
        super().__init__(f"{vgpu}: {error.code().name}: {error.details()}")
        self.vgpu = vgpu
        self.error = error


def machines(manifest: Manifest) -> dict[str, str]:
    """Host name -> the first host name with the same address: hosts listed separately in the cluster file
    (e.g. one per GPU type) but on one machine share /dev/shm, so hops between them use shared memory."""
    first: dict[str, str] = {}
    return {h.name: first.setdefault(h.address, h.name) for h in manifest.hosts}


@dataclass
class VGpuServer:
    id: str
    host: str  # the machine (see machines()): the key of its shared-memory pool
    grpc_url: str
    models: tuple[str, ...]
    channel: grpc.aio.Channel
    stub: service_pb2_grpc.GRPCInferenceServiceStub
    up: bool = True
    registered: set[str] = field(default_factory=set)


@dataclass
class ModelCounters:
    success: int = 0
    success_ns: int = 0
    fail: int = 0
    inferences: int = 0
    executions: int = 0
    last_ms: int = 0


class PlannedModels:
    """The PlannedService of the Router for every model of one manifest."""

    def __init__(self, manifest: Manifest, policy: str, metrics: SidecarMetrics,
                 batch_log: Path | None = None) -> None:
        self.manifest = manifest
        self.machine = machines(manifest)  # host name -> the machine whose shm pool it shares
        # One JSON line per executed stage (measured compute interval), for timelines such as the demo's.
        self.batch_log = open(batch_log, "a", buffering=1) if batch_log else None
        self.metrics = metrics
        self.policy = DEFAULT_POLICY if policy == "auto" else policy
        if self.policy not in LIVE_POLICIES:
            raise InputError(f"--policy {policy}: the sidecar runs {', '.join(('auto',) + LIVE_POLICIES)} "
                             "(per-stage policies are for the simulator)")
        self.topology = topology_from_manifest(manifest)
        self.scheduler = make_scheduler(self.policy, self.topology)
        self.lead_us: dict[str, list[dict[int, float]]] = {}  # pipeline -> stage -> batch -> send-to-compute
        self.tail_us: dict[str, list[dict[int, float]]] = {}  # pipeline -> stage -> batch -> compute-to-response
        self.clock_lead_us = 0.0  # the core's clock runs this far ahead of the real one (see CALIBRATION_RUNS)
        self.models = {m.name: m for m in manifest.models}
        self.base_margin_us = {m.name: max(MIN_MARGIN_US, MARGIN_FRACTION * m.slo_us) for m in manifest.models}
        self.margin_us = dict(self.base_margin_us)
        self.late_wake_tolerance_us = max(MIN_LATE_WAKE_TOLERANCE_US, 0.5 * min(self.base_margin_us.values()))
        self.lateness_us: dict[str, deque[float]] = {m: deque(maxlen=LATENESS_WINDOW) for m in self.models}
        self.pipelines: dict[str, PipelineInfo] = {p.id: p for m in manifest.models for p in m.pipelines}
        self.client_shm: ClientShmRegistry | None = None
        self.samples: dict[int, Sample] = {}
        self.counters = {m: ModelCounters() for m in self.models}
        self.servers: dict[str, VGpuServer] = {}
        self.pools: dict[str, HostPool] = {}
        self._next_request = 1
        self._learned = 0
        self._kick = asyncio.Event()
        self._wake_us: float | None = None
        self._dispatched_at: dict[int, float] = {}  # dispatch id -> when the step that made it ran
        self._trace: dict[int, list[str]] = {}  # dispatch id -> timing fields so far (debug logging only)
        self._tasks: set[asyncio.Task] = set()
        self._loop_task: asyncio.Task | None = None
        self._health_task: asyncio.Task | None = None
        self._closing = False

    # --- lifecycle -------------------------------------------------------------------------------------------

    @classmethod
    async def create(cls, manifest_path: Path, policy: str, metrics: SidecarMetrics,
                     batch_log: Path | None = None) -> "PlannedModels":
        self = cls(load_manifest(manifest_path), policy, metrics, batch_log)
        removed = remove_stale_regions()
        if removed:
            log.info("event=stale_shm_removed count=%d regions=%s", len(removed), ",".join(removed))
        await self._connect()
        await self._calibrate()
        self._loop_task = asyncio.ensure_future(self._scheduler_loop())
        self._health_task = asyncio.ensure_future(self._health_loop())
        return self

    async def _connect(self) -> None:
        models_on: dict[str, set[str]] = {}
        for m in self.manifest.models:
            for p in m.pipelines:
                for s in p.stages:
                    for v in s.vgpus:
                        models_on.setdefault(v, set()).add(s.triton_model)
        for g in self.manifest.vgpus:
            ch = grpc.aio.insecure_channel(g.grpc_url, options=GRPC_OPTIONS)
            self.servers[g.id] = VGpuServer(g.id, self.machine[g.host], g.grpc_url,
                                            tuple(sorted(models_on.get(g.id, ()))), ch,
                                            service_pb2_grpc.GRPCInferenceServiceStub(ch))
        self._build_pools()
        for srv in self.servers.values():
            ok = await self._bring_up(srv)
            if not ok:
                self._set_up(srv, False, "not ready at start")
            self.metrics.vgpu_up.labels(srv.id).set(1 if srv.up else 0)

    def _build_pools(self) -> None:
        """One pool per local machine that has consecutive stages on it; slots fit the largest boundary batch."""
        host_of = {vid: srv.host for vid, srv in self.servers.items()}
        local = {self.machine[h.name] for h in self.manifest.hosts if is_local_address(h.address)}
        need: dict[str, int] = {}
        for p in self.pipelines.values():
            for prev, cur in zip(p.stages, p.stages[1:]):
                hosts = {host_of[v] for v in prev.vgpus} & {host_of[v] for v in cur.vgpus} & local
                size = sum(align(t.bytes_per_request() * p.batch) for t in cur.inputs)
                for h in hosts:
                    need[h] = max(need.get(h, 0), size)
        for h, size in need.items():
            pool = HostPool(h, size)
            for _ in range(2 * sum(1 for srv in self.servers.values() if srv.host == h)):
                pool.give(pool.create())
            self.pools[h] = pool
            log.info("event=shm_pool host=%s regions=%d slot_bytes=%d", h, len(pool.regions), size)

    async def close(self) -> None:
        self._closing = True
        for t in (self._loop_task, self._health_task):
            if t is not None:
                t.cancel()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*[t for t in (self._loop_task, self._health_task, *self._tasks) if t is not None],
                             return_exceptions=True)
        for s in list(self.samples.values()):
            self._fail(s.call, ServeError(grpc.StatusCode.UNAVAILABLE, "the sidecar is shutting down"))
        self.samples.clear()
        await asyncio.gather(*[self._unregister_all(srv) for srv in self.servers.values()], return_exceptions=True)
        removed = sum(len(p.regions) for p in self.pools.values())
        for pool in self.pools.values():
            pool.destroy()
        for srv in self.servers.values():
            await srv.channel.close()
        if self.batch_log is not None:
            self.batch_log.close()
        log.info("event=planned_closed shm_regions_removed=%d", removed)

    async def _calibrate(self) -> None:
        """Measure each pipeline stage's lead time (see CALIBRATION_RUNS); the core's clock leads by the least
        first-stage lead of all pipelines (one clock for every model)."""
        for p in self.pipelines.values():
            try:
                self.lead_us[p.id], self.tail_us[p.id] = await self._measure_lead(p)
            except (StageFault, ValueError, TypeError) as e:
                log.warning("event=calibration_skipped pipeline=%s reason=%s", p.id, e)
                continue
            for k, (lead, tail) in enumerate(zip(self.lead_us[p.id], self.tail_us[p.id])):
                log.info("event=stage_lead pipeline=%s stage=%d %s", p.id, k,
                         " ".join(f"batch{b}_us={lead[b]:.0f} tail{b}_us={tail[b]:.0f}" for b in sorted(lead)))
        if self.tail_us:
            self.topology = topology_from_manifest(self.manifest, self.tail_us)
            self.scheduler = make_scheduler(self.policy, self.topology)
        if len(self.lead_us) == len(self.pipelines) and self.lead_us:
            self.clock_lead_us = min(min(lead[0].values(), default=0.0) for lead in self.lead_us.values())
            log.info("event=clock_lead lead_us=%.0f", self.clock_lead_us)
        for srv in self.servers.values():
            if not srv.up:
                self.scheduler.set_vgpu_up(srv.id, False, now_us() + self.clock_lead_us)

    def _lead(self, pipeline_id: str, stage: int, batch: int) -> float:
        per_stage = self.lead_us.get(pipeline_id)
        return per_stage[stage].get(batch, 0.0) if per_stage is not None else 0.0

    async def _measure_lead(self, p: PipelineInfo) -> tuple[list[dict[int, float]], list[dict[int, float]]]:
        """Per stage, batch -> median of (compute start - stage ready) and of (response - compute end), measured
        at batch 1 and the planned batch (linear in between); zeros on the first vGPU in service of each pool."""
        vgpus = [next((v for v in s.vgpus if self.servers[v].up), None) for s in p.stages]
        if None in vgpus:
            raise ValueError("a stage has no vGPU in service")
        model = self.models[p.id.rsplit("/", 1)[0]]
        measured: dict[int, list[tuple[float, float]]] = {}
        for b in sorted({1, p.batch}):
            runs: list[list[float]] = []
            for _ in range(CALIBRATION_RUNS):
                hops = [HopTensor(t, [b, *t.shape], array=np.zeros([b, *t.shape], triton_to_np_dtype(t.datatype)))
                        for t in model.inputs]
                d = Dispatch(0, model.name, p.id, [], [], 0.0)
                deadline = now_us() + CALIBRATION_TIMEOUT_S * 1e6
                timings: list[tuple[float, float, float, float]] = []
                for k, (stage, v) in enumerate(zip(p.stages, vgpus)):
                    nxt = vgpus[k + 1] if k + 1 < len(vgpus) else None
                    hops = await self._run_stage(d, k, v, stage, hops, nxt, deadline, timings)  # type: ignore[arg-type]
                self._release(hops)
                runs.append(np.array([(s - ready, recv - e) for ready, s, e, recv in timings]))
            keep = runs[1:] if len(runs) > 1 else runs
            med = np.median(np.stack(keep), axis=0)
            measured[b] = [(float(x), float(y)) for x, y in med]
        span = max(p.batch - 1, 1)
        lead, tail = [], []
        for k, stage in enumerate(p.stages):
            batches = [b for b in stage.latency_us if b <= p.batch]
            for i, out in ((0, lead), (1, tail)):
                lo, hi = measured[1][k][i], measured[max(measured)][k][i]
                out.append({b: max(0.0, lo + (hi - lo) * (b - 1) / span) for b in batches})
        return lead, tail

    # --- shm registration and health -----------------------------------------------------------------------

    async def _unregister_all(self, srv: VGpuServer) -> None:
        for name in list(srv.registered):
            try:
                await srv.stub.SystemSharedMemoryUnregister(
                    service_pb2.SystemSharedMemoryUnregisterRequest(name=name), timeout=2)
            except grpc.aio.AioRpcError:
                pass
            srv.registered.discard(name)

    async def _register(self, srv: VGpuServer, region: Region) -> None:
        await srv.stub.SystemSharedMemoryRegister(service_pb2.SystemSharedMemoryRegisterRequest(
            name=region.name, key=region.key, offset=0, byte_size=region.byte_size), timeout=5)
        srv.registered.add(region.name)

    async def _bring_up(self, srv: VGpuServer) -> bool:
        """Ready check; then drop stale registrations (ours from earlier lives, or a dead sidecar's) and
        register this host's pool."""
        try:
            ready = await srv.stub.ServerReady(service_pb2.ServerReadyRequest(), timeout=1)
            if not ready.ready:
                return False
            for m in srv.models:
                r = await srv.stub.ModelReady(service_pb2.ModelReadyRequest(name=m), timeout=1)
                if not r.ready:
                    return False
            status = await srv.stub.SystemSharedMemoryStatus(service_pb2.SystemSharedMemoryStatusRequest(), timeout=2)
            pool = self.pools.get(srv.host)
            mine = {r.name for r in pool.regions} if pool else set()
            for name in status.regions:
                if stale(name) or name in mine:
                    await srv.stub.SystemSharedMemoryUnregister(
                        service_pb2.SystemSharedMemoryUnregisterRequest(name=name), timeout=2)
            srv.registered.clear()
            if pool:
                for r in list(pool.regions):
                    await self._register(srv, r)
            return True
        except grpc.aio.AioRpcError:
            return False

    def _set_up(self, srv: VGpuServer, up: bool, why: str) -> None:
        if srv.up == up:
            return
        srv.up = up
        self.scheduler.set_vgpu_up(srv.id, up, now_us() + self.clock_lead_us)
        self.metrics.vgpu_up.labels(srv.id).set(1 if up else 0)
        log.warning("event=vgpu_%s vgpu=%s url=%s reason=%s", "up" if up else "down", srv.id, srv.grpc_url, why)
        self._kick.set()

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(HEALTH_PERIOD_S)
            for srv in list(self.servers.values()):
                if srv.up:
                    try:
                        r = await srv.stub.ServerLive(service_pb2.ServerLiveRequest(), timeout=1)
                        if not r.live:
                            self._set_up(srv, False, "not live")
                    except grpc.aio.AioRpcError as e:
                        self._set_up(srv, False, f"health check: {e.code().name}")
                elif await self._bring_up(srv):
                    self._set_up(srv, True, "healthy again")

    # --- the Router's PlannedService ------------------------------------------------------------------------

    def has(self, model: str) -> bool:
        return model in self.models

    def names(self) -> list[str]:
        return list(self.models)

    def ready(self, model: str) -> bool:
        """Ready while every stage of some pipeline has a vGPU in service."""
        return any(all(any(self.servers[v].up for v in s.vgpus) for s in p.stages)
                   for p in self.models[model].pipelines)

    def metadata(self, model: str) -> service_pb2.ModelMetadataResponse:
        m = self.models[model]

        def tensors(ts: tuple[TensorSpec, ...]) -> list:
            return [service_pb2.ModelMetadataResponse.TensorMetadata(name=t.name, datatype=t.datatype,
                                                                     shape=[-1, *t.shape]) for t in ts]
        return service_pb2.ModelMetadataResponse(name=m.name, versions=["1"], platform="poolpipe_pipeline",
                                                 inputs=tensors(m.inputs), outputs=tensors(m.outputs))

    def config(self, model: str) -> service_pb2.ModelConfigResponse:
        m = self.models[model]
        cfg = mc.ModelConfig(name=m.name, platform="poolpipe_pipeline", max_batch_size=m.max_batch_size)
        for t in m.inputs:
            cfg.input.add(name=t.name, data_type=mc.DataType.Value("TYPE_" + t.datatype), dims=list(t.shape))
        for t in m.outputs:
            cfg.output.add(name=t.name, data_type=mc.DataType.Value("TYPE_" + t.datatype), dims=list(t.shape))
        cfg.parameters["poolpipe_slo_us"].string_value = str(m.slo_us)
        cfg.parameters["poolpipe_pipelines"].string_value = ",".join(p.id for p in m.pipelines)
        return service_pb2.ModelConfigResponse(config=cfg)

    def statistics(self, model: str) -> service_pb2.ModelStatistics:
        c = self.counters[model]
        s = service_pb2.ModelStatistics(name=model, version="1", last_inference=c.last_ms,
                                        inference_count=c.inferences, execution_count=c.executions)
        s.inference_stats.success.count = c.success
        s.inference_stats.success.ns = c.success_ns
        s.inference_stats.fail.count = c.fail
        return s

    def refresh_gauges(self) -> None:
        queues = getattr(self.scheduler, "queues", {})
        for m in self.models:
            self.metrics.queue_length.labels(m).set(len(queues.get(m, ())))

    async def infer(self, request: service_pb2.ModelInferRequest, deadline_s: float | None
                    ) -> service_pb2.ModelInferResponse:
        if self._closing:
            raise ServeError(grpc.StatusCode.UNAVAILABLE, "the sidecar is shutting down")
        model = self.models[request.model_name]
        assert self.client_shm is not None
        t = now_us()  # before decoding the input: that time counts against the deadline too
        checked = check_request(request, model, self.client_shm)
        deadline = t + model.slo_us
        if checked.timeout_us is not None:
            deadline = min(deadline, t + checked.timeout_us)
        if deadline_s is not None:
            deadline = min(deadline, deadline_s * 1e6)
        call = ClientCall(model, request, checked, asyncio.get_running_loop().create_future(), t, deadline,
                          [None] * checked.batch, checked.batch)
        for row in range(checked.batch):
            self._enqueue(Sample(call, row))
        self._kick.set()
        try:
            return await call.future
        except asyncio.CancelledError:  # the client went away: its samples are skipped when dispatched
            if not call.future.done():
                call.future.cancel()
            raise

    # --- scheduling ---------------------------------------------------------------------------------------

    def _enqueue(self, sample: Sample) -> None:
        rid = self._next_request
        self._next_request += 1
        sample.attempts += 1
        self.samples[rid] = sample
        model = sample.call.model.name
        self.scheduler.enqueue(Request(rid, model, now_us(), sample.call.deadline_us - self.margin_us[model]))

    async def _scheduler_loop(self) -> None:
        while True:
            timeout = None if self._wake_us is None else max(0.0, (self._wake_us - now_us()) / 1e6)
            try:
                await asyncio.wait_for(self._kick.wait(), timeout)
            except asyncio.TimeoutError:
                pass
            self._kick.clear()
            try:
                self._step()
            except Exception:  # noqa: BLE001 - a policy bug must not stop serving: log it, keep the loop
                log.exception("event=step_failed")

    def _step(self) -> None:
        t0 = time.perf_counter()
        t = now_us()
        if self._wake_us is not None and self._wake_us <= t < self._wake_us + self.late_wake_tolerance_us:
            t = self._wake_us
        if self._wake_us is not None and t - self._wake_us > 1000.0:
            log.debug("event=late_wake late_us=%.0f", t - self._wake_us)
        result = self.scheduler.step(t + self.clock_lead_us)
        self.metrics.decision.observe(time.perf_counter() - t0)
        self._wake_us = None if result.wake_at_us is None else result.wake_at_us - self.clock_lead_us
        for drop in result.drops:
            sample = self.samples.pop(drop.request.id, None)
            if sample is not None:
                self.metrics.drops.labels(drop.request.model, drop.reason).inc()
                self._fail(sample.call, shed(drop.request.model, drop.reason))
        for d in result.dispatches:
            self._dispatched_at[d.id] = t
            task = asyncio.ensure_future(self._run_dispatch(d))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _fail(self, call: ClientCall, error: ServeError) -> None:
        if not call.future.done():
            call.future.set_exception(error)
            self.counters[call.model.name].fail += 1
            self.metrics.finished(call.model.name, False)

    # --- executing a dispatch -----------------------------------------------------------------------------

    async def _run_dispatch(self, d: Dispatch) -> None:
        t_task = now_us()
        t_step = self._dispatched_at.pop(d.id, t_task)
        samples = [s for r in d.requests if (s := self.samples.pop(r.id, None)) is not None]
        live = [s for s in samples if not s.call.future.done()]
        if not live:
            return
        model, pipe = self.models[d.model], self.pipelines[d.pipeline_id]
        self.metrics.batch_size.labels(d.model).observe(len(live))
        self.counters[d.model].executions += 1
        hops = [HopTensor(t, [len(live), *t.shape],
                          array=np.concatenate([s.call.checked.inputs[t.name][s.row:s.row + 1] for s in live]))
                for t in model.inputs]
        deadline_us = max(s.call.deadline_us for s in live)
        arrival_us = min(s.call.arrival_us for s in live)
        if log.isEnabledFor(logging.DEBUG):  # where the time goes (`poolpipe -v serve`): one line per batch
            self._trace[d.id] = [f"batch={len(live)} arrival_to_step={t_step - arrival_us:.0f} "
                                 f"step_to_task={t_task - t_step:.0f} stack={now_us() - t_task:.0f} "
                                 f"step_to_reserved_start={d.stages[0].start_us - t_step:.0f}"]
        try:
            for k, a in enumerate(d.stages):
                if d.reserved:  # send ahead of the reserved compute start by the stage's lead time
                    wait = (a.start_us - self._lead(d.pipeline_id, a.stage, len(live)) - now_us()) / 1e6
                    if wait > 0:
                        await asyncio.sleep(wait)
                nxt = d.stages[k + 1].vgpu if k + 1 < len(d.stages) else None
                hops = await self._run_stage(d, a.stage, a.vgpu, pipe.stages[a.stage], hops, nxt, deadline_us)
        except StageFault as f:
            self._trace.pop(d.id, None)
            self._release(hops)
            await self._on_fault(d, f, live)
            return
        except asyncio.CancelledError:
            self._trace.pop(d.id, None)
            self._release(hops)
            raise
        except Exception as e:  # noqa: BLE001 - never leave a client waiting on a bug: answer, log, go on
            self._trace.pop(d.id, None)
            log.exception("event=dispatch_failed dispatch=%d", d.id)
            self._release(hops)
            for s in live:
                self._fail(s.call, ServeError(grpc.StatusCode.INTERNAL, f"dispatch {d.id} failed: {e}"))
            return
        t_done = now_us()
        self._learn_lateness(d.model, t_done - d.completion_us)
        self._complete(live, hops)
        trace = self._trace.pop(d.id, None)
        if trace is not None:
            t_ans = now_us()
            log.debug("event=dispatch_timing dispatch=%d %s late=%.0f answer=%.0f e2e=%.0f planned_e2e=%.0f", d.id,
                      " ".join(trace), t_done - d.completion_us, t_ans - t_done, t_ans - arrival_us,
                      d.completion_us - arrival_us)
        self._kick.set()

    async def _run_stage(self, d: Dispatch, index: int, vgpu: str, stage: StageInfo, inputs: list[HopTensor],
                         next_vgpu: str | None, deadline_us: float,
                         timings: list[tuple[float, float, float, float]] | None = None) -> list[HopTensor]:
        """Run one stage; ``timings`` (calibration) gets (ready, compute start, compute end, response) in us;
        dispatch id 0 (calibration) is neither reported to the core nor logged."""
        t_ready = now_us()
        srv = self.servers[vgpu]
        batch = inputs[0].shape[0]
        out_region = None
        if next_vgpu is not None and self.servers[next_vgpu].host == srv.host and srv.host in self.pools:
            out_region = await self._take_region(srv.host)
        req = service_pb2.ModelInferRequest(model_name=stage.triton_model, id=f"{d.id}.{index}")
        for spec, h in zip(stage.inputs, inputs):
            t = req.inputs.add(name=spec.name, datatype=spec.datatype, shape=h.shape)
            if h.region is not None:
                t.parameters["shared_memory_region"].string_param = h.region.name
                t.parameters["shared_memory_byte_size"].int64_param = h.nbytes
                t.parameters["shared_memory_offset"].int64_param = h.offset
            else:
                req.raw_input_contents.append(h.array.tobytes())
        offsets = {}
        off = 0
        for spec in stage.outputs:
            o = req.outputs.add(name=spec.name)
            if out_region is not None:
                size = spec.bytes_per_request() * batch
                o.parameters["shared_memory_region"].string_param = out_region.name
                o.parameters["shared_memory_byte_size"].int64_param = size
                o.parameters["shared_memory_offset"].int64_param = off
                offsets[spec.name] = off
                off += align(size)
        for n in TIMING_OUTPUTS:
            req.outputs.add(name=n)
        timeout = max(deadline_us - now_us(), 0.0) / 1e6 + 1.0
        t_send = now_us()
        try:
            resp = await srv.stub.ModelInfer(req, timeout=timeout)
            t_recv = now_us()
        except grpc.aio.AioRpcError as e:
            if out_region is not None:
                self.pools[srv.host].give(out_region)
            raise StageFault(vgpu, e) from None
        self._release(inputs)
        if index > 0:
            self.metrics.hops.labels("shm" if inputs and inputs[0].region is not None else "grpc").inc()
        raw = _raw_outputs(resp, {n for n in offsets})
        start = raw.get(COMPUTE_START_OUTPUT)
        end = raw.get(COMPUTE_END_OUTPUT)
        if start is not None and end is not None:
            s_us = wall_ns_to_mono_us(float(np.frombuffer(start[1], np.int64).min()))
            e_us = wall_ns_to_mono_us(float(np.frombuffer(end[1], np.int64).max()))
            if timings is not None:
                timings.append((t_ready, s_us, e_us, t_recv))
            if d.id <= 0:
                return self._stage_outputs(stage, raw, batch, out_region, offsets, srv.host)
            self.scheduler.report(d.id, index, s_us, e_us)
            a = next(x for x in d.stages if x.stage == index)
            tr = self._trace.get(d.id)
            if tr is not None:
                tr.append(f"s{index}:[ready_to_send={t_send - t_ready:.0f} send_to_compute={s_us - t_send:.0f} "
                          f"compute={e_us - s_us:.0f} planned={a.end_us - a.start_us:.0f} "
                          f"compute_to_recv={t_recv - e_us:.0f} start_late={s_us - a.start_us:.0f}]")
            log.debug("event=stage dispatch=%d stage=%d vgpu=%s batch=%d planned_us=%.0f-%.0f measured_us=%.0f-%.0f",
                      d.id, index, vgpu, batch, a.start_us, a.end_us, s_us, e_us)
            self.metrics.vgpu_busy.labels(vgpu).inc(max(e_us - s_us, 0.0) / 1e6)
            if self.batch_log is not None:
                self.batch_log.write(json.dumps({"dispatch": d.id, "model": d.model, "pipeline": d.pipeline_id,
                                                 "stage": index, "vgpu": vgpu, "batch": batch,
                                                 "start_s": s_us / 1e6, "end_s": e_us / 1e6}) + "\n")
        elif timings is not None:
            raise ValueError(f"stage {index} on {vgpu} returned no compute timestamps")
        return self._stage_outputs(stage, raw, batch, out_region, offsets, srv.host)

    def _stage_outputs(self, stage: StageInfo, raw: dict[str, tuple[list[int], bytes]], batch: int,
                       out_region: Region | None, offsets: dict[str, int], host: str) -> list[HopTensor]:
        out = []
        for spec in stage.outputs:
            shape = raw[spec.name][0] if spec.name in raw else [batch, *spec.shape]
            if out_region is not None:
                out.append(HopTensor(spec, shape, region=out_region, offset=offsets[spec.name]))
            else:
                arr = np.frombuffer(raw[spec.name][1], dtype=triton_to_np_dtype(spec.datatype)).reshape(shape)
                out.append(HopTensor(spec, shape, array=arr))
        if out_region is not None and not out:
            self.pools[host].give(out_region)
        return out

    async def _take_region(self, host: str) -> Region:
        pool = self.pools[host]
        region = pool.take()
        if region is not None:
            return region
        region = pool.create()
        for srv in self.servers.values():
            if srv.host == host and srv.up:
                try:
                    await self._register(srv, region)
                except grpc.aio.AioRpcError as e:
                    self._set_up(srv, False, f"shm registration: {e.code().name}")
        log.info("event=shm_pool_grow host=%s regions=%d", host, len(pool.regions))
        return region

    def _release(self, hops: list[HopTensor]) -> None:
        seen = set()
        for h in hops:
            if h.region is not None and h.region.name not in seen:
                seen.add(h.region.name)
                self.pools[h.region.host].give(h.region)

    async def _on_fault(self, d: Dispatch, fault: StageFault, samples: list[Sample]) -> None:
        code = fault.error.code()
        # A server restarted between health checks has lost our shm registrations: treat it as down, the
        # health loop registers the pool again when it rejoins.
        lost_shm = "shared memory" in (fault.error.details() or "")
        if code in CLIENT_FAULTS and not lost_shm:
            err = ServeError(grpc.StatusCode.INTERNAL, f"stage {fault.vgpu} of pipeline {d.pipeline_id} rejected "
                                                       f"the batch: {fault.error.details()}")
            for s in samples:
                self._fail(s.call, err)
            return
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            # The server answered too slowly (overload), it is not down: the batch is past its deadline
            # (the call's timeout is the deadline plus a second), so fail it rather than take the vGPU away.
            err = ServeError(grpc.StatusCode.DEADLINE_EXCEEDED, f"request failed: stage on vGPU {fault.vgpu} "
                                                                "ran past the request's deadline (server overloaded)")
            for s in samples:
                self._fail(s.call, err)
            return
        self._set_up(self.servers[fault.vgpu], False, f"{code.name}: {fault.error.details()}")
        retried = 0
        for s in samples:
            if s.call.future.done():
                continue
            if s.attempts >= MAX_ATTEMPTS or now_us() >= s.call.deadline_us:
                self._fail(s.call, ServeError(grpc.StatusCode.UNAVAILABLE,
                                              f"request failed: Triton server of vGPU {fault.vgpu} failed "
                                              f"({code.name}) and no retry could meet the deadline"))
            else:
                self._enqueue(s)
                retried += 1
        if retried:
            self.metrics.retries.labels(d.model).inc(retried)
        log.warning("event=batch_retry dispatch=%d pipeline=%s vgpu=%s retried=%d of=%d", d.id, d.pipeline_id,
                    fault.vgpu, retried, len(samples))
        self._kick.set()

    def _learn_lateness(self, model: str, late_us: float) -> None:
        self._learned += 1
        if self._learned <= LATENESS_WARMUP:
            return
        window = self.lateness_us[model]
        window.append(late_us)
        n = self._learned - LATENESS_WARMUP
        if n <= LATENESS_EVERY or n % LATENESS_EVERY == 0:
            learned = float(np.percentile(window, LATENESS_PERCENTILE))
            new = min(max(self.base_margin_us[model], learned), self._margin_cap_us(model))
            if abs(new - self.margin_us[model]) > 1000:
                log.info("event=margin model=%s margin_us=%.0f p%d_lateness_us=%.0f", model, new,
                         LATENESS_PERCENTILE, learned)
            self.margin_us[model] = new

    def _margin_cap_us(self, model: str) -> float:
        """At most half the slack an idle pipeline leaves under the SLO: a larger margin would shed every
        request, and with nothing served the learned lateness could never come down again."""
        fastest = min(sum(st.latency(min(st.latency_us)) for st in p.stages)
                      for p in self.topology.pipelines[model])
        slo = self.models[model].slo_us
        return max(self.base_margin_us[model], MAX_MARGIN_FRACTION * min(slo, slo - fastest - self.clock_lead_us))

    def _complete(self, samples: list[Sample], hops: list[HopTensor]) -> None:
        outs = {h.spec.name: h.array for h in hops}
        for i, s in enumerate(samples):
            call = s.call
            if call.future.done():
                continue
            call.rows[s.row] = {n: a[i:i + 1] for n, a in outs.items()}
            call.left -= 1
            if call.left == 0:
                self._answer(call)

    def _answer(self, call: ClientCall) -> None:
        t = now_us()
        resp = service_pb2.ModelInferResponse(model_name=call.model.name, model_version="1", id=call.request.id)
        try:
            for target in call.checked.outputs:
                arr = np.concatenate([r[target.spec.name] for r in call.rows])  # type: ignore[index]
                resp.outputs.add(name=target.spec.name, datatype=target.spec.datatype, shape=list(arr.shape))
                data = np.ascontiguousarray(arr).tobytes()
                if target.region is not None:
                    assert self.client_shm is not None
                    self.client_shm.get(target.region).view(target.offset, len(data),
                                                            f"output '{target.spec.name}'")[:] = data
                    resp.raw_output_contents.append(b"")
                else:
                    resp.raw_output_contents.append(data)
        except ServeError as e:  # e.g. the client unregistered its output region meanwhile
            self._fail(call, e)
            return
        c = self.counters[call.model.name]
        c.success += 1
        c.success_ns += int((t - call.arrival_us) * 1e3)
        c.inferences += call.checked.batch
        c.last_ms = int(time.time() * 1e3)
        self.metrics.finished(call.model.name, t <= call.deadline_us)
        call.future.set_result(resp)


def _raw_outputs(resp: service_pb2.ModelInferResponse, in_shm: set[str]) -> dict[str, tuple[list[int], bytes]]:
    """name -> (shape, raw bytes); outputs written to shared memory have shape and empty bytes."""
    aligned = len(resp.raw_output_contents) == len(resp.outputs)
    out, j = {}, 0
    for i, o in enumerate(resp.outputs):
        if aligned:
            data = resp.raw_output_contents[i]
        elif o.name in in_shm:
            data = b""
        else:
            data = resp.raw_output_contents[j] if j < len(resp.raw_output_contents) else b""
            j += 1
        out[o.name] = (list(o.shape), data)
    return out
