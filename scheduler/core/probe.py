"""The reservation state of a topology and ``probe``: the earliest-finishing path of one batch.

``probe(pipeline, batch, now)`` walks the stages greedily: in each stage's pool it picks the vGPU
that finishes the stage earliest, given that stage's input is ready when the previous stage's response
is back and, when the two vGPUs sit on different servers, after a transfer that holds the previous
server's uplink and this server's downlink for the same interval. A vGPU is reserved for the stage's
compute only: the response's way back (the stage's hop) delays the next stage, not the vGPU's next
batch. It reserves nothing; ``commit`` does. Probes are counted (``probe_calls``) because they are the cost
of a dispatch decision.
"""

from __future__ import annotations

from bisect import bisect_right

from scheduler.core.api import StageAssignment
from scheduler.core.reservations import (
    COMPUTE,
    TRANSFER,
    ResourceTable,
    earliest_common,
    owner_key,
)
from scheduler.core.topology import Pipeline, Topology

INF = float("inf")
# A reservation is moved earlier only by more than this: less is within the event loop's own jitter.
ADVANCE_MIN_US = 100.0


class Leg:
    """One stage of a probed path: the compute interval and, if any, the input transfer interval."""

    __slots__ = ("stage", "vgpu", "start_us", "end_us", "transfer_start_us", "transfer_end_us",
                 "src_server", "dst_server", "next_rr")

    def __init__(self, stage: int, vgpu: str, start_us: float, end_us: float,
                 transfer_start_us: float | None = None, transfer_end_us: float | None = None,
                 src_server: str | None = None, dst_server: str | None = None) -> None:
        self.stage = stage
        self.vgpu = vgpu
        self.start_us = start_us
        self.end_us = end_us
        self.transfer_start_us = transfer_start_us
        self.transfer_end_us = transfer_end_us
        self.src_server = src_server
        self.dst_server = dst_server
        self.next_rr: tuple[CompiledStage, int] | None = None  # where the stage's next scan starts

    def __repr__(self) -> str:
        return f"Leg({self.stage}, {self.vgpu!r}, {self.start_us}, {self.end_us})"


class ProbeResult:
    """A probed path (not reserved): its legs in stage order and the predicted completion."""

    __slots__ = ("batch", "legs", "completion_us")

    def __init__(self, batch: int, legs: list[Leg], completion_us: float) -> None:
        self.batch = batch
        self.legs = legs
        self.completion_us = completion_us

    @property
    def start_us(self) -> float:
        return self.legs[0].start_us


