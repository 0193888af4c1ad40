"""The simulation loop: arrivals and the virtual cluster's events on a virtual clock, the shared driver
(scheduler.core.driver) deciding after each distinct instant, exactly as the sidecar runs it live."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from poolpipe_common.overheads import Overheads, sidecar_slo_us
from scheduler.core.api import Scheduler
from scheduler.core.driver import DriverConfig
from scheduler.core.topology import Topology
from scheduler.sim.virtual import Batch, Fault, VirtualRun, utilization

__all__ = ["Batch", "Fault", "ModelStats", "Overheads", "SimResult", "simulate"]


@dataclass
class ModelStats:
    offered: int = 0
    met: int = 0  # finished within the deadline
    late: int = 0  # finished after the deadline
    dropped: int = 0
    cancelled: int = 0  # the client went away before its answer (not counted against attainment)
    latencies_us: list[float] = field(default_factory=list)  # of finished requests

    @property
    def attainment(self) -> float:
        wanted = self.offered - self.cancelled
        return self.met / wanted if wanted else 1.0

    @property
    def finished(self) -> int:
        return self.met + self.late

    def latency_percentile(self, q: float) -> float | None:
        return float(np.percentile(self.latencies_us, q)) if self.latencies_us else None


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
    retries: int = 0  # requests re-enqueued after a failed stage
    margins_us: dict[str, float] = field(default_factory=dict)  # the driver's final deadline margin per model
    drop_reasons: Counter = field(default_factory=Counter)
    finish_us: dict[int, float] = field(default_factory=dict)  # request id -> when it finished (not dropped)
    stopped_early: bool = False  # every model with a miss budget spent it (simulate's miss_budget)
    warmup_us: float = 0.0  # requests that arrived before this were served but are not in ``models``

    @property
    def unfinished(self) -> int:
        return sum(s.offered - s.finished - s.dropped - s.cancelled for s in self.models.values())


class _Outcomes:
    """Counts every request's end exactly once."""

    def __init__(self, models: Sequence[str], arrivals: Sequence[tuple[float, str]], slo_us: dict[str, float],
                 overheads: Overheads | None = None, seed: int = 0, miss_budget: dict[str, int] | None = None,
                 stop_on_any: bool = False, input_bytes: dict[str, int] | None = None, warmup_us: float = 0.0):
        self.stats = {m: ModelStats() for m in models}
        # requests that arrive before this warm the run up: served, but not counted (stats, budgets)
        self.warmup_us = warmup_us
        # models whose misses may end the run early: once each has missed more than its budget, the run's verdict
        # on them is known (misses only grow), and a load search need not simulate the rest
        self.budget = dict(miss_budget or {})
        self.stop_on_any = stop_on_any  # one model over its budget settles the run (a joint verdict)
        self.spent = {m: 0 for m in self.budget}
        self.over: set[str] = set()
        self.arrivals = arrivals
        self.slo_us = slo_us
        # the way outside the sidecar's clock, per request: the client sees its answer this much later (a draw
        # from its measured distribution where the overheads carry one)
        ov = overheads or Overheads()
        self.front_us: list[float] = ov.front_at(np.random.default_rng(seed).random(len(arrivals))).tolist()
        if ov.front_per_mb_us:  # a larger input takes longer on its way in
            extra = {m: ov.front_extra_us(b) for m, b in (input_bytes or {}).items()}
            self.front_us = [f + extra.get(m, 0.0) for f, (_, m) in zip(self.front_us, arrivals)]
        self.outcomes: dict[int, str] = {}
        self.drop_reasons: Counter = Counter()
        self.finish_us: dict[int, float] = {}

    def _once(self, rid: int, outcome: str) -> None:
        if rid in self.outcomes:
            raise RuntimeError(f"request {rid} ended twice")
        self.outcomes[rid] = outcome

    def counted(self, rid: int) -> bool:
        """Whether ``rid`` arrived after the warm-up (and so counts in the stats)."""
        return self.arrivals[rid][0] >= self.warmup_us

    def stats_of(self, rid: int) -> ModelStats:
        """The stats ``rid`` counts in (a throw-away record for a warm-up request)."""
        model = self.arrivals[rid][1]
        return self.stats.setdefault(model, ModelStats()) if self.counted(rid) else ModelStats()

    def cancelled(self, rid: int, t: float) -> None:
        """The client of ``rid`` went away at ``t`` (ignored once the request has ended)."""
        if rid not in self.outcomes:
            self.outcomes[rid] = "cancelled"
            self.stats_of(rid).cancelled += 1

    def done(self, rid: int, t: float) -> None:
        if self.outcomes.get(rid) == "cancelled":
            return
        t += self.front_us[rid]
        at, model = self.arrivals[rid]
        s = self.stats_of(rid)
        met = t <= at + self.slo_us.get(model, 0.0)
        self._once(rid, "met" if met else "late")
        self.finish_us[rid] = t
        if met:
            s.met += 1
        else:
            s.late += 1
            self._missed(rid)
        s.latencies_us.append(t - at)

    def _missed(self, rid: int) -> None:
        model = self.arrivals[rid][1]
        if model in self.spent and self.counted(rid):
            self.spent[model] += 1
            if self.spent[model] > self.budget[model]:
                self.over.add(model)

    @property
    def settled(self) -> bool:
        """Every model with a miss budget has spent it (with stop_on_any: one has)."""
        if self.stop_on_any:
            return bool(self.over)
        return bool(self.budget) and len(self.over) == len(self.budget)

    def dropped(self, rid: int, model: str, reason: str) -> None:
        if self.outcomes.get(rid) == "cancelled":
            return
        self._once(rid, "dropped")
        self.stats_of(rid).dropped += 1
        if self.counted(rid):
            self.drop_reasons[reason] += 1
        self._missed(rid)


