"""The scheduler's view of a deployment: vGPUs behind server NICs, and each model's pooled pipelines.

Built from a plan by the simulator (synthetic placement) and from manifest.json by the sidecar
(real placement); the policies see only this.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from poolpipe_common.batcher import BatcherControls
from poolpipe_common.overheads import Overheads, stage_calls_per_request
from scheduler.core.latency_dist import QuantileDist


@dataclass(frozen=True)
class VGpu:
    id: str
    gpu_type: str
    v: int  # vGPU level of its GPU (1 = whole GPU)
    server: str  # the server whose NIC (one uplink, one downlink) this vGPU shares
    gpu: str = ""  # the physical GPU it is a slice of ("" = its own id); sidecar shards split whole GPUs


@dataclass(frozen=True)
class Stage:
    """One partition of a pipeline, served by a pool of vGPUs of one type and level."""

    blocks: tuple[int, int]
    pool: tuple[str, ...]  # vGPU ids
    latency_us: dict[int, float]  # batch size -> latency on one vGPU of the pool
    in_bytes_per_request: int  # bytes of the boundary tensor arriving at this stage (0 for the first)
    # batch size -> distribution of the batch's latency when all its requests are alike (profiled for a
    # variable-latency model; None: the latency is latency_us, the median, every time)
    latency_dist: dict[int, QuantileDist] | None = None
    # batch size -> the trailing part of latency_us that does not hold the vGPU: the response's way back to the
    # executor (the tail a live executor measures). The next stage and the answer wait for it; the vGPU's next
    # batch does not (its server starts a queued batch as soon as the compute ends).
    hop_us: dict[int, float] = field(default_factory=dict)
    # bytes per request the stage call sends (the client's input for the first stage) and gets back: what its
    # per-byte serving costs are counted on (poolpipe_common.overheads)
    call_bytes: tuple[int, int] = (0, 0)

    def latency(self, batch: int) -> float:
        return self.latency_us[batch]

    def hold(self, batch: int) -> float:
        """How long a batch of ``batch`` holds its vGPU: its latency less the hop back."""
        return self.latency_us[batch] - self.hop_us.get(batch, 0.0)

    def hold_us(self) -> dict[int, float]:
        """batch size -> :meth:`hold`, for every batch size the stage has a latency for."""
        return {b: self.hold(b) for b in self.latency_us}

    def dist(self, batch: int) -> QuantileDist:
        """The latency distribution at ``batch`` (a point at the median where none was profiled)."""
        if self.latency_dist is not None and batch in self.latency_dist:
            return self.latency_dist[batch]
        return QuantileDist.point(self.latency_us[batch])


@dataclass(frozen=True)
class Pipeline:
    id: str  # "<model>/<index>"
    model: str
    batch: int  # planned (unified) batch size
    stages: tuple[Stage, ...]
    throughput_rps: float  # planned


@dataclass(frozen=True)
class Topology:
    vgpus: dict[str, VGpu]
    pipelines: dict[str, tuple[Pipeline, ...]]  # model -> its pooled pipelines
    slo_us: dict[str, float]  # model -> SLO
    bandwidth_gbps: float  # per server NIC, each direction
    gpu_counts: dict[str, int] = field(default_factory=dict)  # physical GPUs per type in the cluster
    # model -> Triton's batcher controls (priority levels, queue policy); a model not here has one plain queue
    batcher: dict[str, BatcherControls] = field(default_factory=dict)

    def pipeline(self, pipeline_id: str) -> Pipeline:
        model = pipeline_id.rsplit("/", 1)[0]
        for p in self.pipelines.get(model, ()):
            if p.id == pipeline_id:
                return p
        raise KeyError(f"no pipeline {pipeline_id!r} in the topology")

    def stage_calls_per_request(self) -> float:
        """The stage calls a request makes (the rate at which a sidecar's costs grow: Overheads.at_rate)."""
        return stage_calls_per_request((p.throughput_rps, len(p.stages), p.batch)
                                       for ps in self.pipelines.values() for p in ps)

    @property
    def us_per_byte(self) -> float:
        """Transfer time of one byte through a server NIC, in µs."""
        return 8.0 / (self.bandwidth_gbps * 1e3)

    def idle_us(self, pipeline: Pipeline) -> float:
        """One request's way through ``pipeline`` on idle vGPUs: every stage at its smallest batch, plus the input's
        transfer into each stage whose pool shares no server with the stage before (the probe's fastest path)."""
        return sum(st.latency(min(st.latency_us)) for st in pipeline.stages) + self.transfers_us(pipeline)

    def transfers_us(self, pipeline: Pipeline) -> float:
        """One request's input transfers along ``pipeline``: into each stage whose pool shares no server with the
        stage before (on a shared server a stage's input stays there)."""
        total, before = 0.0, None
        for st in pipeline.stages:
            servers = {self.vgpus[v].server for v in st.pool}
            if before is not None and not servers & before:
                total += st.in_bytes_per_request * self.us_per_byte
            before = servers
        return total


def with_stage_overhead(topology: Topology, extra_us: float, per_byte_us: float = 0.0) -> Topology:
    """The same topology with ``extra_us`` (plus ``per_byte_us`` per byte the call gets back) added to every stage
    latency as its hop (the response tail a live executor measures: the next stage and the answer wait for it, the
    vGPU's next batch does not)."""
    if extra_us == 0 and per_byte_us == 0:
        return topology

    def stage(s: Stage) -> Stage:
        extra = {b: extra_us + per_byte_us * s.call_bytes[1] * b for b in s.latency_us}
        dist = None if s.latency_dist is None else {b: d.shifted(extra[b]) for b, d in s.latency_dist.items()}
        return replace(s, latency_us={b: t + extra[b] for b, t in s.latency_us.items()}, latency_dist=dist,
                       hop_us={b: s.hop_us.get(b, 0.0) + extra[b] for b in s.latency_us})

    pipelines = {m: tuple(replace(p, stages=tuple(stage(s) for s in p.stages)) for p in ps)
                 for m, ps in topology.pipelines.items()}
    return replace(topology, pipelines=pipelines)


def with_slowdown(topology: Topology, slowdown: float) -> Topology:
    """The same topology with every stage's compute (its latency less its hop) ``slowdown`` times the table's: the
    compute a live sidecar measures, so the policy plans with it as the sidecar's driver does once it has learned it
    (planned with the table's, a pool with less slack than the slowdown takes was kept in simulation and left
    unused live)."""
    if slowdown == 1.0:
        return topology

    def scaled(us: float, hop: float) -> float:
        return (us - hop) * slowdown + hop

    def stage(s: Stage) -> Stage:
        hop = {b: s.hop_us.get(b, 0.0) for b in s.latency_us}
        dist = None if s.latency_dist is None else {
            b: QuantileDist(d.levels, tuple(scaled(v, s.hop_us.get(b, 0.0)) for v in d.values))
            for b, d in s.latency_dist.items()}
        return replace(s, latency_us={b: scaled(t, hop[b]) for b, t in s.latency_us.items()}, latency_dist=dist)

    pipelines = {m: tuple(replace(p, stages=tuple(stage(s) for s in p.stages)) for p in ps)
                 for m, ps in topology.pipelines.items()}
    return replace(topology, pipelines=pipelines)


def slowed_as_measured(topology: Topology, overheads: Overheads) -> tuple[Topology, Overheads]:
    """(the topology with_slowdown by the measured slowdown, the costs with it taken out): a simulation given both
    plans with the slowed compute and runs it as planned, not slowed twice."""
    return with_slowdown(topology, overheads.slowdown), replace(overheads, slowdown=1.0)
