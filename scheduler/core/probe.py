"""The reservation state of a topology and ``probe``: the earliest-finishing path of one batch.

``probe(pipeline, batch, now)`` walks the stages greedily: in each stage's pool it picks the vGPU
that finishes the stage earliest, given that stage's input is ready when the previous stage ends
and, when the two vGPUs sit on different servers, after a transfer that holds the previous
server's uplink and this server's downlink for the same interval. It reserves nothing; ``commit``
does. Probes are counted (``probe_calls``) because they are the cost of a dispatch decision.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass

from scheduler.core.api import StageAssignment
from scheduler.core.reservations import COMPUTE, TRANSFER, ResourceTable, earliest_common, owner_key
from scheduler.core.topology import Pipeline, Topology

INF = float("inf")


@dataclass(frozen=True)
class Leg:
    """One stage of a probed path: the compute interval and, if any, the input transfer interval."""

    stage: int
    vgpu: str
    start_us: float
    end_us: float
    transfer_start_us: float | None = None
    transfer_end_us: float | None = None
    src_server: str | None = None
    dst_server: str | None = None


@dataclass(frozen=True)
class ProbeResult:
    batch: int
    legs: tuple[Leg, ...]
    completion_us: float

    @property
    def start_us(self) -> float:
        return self.legs[0].start_us


class CompiledStage:
    """A stage with its pool resolved to tables (the hot loop reads only these attributes)."""

    __slots__ = ("index", "latency", "xfer_us_per_request", "pool", "active", "servers")

    def __init__(self, index: int, latency: dict[int, float], xfer_us_per_request: float,
                 pool: list[tuple[str, ResourceTable, str]]) -> None:
        self.index = index
        self.latency = latency
        self.xfer_us_per_request = xfer_us_per_request
        self.pool = pool
        self.active = list(pool)
        self.servers = frozenset(s for _, _, s in pool)


class CompiledPipeline:
    __slots__ = ("pipeline", "stages", "batches", "ideal_us")

    def __init__(self, pipeline: Pipeline, stages: list[CompiledStage]) -> None:
        self.pipeline = pipeline
        self.stages = stages
        common = set.intersection(*(set(s.latency) for s in stages))
        self.batches = sorted(b for b in common if b <= pipeline.batch)  # usable batch sizes, ascending
        self.ideal_us = {b: sum(s.latency[b] + s.xfer_us_per_request * b for s in stages) for b in self.batches}

    @property
    def id(self) -> str:
        return self.pipeline.id

    @property
    def batch(self) -> int:
        return self.batches[-1]


class ReservationState:
    """Reservation tables for every vGPU and every server NIC direction of one topology."""

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self.vgpu_tables = {v: ResourceTable(v) for v in topology.vgpus}
        servers = sorted({vg.server for vg in topology.vgpus.values()})
        self.uplinks = {s: ResourceTable(f"{s}/up") for s in servers}
        self.downlinks = {s: ResourceTable(f"{s}/down") for s in servers}
        self.up_vgpus = set(topology.vgpus)
        self.probe_calls = 0
        us_per_byte = 8.0 / (topology.bandwidth_gbps * 1e3)
        self.pipelines: dict[str, list[CompiledPipeline]] = {}
        for model, pipes in topology.pipelines.items():
            compiled = []
            for p in pipes:
                stages = [CompiledStage(k, dict(st.latency_us), st.in_bytes_per_request * us_per_byte if k else 0.0,
                                        [(v, self.vgpu_tables[v], topology.vgpus[v].server) for v in st.pool])
                          for k, st in enumerate(p.stages)]
                cp = CompiledPipeline(p, stages)
                if cp.batches:
                    compiled.append(cp)
            self.pipelines[model] = compiled

    def all_tables(self) -> list[ResourceTable]:
        return [*self.vgpu_tables.values(), *self.uplinks.values(), *self.downlinks.values()]

    # -- probing ---------------------------------------------------------------------------------
    def probe(self, cp: CompiledPipeline, batch: int, now: float) -> ProbeResult | None:
        """Earliest-finishing greedy path for ``batch`` requests ready at ``now`` (None: a pool is empty)."""
        self.probe_calls += 1
        uplinks, downlinks = self.uplinks, self.downlinks
        t = now
        prev_server: str | None = None
        legs = []
        for st in cp.stages:
            d = st.latency[batch]
            xfer = st.xfer_us_per_request * batch
            cross_only = prev_server is None or prev_server not in st.servers
            bound = t + d if (prev_server is None or xfer <= 0.0 or not cross_only) else t + xfer + d
            best_end = INF
            best = None
            slot_cache: dict[str, float] = {}
            for vid, tab, server in st.active:
                if prev_server is None or server == prev_server or xfer <= 0.0:
                    ts = -1.0
                    ready = t
                else:
                    ts = slot_cache.get(server, -1.0)
                    if ts < 0.0:
                        ts = earliest_common((uplinks[prev_server], downlinks[server]), t, xfer)
                        slot_cache[server] = ts
                    ready = ts + xfer
                # inline ResourceTable.earliest(ready, d)
                ends = tab.ends
                i = bisect_right(ends, ready)
                n = len(ends)
                s = ready
                if i < n:
                    starts = tab.starts
                    while i < n and starts[i] < s + d:
                        s = ends[i]
                        i += 1
                e = s + d
                if e < best_end:
                    best_end = e
                    best = (vid, s, ts, server)
                    if e <= bound:
                        break
            if best is None:
                return None
            vid, s, ts, server = best
            if ts >= 0.0:
                legs.append(Leg(st.index, vid, s, best_end, ts, ts + xfer, prev_server, server))
            else:
                legs.append(Leg(st.index, vid, s, best_end))
            t = best_end
            prev_server = server
        return ProbeResult(batch, tuple(legs), t)

    # -- reserving -------------------------------------------------------------------------------
    def commit(self, result: ProbeResult, dispatch_id: int) -> list[StageAssignment]:
        """Reserve a probed path (call before anything else changes the tables)."""
        out = []
        for leg in result.legs:
            self.vgpu_tables[leg.vgpu].reserve(leg.start_us, leg.end_us, owner_key(dispatch_id, leg.stage, COMPUTE))
            if leg.transfer_start_us is not None:
                key = owner_key(dispatch_id, leg.stage, TRANSFER)
                self.uplinks[leg.src_server].reserve(leg.transfer_start_us, leg.transfer_end_us, key)
                self.downlinks[leg.dst_server].reserve(leg.transfer_start_us, leg.transfer_end_us, key)
            out.append(StageAssignment(leg.stage, leg.vgpu, leg.start_us, leg.end_us,
                                       leg.transfer_start_us, leg.transfer_end_us))
        return out

    def correct(self, dispatch_id: int, stage: int, vgpu: str, start_us: float, end_us: float) -> None:
        """Feedback: the stage really ran [start, end) on ``vgpu``."""
        tab = self.vgpu_tables.get(vgpu)
        if tab is not None:
            tab.correct(owner_key(dispatch_id, stage, COMPUTE), start_us, end_us)

    def release(self, dispatch_id: int, legs: list[StageAssignment], src_servers: list[str | None]) -> None:
        for a, src in zip(legs, src_servers):
            self.vgpu_tables[a.vgpu].release(owner_key(dispatch_id, a.stage, COMPUTE))
            if a.transfer_start_us is not None and src is not None:
                key = owner_key(dispatch_id, a.stage, TRANSFER)
                self.uplinks[src].release(key)
                self.downlinks[self.topology.vgpus[a.vgpu].server].release(key)

    def set_vgpu_up(self, vgpu: str, up: bool, now_us: float) -> list[int]:
        """Take a vGPU out of (or back into) probes; going down releases its reservations from now on.
        Returns the dispatch ids whose reservations on it were released."""
        if vgpu not in self.vgpu_tables:
            return []
        gone: list[int] = []
        if up:
            self.up_vgpus.add(vgpu)
        else:
            self.up_vgpus.discard(vgpu)
            gone = [k >> 8 for k in self.vgpu_tables[vgpu].release_from(now_us)]
        for pipes in self.pipelines.values():
            for cp in pipes:
                for st in cp.stages:
                    st.active = [x for x in st.pool if x[0] in self.up_vgpus]
        return gone

    def prune(self, now_us: float) -> None:
        for tab in self.vgpu_tables.values():
            tab.prune(now_us)
        for tab in self.uplinks.values():
            tab.prune(now_us)
        for tab in self.downlinks.values():
            tab.prune(now_us)
