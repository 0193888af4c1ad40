"""The simulator's executor: a virtual cluster of vGPUs and server NICs on a virtual clock (heapq).

A vGPU runs one stage at a time in the order work becomes ready; a reserved stage
(``Dispatch.reserved``) does not start computing before its reserved start. A transfer between servers
holds the source server's uplink and the destination's downlink for bytes x batch / bandwidth. Stage
latency comes from the topology's tables, times optional log-normal noise and a slowdown; a stage with a latency
distribution (a variable-latency model) instead draws each request's level u once (its input is as slow at every
stage) and runs the batch for the distribution's latency at the largest u in it (padded to the longest). What a live
executor adds on top (``Overheads``: a lead from send to compute, a tail from compute end to the
response, late wake-ups of the driver) and failing servers (``Fault``) can be given, so that the shared
driver's margin learning and retries act here as they do live. As live, the executor holds no driver and answers
no caller: each stage's outcome goes to the report the driver gave with the dispatch (the driver completes the
dispatch and answers the callers, ``VirtualCallers``), and a fault's vGPU going down or coming back goes to the
owner's ``on_vgpu_change`` (``VirtualRun`` relays it to its driver, as the sidecar's fleet does).
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from poolpipe_common.overheads import Overheads, spread
from scheduler.core.api import Dispatch, RequestRow, Scheduler
from scheduler.core.driver import EARLY_SEND_US, Action, Driver, DriverConfig, Report, StageOutcome
from scheduler.core.topology import Pipeline, Topology

ARRIVE, WAKE, XFER, READY, END, DOWN, UP, CANCEL = range(8)


@dataclass(frozen=True)
class Fault:
    """vGPU ``vgpu`` fails every stage sent to it in [at_us, until_us); the driver hears of it at the first."""

    vgpu: str
    at_us: float
    until_us: float


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


class _Flight:
    """A dispatched batch moving through its stages."""

    __slots__ = ("d", "stages", "pipeline", "rows", "report", "starts", "ends", "pending", "send_at", "abandoned")

    def __init__(self, d: Dispatch, pipeline: Pipeline, rows: list[RequestRow], report: Report) -> None:
        self.d = d
        self.stages = list(d.stages)  # as dispatched, then as the driver's answers move them
        self.pipeline = pipeline
        self.rows = rows
        self.report = report
        self.starts: list[float] = [0.0] * len(d.stages)
        self.ends: list[float] = [0.0] * len(d.stages)  # each stage's compute end
        self.pending = -1  # the stage waiting to be sent (its transfer, its reserved start less the lead)
        self.send_at = math.inf  # when that stage is sent: up to then the flight can still be abandoned
        self.abandoned = False  # every caller went away before that stage started


def stage_latency(latency_us: dict[int, float], batch: int) -> float:
    """The table's latency at ``batch``: the next larger batch's, or linear beyond the largest."""
    lat = latency_us.get(batch)
    if lat is not None:
        return lat
    top = max(latency_us)
    if top >= batch:
        return latency_us[min(x for x in latency_us if x >= batch)]
    return latency_us[top] * batch / top


class VirtualExecutor:
    """Executes dispatches on the virtual clock; the simulation loop pops its events with ``pop_due``."""

    def __init__(self, topology: Topology, duration_us: float, *, noise_cv: float = 0.0, seed: int = 0,
                 overheads: Overheads | None = None, faults: Sequence[Fault] = (), record_timeline: bool = False,
                 on_vgpu_change: Callable[[str, bool, float], None], interference: Any = None,
                 cancels: Sequence[tuple[float, Any]] = (), on_cancel: Callable[[Any, float], None] | None = None
                 ) -> None:
        self.topology = topology
        self.duration_us = duration_us
        self.rng = np.random.default_rng(seed + 7919)
        self.sigma = math.sqrt(math.log(1.0 + noise_cv * noise_cv)) if noise_cv > 0 else 0.0
        self.ov = overheads or Overheads()
        self.cost_rng = np.random.default_rng(seed + 104729)  # each call's lead and tail (Overheads.lead_shape)
        self.server = {v: vg.server for v, vg in topology.vgpus.items()}
        self.pipeline_of = {p.id: p for ps in topology.pipelines.values() for p in ps}
        self.busy = {v: 0.0 for v in topology.vgpus}
        self.vfree = {v: 0.0 for v in topology.vgpus}
        self.upfree: dict[str, float] = {}
        self.downfree: dict[str, float] = {}
        self.down: set[str] = set()
        self.record_timeline = record_timeline
        self.timeline: list[Batch] = []
        self.paths: dict[int, list[str]] = {}
        self.on_vgpu_change = on_vgpu_change  # (vgpu, up, now): a fault took it down (heard at a failed stage) or ended
        self.interference = interference  # co-located plans: scheduler.sim.interference.CoRunInterference
        self.batch_sizes: Counter = Counter()
        self.dispatches = 0
        self.now = 0.0
        self.heap: list = []
        self._seq = 0
        self._wakes: set[float] = set()
        self._level: dict[Any, float] = {}  # request (a row's call) -> its quantile level (variable-latency stages)
        for f in faults:
            self.push(f.at_us, DOWN, f.vgpu, 0)
            self.push(f.until_us, UP, f.vgpu, 0)
        # clients that go away: (when, call); a batch all of whose callers are gone stops before its next stage
        self.on_cancel = on_cancel
        self.cancelled: set[Any] = set()
        self._track = bool(cancels)  # which flight each call rides (only when clients may go away)
        self._waiting: dict[Any, _Flight] = {}  # call -> its flight while a stage is on its way
        for when, call in cancels:
            self.push(when, CANCEL, call, 0)

    # -- the Executor protocol ------------------------------------------------------------------------------
    def execute(self, dispatch: Dispatch, rows: list[RequestRow], report: Report) -> None:
        fl = _Flight(dispatch, self.pipeline_of[dispatch.pipeline_id], rows, report)
        self.dispatches += 1
        self.batch_sizes[len(rows)] += 1
        if self.record_timeline:
            self.paths[dispatch.id] = [a.vgpu for a in dispatch.stages]
        if self.cancelled and all(r.call in self.cancelled for r in rows):
            report(StageOutcome(dispatch, 0, self.now, gave_up=True))  # as live: nobody waits, nothing runs
            return
        self._advance(fl, 0, self.now)

    def forget(self, row: RequestRow) -> None:
        """``row`` ended (answered or rejected): its request's latency level is no longer needed."""
        self._level.pop(row.call, None)

    # -- events ---------------------------------------------------------------------------------------------
    def push(self, when: float, kind: int, obj: Any, k: int) -> None:
        self._seq += 1
        heapq.heappush(self.heap, (when, self._seq, kind, obj, k))

    def next_time(self) -> float:
        return self.heap[0][0] if self.heap else math.inf

    def wake_at(self, w: float | None) -> None:
        """The driver asked to be stepped at ``w``; it comes late by the configured lateness."""
        if w is None:
            return
        if w <= self.now:
            w = self.now + 1.0
        if self.ov.wake_late_us > 0:
            w += float(self.rng.exponential(self.ov.wake_late_us))
        if w not in self._wakes:
            self._wakes.add(w)
            self.push(w, WAKE, w, 0)

    def run_due(self, t: float) -> None:
        """Handle every event at or before ``t``."""
        self.now = t
        heap = self.heap
        while heap and heap[0][0] <= t:
            _, _, kind, obj, k = heapq.heappop(heap)
            if kind == WAKE:
                self._wakes.discard(obj)
            elif kind == XFER:
                self._transfer(obj, k, t)
            elif kind == READY:
                self._compute(obj, k, t)
            elif kind == END:
                self._stage_end(obj, k, t)
            elif kind == DOWN:
                self.down.add(obj)
            elif kind == UP:
                self.down.discard(obj)
                self.on_vgpu_change(obj, True, t)
            elif kind == CANCEL:
                self._cancel(obj, t)

    def _cancel(self, call: Any, t: float) -> None:
        """``call``'s client went away: its flight, if every caller is gone before the stage on its way starts,
        is abandoned and the driver told (it gives the reservations back)."""
        self.cancelled.add(call)
        if self.on_cancel is not None:
            self.on_cancel(call, t)
        fl = self._waiting.get(call)
        if fl is None or t >= fl.send_at or not all(r.call in self.cancelled for r in fl.rows):
            return
        fl.abandoned = True
        self._unwait(fl)
        for r in fl.rows:
            self._level.pop(r.call, None)
        fl.report(StageOutcome(fl.d, fl.pending, t, gave_up=True))

    def _unwait(self, fl: _Flight) -> None:
        for r in fl.rows:
            self._waiting.pop(r.call, None)

    def _advance(self, fl: _Flight, k: int, t: float) -> None:
        """Stage k's input is at hand at t: transfer it if it crosses servers, then send it."""
        d = fl.d
        a = fl.stages[k]
        st = fl.pipeline.stages[a.stage]
        fl.pending, fl.send_at = k, math.inf
        if self._track:
            for r in fl.rows:
                self._waiting[r.call] = fl
        crosses = (self.server[fl.stages[k - 1].vgpu] != self.server[a.vgpu] if k > 0
                   else a.transfer_start_us is not None)
        if st.in_bytes_per_request > 0 and crosses:
            ts = a.transfer_start_us if d.reserved and a.transfer_start_us is not None else t
            self.push(max(ts, t), XFER, fl, k)
        else:
            self._send(fl, k, t)

    def _send(self, fl: _Flight, k: int, t: float) -> None:
        """Send stage k no earlier than its reserved start less the lead; it reaches the server a lead later."""
        a = fl.stages[k]
        lead = self.ov.lead_for(fl.pipeline.stages[a.stage].call_bytes[0] * len(fl.d.requests))
        send = a.start_us - lead if fl.d.reserved and a.start_us - lead >= t + EARLY_SEND_US else t
        fl.send_at = send
        self.push(send + lead * self._spread(self.ov.lead_shape), READY, fl, k)

    def _spread(self, shape: tuple[float, ...]) -> float:
        """A call's cost over its mean, drawn (1 where the costs have no shape: no draw, so the rest is as it was)."""
        return spread(shape, float(self.cost_rng.random())) if shape else 1.0

    def _transfer(self, fl: _Flight, k: int, t: float) -> None:
        if fl.abandoned:
            return
        d = fl.d
        a = fl.stages[k]
        st = fl.pipeline.stages[a.stage]
        dur = st.in_bytes_per_request * len(d.requests) * self.topology.us_per_byte
        dst = self.server[a.vgpu]
        if k > 0:
            src = self.server[fl.stages[k - 1].vgpu]
            s0 = max(t, self.upfree.get(src, 0.0), self.downfree.get(dst, 0.0))
            self.upfree[src] = s0 + dur
        else:
            s0 = max(t, self.downfree.get(dst, 0.0))
        self.downfree[dst] = s0 + dur
        self._send(fl, k, s0 + dur)

    def _compute(self, fl: _Flight, k: int, t: float) -> None:
        if fl.abandoned:
            return
        if self._track:
            self._unwait(fl)
        d = fl.d
        a = fl.stages[k]
        v = a.vgpu
        if v in self.down:
            self._fail(fl, k, v, t)
            return
        s0 = max(t, self.vfree[v])
        b = len(d.requests)
        st = fl.pipeline.stages[a.stage]
        # the table's latency runs to the answer; the vGPU computes for it less the stage's hop (the tail), and the
        # answer comes a tail after the compute (END below)
        hop = st.hop_us.get(b, max(st.hop_us.values(), default=0.0))
        if st.latency_dist is not None and b in st.latency_dist:
            level = self._level
            u = max(level[r.call] if r.call in level else level.setdefault(r.call, float(self.rng.random()))
                    for r in fl.rows)
            lat = (float(st.latency_dist[b].quantile(u)) - hop) * self.ov.slowdown
        else:
            lat = (stage_latency(st.latency_us, b) - hop) * self.ov.slowdown
        if self.interference is not None:
            lat *= self.interference.factor(v, s0, self.vfree, self.busy)
        if self.sigma:
            lat *= math.exp(self.rng.normal(-0.5 * self.sigma * self.sigma, self.sigma))
        e = s0 + lat
        self.vfree[v] = e
        self.busy[v] += max(0.0, min(e, self.duration_us) - min(s0, self.duration_us))
        fl.starts[k], fl.ends[k] = s0, e
        if self.record_timeline:
            self.timeline.append(Batch(v, s0, e, d.id, d.model, a.stage, b))
        self.push(e + self.ov.tail_for(st.call_bytes[1] * b) * self._spread(self.ov.tail_shape), END, fl, k)

    def _stage_end(self, fl: _Flight, k: int, t: float) -> None:
        """Stage k's response is back: report it; the driver says whether the next stage runs or the batch is done."""
        step = fl.report(StageOutcome(fl.d, k, t, (fl.starts[k], fl.ends[k]), wanted=fl.rows))
        if step.action is Action.NEXT_STAGE:
            if step.next is not None:
                fl.stages[k + 1] = step.next
            self._advance(fl, k + 1, t)

    def _fail(self, fl: _Flight, k: int, vgpu: str, t: float) -> None:
        """Stage k reached a failed vGPU: it goes out of service, then the driver retries or rejects the batch."""
        self.on_vgpu_change(vgpu, False, t)
        fl.report(StageOutcome(fl.d, k, t, failed=f"vGPU {vgpu} failed", wanted=fl.rows))


