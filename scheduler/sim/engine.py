"""Discrete-event driver of a Scheduler on a virtual clock (heapq): arrivals, stage executions,
NIC transfers, completions and drops, with the same driver contract as the live sidecar.

Executors: a vGPU runs one stage at a time in the order work becomes ready; a reserved stage
(``Dispatch.reserved``) does not start before its reserved start. A transfer between servers holds
the source server's uplink and the destination's downlink for bytes x batch / bandwidth. Stage
latency comes from the topology's profile tables, times optional log-normal noise. Measured stage
timings are reported back to the policy (feedback correction).
"""

from __future__ import annotations

import heapq
import math
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from scheduler.core.api import Dispatch, Request, Scheduler
from scheduler.core.topology import Topology

_ARRIVE, _WAKE, _XFER, _READY, _END = 0, 1, 2, 3, 4


@dataclass
class ModelStats:
    offered: int = 0
    met: int = 0  # finished within the deadline
    late: int = 0  # finished after the deadline
    dropped: int = 0
    latencies_us: list[float] = field(default_factory=list)  # of finished requests

    @property
    def attainment(self) -> float:
        return self.met / self.offered if self.offered else 1.0

    @property
    def finished(self) -> int:
        return self.met + self.late

    def latency_percentile(self, q: float) -> float | None:
        return float(np.percentile(self.latencies_us, q)) if self.latencies_us else None


@dataclass
class Batch:
    """One executed stage, for timelines."""

    vgpu: str
    start_us: float
    end_us: float
    dispatch_id: int
    model: str
    stage: int
    batch: int


@dataclass
class SimResult:
    models: dict[str, ModelStats]
    duration_us: float
    busy_us: dict[str, float]  # vGPU -> busy time inside [0, duration)
    utilization: dict[str, float]  # GPU type -> busy fraction over all the cluster's GPUs of that type
    batch_sizes: Counter
    dispatches: int
    probe_calls: int
    dispatch_us: list[float]  # wall time of the decision per dispatch
    outcomes: dict[int, str]  # request id -> "met" | "late" | "dropped"
    timeline: list[Batch] = field(default_factory=list)
    dispatch_paths: dict[int, list[str]] = field(default_factory=dict)

    @property
    def unfinished(self) -> int:
        return sum(s.offered - s.finished - s.dropped for s in self.models.values())


class _Flight:
    """A dispatched batch moving through its stages."""

    __slots__ = ("d", "pipeline", "starts")

    def __init__(self, d: Dispatch, pipeline) -> None:
        self.d = d
        self.pipeline = pipeline
        self.starts: list[float] = [0.0] * len(d.stages)