class CompiledStage:
    """A stage with its pool resolved to tables (the hot loop reads only these attributes)."""

    __slots__ = ("index", "latency", "hold", "xfer_us_per_request", "pool", "active", "servers", "rr")

    def __init__(self, index: int, latency: dict[int, float], hold: dict[int, float], xfer_us_per_request: float,
                 pool: list[tuple[str, ResourceTable, str]]) -> None:
        self.index = index
        self.latency = latency  # batch -> from compute start to the response back (what the next stage waits)
        self.hold = hold  # batch -> how long it holds its vGPU (Stage.hold)
        self.xfer_us_per_request = xfer_us_per_request
        self.pool = pool
        self.active = list(pool)
        self.rr = 0  # scan start: the vGPU after the last one reserved
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
        # models whose reservation view changed (a reservation added, moved or released on one of the
        # tables their pipelines read) since the policy last looked; see ``changed``.
        self.dirty: set[str] = set()
        self._watchers: dict[str, set[str]] = {}  # table name -> models reading it
        us_per_byte = topology.us_per_byte
        self.pipelines: dict[str, list[CompiledPipeline]] = {}
        for model, pipes in topology.pipelines.items():
            compiled = []
            for p in pipes:
                stages = [CompiledStage(k, dict(st.latency_us), st.hold_us(),
                                        st.in_bytes_per_request * us_per_byte if k else 0.0,
                                        [(v, self.vgpu_tables[v], topology.vgpus[v].server) for v in st.pool])
                          for k, st in enumerate(p.stages)]
                cp = CompiledPipeline(p, stages)
                if cp.batches:
                    compiled.append(cp)
            self.pipelines[model] = compiled
        for model, pipes in topology.pipelines.items():
            for p in pipes:
                for st in p.stages:
                    for v in st.pool:
                        srv = topology.vgpus[v].server
                        for name in (v, f"{srv}/up", f"{srv}/down"):
                            self._watchers.setdefault(name, set()).add(model)

    def _touch(self, tab: ResourceTable) -> None:
        w = self._watchers.get(tab.name)
        if w:
            self.dirty |= w

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
            h = st.hold[batch]  # the vGPU is free after h, the response at hand after d
            xfer = st.xfer_us_per_request * batch
            cross_only = prev_server is None or prev_server not in st.servers
            bound = t + d if (prev_server is None or xfer <= 0.0 or not cross_only) else t + xfer + d
            best_end = INF
            best = None
            slot_cache: dict[str, float] | None = None
            active = st.active
            k0 = st.rr
            if k0 >= len(active):
                k0 = 0
            # scan from the vGPU after the last one committed: under load it is the one that frees
            # first, so the scan usually stops at once (ties then go to it, not to the pool's first)
            for pos in range(k0, k0 + len(active)):
                vid, tab, server = active[pos - len(active)] if pos >= len(active) else active[pos]
                if prev_server is None or server == prev_server or xfer <= 0.0:
                    ts = -1.0
                    ready = t
                else:
                    if slot_cache is None:
                        slot_cache = {}
                    ts = slot_cache.get(server, -1.0)
                    if ts < 0.0:
                        ts = earliest_common((uplinks[prev_server], downlinks[server]), t, xfer)
                        slot_cache[server] = ts
                    ready = ts + xfer
                e = ready + d
                if e >= best_end:
                    continue  # cannot beat the best even if free
                # inline ResourceTable.earliest(ready, h)
                ends = tab.ends
                n = len(ends)
                if n and ends[-1] > ready:
                    i = bisect_right(ends, ready)
                    starts = tab.starts
                    s = ready
                    while i < n and starts[i] < s + h:
                        s = ends[i]
                        i += 1
                    e = s + d
                else:
                    s = ready
                if e < best_end:
                    best_end = e
                    best = (vid, s, ts, server, pos)
                    if e <= bound:
                        break
            if best is None:
                return None
            vid, s, ts, server, pos = best
            if ts >= 0.0:
                leg = Leg(st.index, vid, s, s + h, ts, ts + xfer, prev_server, server)
            else:
                leg = Leg(st.index, vid, s, s + h)
            leg.next_rr = (st, pos + 1)
            legs.append(leg)
            t = best_end
            prev_server = server
        return ProbeResult(batch, legs, t)

    # -- reserving -------------------------------------------------------------------------------
    def commit(self, result: ProbeResult, dispatch_id: int) -> list[StageAssignment]:
        """Reserve a probed path (call before anything else changes the tables)."""
        out = []
        touch = self._touch
        for leg in result.legs:
            if leg.next_rr is not None:
                st, nxt = leg.next_rr
                st.rr = nxt
            tab = self.vgpu_tables[leg.vgpu]
            tab.reserve(leg.start_us, leg.end_us, owner_key(dispatch_id, leg.stage, COMPUTE))
            touch(tab)
            if leg.transfer_start_us is not None:
                key = owner_key(dispatch_id, leg.stage, TRANSFER)
                up, down = self.uplinks[leg.src_server], self.downlinks[leg.dst_server]
                up.reserve(leg.transfer_start_us, leg.transfer_end_us, key)
                down.reserve(leg.transfer_start_us, leg.transfer_end_us, key)
                touch(up)
                touch(down)
            out.append(StageAssignment(leg.stage, leg.vgpu, leg.start_us, leg.end_us,
                                       leg.transfer_start_us, leg.transfer_end_us))
        return out

    def correct(self, dispatch_id: int, stage: int, vgpu: str, start_us: float, end_us: float) -> None:
        """Feedback: the stage really ran [start, end) on ``vgpu``."""
        tab = self.vgpu_tables.get(vgpu)
        if tab is not None and tab.correct(owner_key(dispatch_id, stage, COMPUTE), start_us, end_us):
            self._touch(tab)

    def advance(self, dispatch_id: int, stages: list[StageAssignment], k: int, ready_us: float
                ) -> StageAssignment | None:
        """Stage ``k``'s input is ready at ``ready_us``, before its reservation: move the reservation (and its
        transfer's) to the earliest free slot from then on, if that is earlier. The new assignment, else None."""
        a = stages[k]
        tab = self.vgpu_tables.get(a.vgpu)
        if tab is None or a.vgpu not in self.up_vgpus or a.start_us <= ready_us + ADVANCE_MIN_US:
            return None
        links = self._links(stages, k) or ()
        key, xkey = owner_key(dispatch_id, a.stage, COMPUTE), owner_key(dispatch_id, a.stage, TRANSFER)
        held = [(tab, key, tab.find(key)), *((x, xkey, x.find(xkey)) for x in links)]
        if any(i < 0 for _, _, i in held):
            return None  # already pruned or released: nothing held to move
        # what the tables hold (feedback may have pushed it since the assignment was made)
        spans = [(t.starts[i], t.ends[i]) for t, _, i in held]
        for t, _, i in held:
            t.remove_at(i)
        # Each new interval ends at start + length, as earliest() tested it: (start + old end) - old start can
        # round one ulp past a slot that ends where the next interval starts (clocks near 5e10 µs: ulps of 8e-6 µs).
        (s0, e0), ts, te = spans[0], None, None
        if links:
            xd = spans[1][1] - spans[1][0]
            ts = earliest_common(links, ready_us, xd)
            te = ts + xd
        d = e0 - s0
        s = tab.earliest(ready_us if te is None else te, d)
        if s >= s0 - ADVANCE_MIN_US:  # no earlier slot: everything back as it was
            for (t, owner, _), (b, e) in zip(held, spans):
                t.reserve(b, e, owner)
            return None
        tab.reserve(s, s + d, key)
        for x in links:
            x.reserve(ts, te, xkey)  # type: ignore[arg-type]
        for t, _, _ in held:
            self._touch(t)
        return StageAssignment(a.stage, a.vgpu, s, s + d, ts, te)

    def _links(self, stages: list[StageAssignment], k: int) -> tuple[ResourceTable, ResourceTable] | None:
        """The (uplink, downlink) pair stage ``k``'s transfer holds, or None when it has none."""
        if k == 0 or stages[k].transfer_start_us is None:
            return None
        vgpus = self.topology.vgpus
        return self.uplinks[vgpus[stages[k - 1].vgpu].server], self.downlinks[vgpus[stages[k].vgpu].server]

    def release(self, dispatch_id: int, stages: list[StageAssignment], now_us: float) -> None:
        """Give back the reservations of ``stages`` (one dispatch) that start at or after ``now_us``: compute
        intervals on their vGPUs, transfers on both NICs."""
        for i, a in enumerate(stages):
            if a.start_us >= now_us:
                self._release(self.vgpu_tables.get(a.vgpu), owner_key(dispatch_id, a.stage, COMPUTE))
            links = self._links(stages, i)
            if links is not None and a.transfer_start_us >= now_us:  # type: ignore[operator]
                for x in links:
                    self._release(x, owner_key(dispatch_id, a.stage, TRANSFER))

    def _release(self, tab: ResourceTable | None, owner: int) -> None:
        if tab is not None and tab.release(owner):
            self._touch(tab)

    def set_vgpu_up(self, vgpu: str, up: bool, now_us: float) -> None:
        """Take a vGPU out of (or back into) probes; going down releases its reservations from now on."""
        if vgpu not in self.vgpu_tables:
            return
        self.dirty.update(self.topology.pipelines)
        if up:
            self.up_vgpus.add(vgpu)
        else:
            self.up_vgpus.discard(vgpu)
            self.vgpu_tables[vgpu].release_from(now_us)
        for pipes in self.pipelines.values():
            for cp in pipes:
                for st in cp.stages:
                    st.active = [x for x in st.pool if x[0] in self.up_vgpus]

    def prune(self, now_us: float) -> None:
        for tab in self.vgpu_tables.values():
            tab.prune(now_us)
        for tab in self.uplinks.values():
            tab.prune(now_us)
        for tab in self.downlinks.values():
            tab.prune(now_us)