class VirtualCallers:
    """The simulated requests' callers, whom the driver answers: a finished request's time, a rejected one's
    reason, to the simulation's outcome log (by each row's call: the arrival it is)."""

    def __init__(self, executor: VirtualExecutor, on_done: Callable[[Any, float], None],
                 on_reject: Callable[[Any, str, str], None]) -> None:
        self.executor = executor
        self.on_done = on_done
        self.on_reject = on_reject

    def finish(self, dispatch: Dispatch, rows: Sequence[RequestRow], outputs: Any, now_us: float) -> None:
        if dispatch.final:
            for row in rows:
                self.executor.forget(row)
                self.on_done(row.call, now_us)

    def reject(self, row: RequestRow, reason: str, *, failure: bool = False) -> None:
        self.executor.forget(row)
        self.on_reject(row.call, row.model, reason)

    def fail(self, dispatch: Dispatch, rows: Sequence[RequestRow], error: Any) -> None:  # (a virtual stage never errs)
        for row in rows:
            self.executor.forget(row)
            self.on_reject(row.call, dispatch.model, str(error))


class VirtualRun:
    """One scheduler on the virtual cluster: the executor, the driver that runs the scheduler on it and answers the
    callers (``on_done``, ``on_reject``), and the fault schedule's vGPU changes relayed to that driver (as the
    sidecar's fleet tells its planned service)."""

    def __init__(self, topology: Topology, scheduler: Scheduler, config: DriverConfig, duration_us: float, *,
                 on_done: Callable[[Any, float], None], on_reject: Callable[[Any, str, str], None],
                 **executor_args: Any) -> None:
        self.executor = VirtualExecutor(topology, duration_us, on_vgpu_change=self._vgpu_changed, **executor_args)
        self.callers = VirtualCallers(self.executor, on_done, on_reject)
        self.driver = Driver(scheduler, topology, self.executor, config, callers=self.callers)

    def _vgpu_changed(self, vgpu: str, up: bool, now_us: float) -> None:
        self.driver.set_vgpu_up(vgpu, up, now_us)


def utilization(topology: Topology, busy: dict[str, float], duration_us: float) -> dict[str, float]:
    """Busy fraction per GPU type: Σ vGPU busy time / V over (GPUs of that type in the cluster x duration)."""
    per_type: dict[str, float] = {}
    for v, b in busy.items():
        vg = topology.vgpus[v]
        per_type[vg.gpu_type] = per_type.get(vg.gpu_type, 0.0) + b / vg.v
    out = {}
    for gtype in sorted(set(per_type) | set(topology.gpu_counts)):
        n = topology.gpu_counts.get(gtype) or len({v.split(":")[0] for v in busy
                                                   if topology.vgpus[v].gpu_type == gtype})
        out[gtype] = per_type.get(gtype, 0.0) / (n * duration_us) if n and duration_us > 0 else 0.0
    return out