def simulate(topology: Topology, scheduler: Scheduler, arrivals: Sequence[tuple[float, str]],
             duration_us: float, *, noise_cv: float = 0.0, seed: int = 0, record_timeline: bool = False,
             on_progress: Callable[[float], None] | None = None) -> SimResult:
    """Run ``scheduler`` over ``arrivals`` ((time_us, model) sorted by time) until every request ended."""
    rng = np.random.default_rng(seed + 7919)
    sigma = math.sqrt(math.log(1.0 + noise_cv * noise_cv)) if noise_cv > 0 else 0.0
    vg_server = {v: vg.server for v, vg in topology.vgpus.items()}
    us_per_byte = topology.us_per_byte
    pipeline_of = {p.id: p for ps in topology.pipelines.values() for p in ps}
    stats = {m: ModelStats() for m in topology.pipelines}
    outcomes: dict[int, str] = {}
    busy = {v: 0.0 for v in topology.vgpus}
    vfree = {v: 0.0 for v in topology.vgpus}
    upfree: dict[str, float] = {}
    downfree: dict[str, float] = {}
    batch_sizes: Counter = Counter()
    dispatch_us: list[float] = []
    timeline: list[Batch] = []
    paths: dict[int, list[str]] = {}
    heap: list = []
    seq = 0
    wakes: set[float] = set()
    n_arr = len(arrivals)
    ai = 0
    dispatches = 0

    def finish(req: Request, t: float) -> None:
        s = stats.setdefault(req.model, ModelStats())
        if req.id in outcomes:
            raise RuntimeError(f"request {req.id} ended twice")
        if t <= req.deadline_us:
            s.met += 1
            outcomes[req.id] = "met"
        else:
            s.late += 1
            outcomes[req.id] = "late"
        s.latencies_us.append(t - req.arrival_us)

    def push(when: float, kind: int, fl: "_Flight | float", k: int) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(heap, (when, seq, kind, fl, k))

    def _advance(fl: _Flight, k: int, t: float) -> None:
        """Stage k's input is at hand at t (previous stage done): transfer it if it crosses servers."""
        d = fl.d
        a = d.stages[k]
        st = fl.pipeline.stages[a.stage]
        if st.in_bytes_per_request > 0 and (vg_server[d.stages[k - 1].vgpu] != vg_server[a.vgpu] if k > 0
                                            else a.transfer_start_us is not None):
            ts = a.transfer_start_us if d.reserved and a.transfer_start_us is not None else t
            push(ts if ts > t else t, _XFER, fl, k)
        else:
            push(a.start_us if d.reserved and a.start_us > t else t, _READY, fl, k)

    next_progress = 0.0
    while ai < n_arr or heap:
        t = heap[0][0] if heap else math.inf
        if ai < n_arr and arrivals[ai][0] <= t:
            t = arrivals[ai][0]
        # all arrivals at t, then all events at t
        while ai < n_arr and arrivals[ai][0] <= t:
            at, model = arrivals[ai]
            slo = topology.slo_us.get(model, 0.0)
            stats.setdefault(model, ModelStats()).offered += 1
            scheduler.enqueue(Request(ai, model, at, at + slo))
            ai += 1
        while heap and heap[0][0] <= t:
            _, _, kind, fl, k = heapq.heappop(heap)
            if kind == _WAKE:
                wakes.discard(fl)
                continue
            d = fl.d
            a = d.stages[k]
            b = len(d.requests)
            if kind == _XFER:
                st = fl.pipeline.stages[a.stage]
                dur = st.in_bytes_per_request * b * us_per_byte
                dst = vg_server[a.vgpu]
                if k > 0:
                    src = vg_server[d.stages[k - 1].vgpu]
                    s0 = max(t, upfree.get(src, 0.0), downfree.get(dst, 0.0))
                    upfree[src] = s0 + dur
                else:
                    s0 = max(t, downfree.get(dst, 0.0))
                downfree[dst] = s0 + dur
                ready = s0 + dur
                if d.reserved and a.start_us > ready:
                    ready = a.start_us
                push(ready, _READY, fl, k)
            elif kind == _READY:
                v = a.vgpu
                s0 = t if vfree[v] <= t else vfree[v]
                st = fl.pipeline.stages[a.stage]
                lat = st.latency_us.get(b)
                if lat is None:
                    lat = st.latency_us[min(x for x in st.latency_us if x >= b)] if max(st.latency_us) >= b \
                        else st.latency_us[max(st.latency_us)] * b / max(st.latency_us)
                if sigma:
                    lat *= math.exp(rng.normal(-0.5 * sigma * sigma, sigma))
                e = s0 + lat
                vfree[v] = e
                busy[v] += max(0.0, min(e, duration_us) - min(s0, duration_us))
                fl.starts[k] = s0
                if record_timeline:
                    timeline.append(Batch(v, s0, e, d.id, d.model, a.stage, b))
                push(e, _END, fl, k)
            else:  # _END
                scheduler.report(d.id, a.stage, fl.starts[k], t)
                if k + 1 < len(d.stages):
                    _advance(fl, k + 1, t)
                elif d.final:
                    for r in d.requests:
                        finish(r, t)
        # one decision per distinct instant
        t0 = time.perf_counter()
        res = scheduler.step(t)
        el = time.perf_counter() - t0
        if res.dispatches:
            per = el * 1e6 / len(res.dispatches)
            for d in res.dispatches:
                dispatch_us.append(per)
                dispatches += 1
                batch_sizes[len(d.requests)] += 1
                if record_timeline:
                    paths[d.id] = [a.vgpu for a in d.stages]
                fl = _Flight(d, pipeline_of[d.pipeline_id])
                _advance(fl, 0, t)
        for dr in res.drops:
            r = dr.request
            if r.id in outcomes:
                raise RuntimeError(f"request {r.id} ended twice")
            outcomes[r.id] = "dropped"
            stats.setdefault(r.model, ModelStats()).dropped += 1
        w = res.wake_at_us
        if w is not None:
            if w <= t:
                w = t + 1.0
            if w not in wakes:
                wakes.add(w)
                push(w, _WAKE, w, 0)
        if on_progress is not None and t >= next_progress:
            on_progress(min(t, duration_us))
            next_progress = t + duration_us / 100

    util = _utilization(topology, busy, duration_us)
    probes = int(getattr(scheduler, "probe_calls", 0))
    return SimResult(stats, duration_us, busy, util, batch_sizes, dispatches, probes, dispatch_us, outcomes,
                     timeline, paths)


def _utilization(topology: Topology, busy: dict[str, float], duration_us: float) -> dict[str, float]:
    """Busy fraction per GPU type: Σ vGPU busy time / V over (GPUs of that type in the cluster x duration)."""
    per_type: dict[str, float] = {}
    for v, b in busy.items():
        vg = topology.vgpus[v]
        per_type[vg.gpu_type] = per_type.get(vg.gpu_type, 0.0) + b / vg.v
    out = {}
    for gtype in sorted(set(per_type) | set(topology.gpu_counts)):
        n = topology.gpu_counts.get(gtype) or len({v.split(":")[0] for v in busy if topology.vgpus[v].gpu_type == gtype})
        out[gtype] = per_type.get(gtype, 0.0) / (n * duration_us) if n and duration_us > 0 else 0.0
    return out