def input_bytes(topology: Topology) -> dict[str, int]:
    """Per model, the bytes of one request's input (what its first stage call sends)."""
    return {m: ps[0].stages[0].call_bytes[0] for m, ps in topology.pipelines.items() if ps and ps[0].stages}


def simulate(topology: Topology, scheduler: Scheduler, arrivals: Sequence[tuple[float, str]],
             duration_us: float, *, noise_cv: float = 0.0, seed: int = 0, record_timeline: bool = False,
             on_progress: Callable[[float], None] | None = None, driver: DriverConfig | None = None,
             overheads: Overheads | None = None, faults: Sequence[Fault] = (), interference: Any = None,
             priorities: Sequence[int] | None = None,
             cancels: Sequence[tuple[float, int]] = (), miss_budget: dict[str, int] | None = None,
             stop_on_any: bool = False, warmup_us: float = 0.0) -> SimResult:
    """Run ``scheduler`` over ``arrivals`` ((time_us, model) sorted by time) until every request ended.

    ``driver`` is the loop's setting (default: ``DriverConfig.ideal()``, the policy alone; give
    ``DriverConfig.live()`` and the live ``overheads`` to predict what the sidecar does). ``interference``
    (scheduler.sim.interference) slows each batch of a co-located plan by what runs beside it. ``priorities``:
    each arrival's ``priority`` parameter (Triton's; the topology's ``batcher`` controls say what it means).
    ``cancels``: (time_us, request index) at which a client goes away; a batch all of whose callers are gone
    before its next stage starts is abandoned and its reservations go back to the core, as live. ``miss_budget``:
    per model, how many late or dropped requests it may have; once every model named has missed more, the run stops
    (``SimResult.stopped_early``; with ``stop_on_any``, once one has): a load search knows the point fails.
    ``warmup_us``: requests arriving before it are served as any other but counted nowhere (the stats, the miss
    budget, the drop reasons; ``outcomes`` and ``finish_us`` keep them), so a run is judged warm."""
    if overheads is not None:  # the costs at the rate offered (a sidecar's stage calls cost more as it gets busier)
        overheads = overheads.at_rate(len(arrivals) / max(duration_us / 1e6, 1e-9),
                                      topology.stage_calls_per_request())
    front = overheads.front_us if overheads is not None else 0.0
    out = _Outcomes(list(topology.pipelines), arrivals, topology.slo_us, overheads, seed, miss_budget, stop_on_any,
                    input_bytes(topology), warmup_us)
    driver = replace(driver or DriverConfig.ideal(), front_us=front)  # its caps count what the deadlines leave out
    run = VirtualRun(topology, scheduler, driver, duration_us, noise_cv=noise_cv, seed=seed,
                     overheads=overheads, faults=faults, record_timeline=record_timeline, on_done=out.done,
                     on_reject=out.dropped, interference=interference, cancels=cancels,
                     on_cancel=out.cancelled)
    ex, drv = run.executor, run.driver
    dispatch_us: list[float] = []
    n_arr, ai = len(arrivals), 0
    next_progress = 0.0
    while (ai < n_arr or ex.heap) and not out.settled:
        t = ex.next_time()
        if ai < n_arr and arrivals[ai][0] <= t:
            t = arrivals[ai][0]
        while ai < n_arr and arrivals[ai][0] <= t:  # all arrivals at t, then all events at t
            at, model = arrivals[ai]
            out.stats_of(ai).offered += 1
            drv.submit(ai, model, at, at + sidecar_slo_us(topology.slo_us.get(model, 0.0), front),
                       priorities[ai] if priorities else 0)
            ai += 1
        ex.run_due(t)
        before = ex.dispatches
        t0 = time.perf_counter()
        ex.wake_at(drv.step(t))  # one decision per distinct instant
        made = ex.dispatches - before
        if made:
            dispatch_us.extend([(time.perf_counter() - t0) * 1e6 / made] * made)
        if on_progress is not None and t >= next_progress:
            on_progress(min(t, duration_us))
            next_progress = t + duration_us / 100
    return SimResult(out.stats, duration_us, ex.busy, utilization(topology, ex.busy, duration_us), ex.batch_sizes,
                     ex.dispatches, scheduler.probe_calls, dispatch_us, out.outcomes, ex.timeline,
                     ex.paths, drv.retries, dict(drv.margin_us), out.drop_reasons, out.finish_us,
                     stopped_early=out.settled, warmup_us=warmup_us)

