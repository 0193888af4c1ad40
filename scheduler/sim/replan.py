"""Simulated re-planning under a shifting model mix, with the migration PPipe describes.

The shared driver serves the current plan on the virtual cluster; the core's ``ReplanTrigger`` watches the
smoothed per-model rates. When it decides, ``plan_for`` (planner.entry.spec_planner, handed in from above) solves
for the measured mix; the old
plan keeps serving for ``solve_delay_s``, then ingest pauses: arrivals are held, the old driver dispatches
nothing more and its in-flight batches finish (the flush). When both the flush is done and ``pause_us``
has passed (about one SLO), a driver for the new plan adopts the old one's queued rows
(``Driver.take_queued``/``adopt``) and the held arrivals, with their original deadlines. Without ``plan_for``
the same loop serves the one static plan.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from plans.plan_json import Plan
from scheduler.core import make_scheduler
from scheduler.core.driver import DriverConfig
from scheduler.core.replan_trigger import ReplanConfig, ReplanDecision, ReplanTrigger
from scheduler.sim.engine import _Outcomes
from scheduler.sim.placement import topology_from_plan
from scheduler.sim.virtual import WAKE, VirtualRun


@dataclass(frozen=True)
class Migration:
    solve_delay_s: float = 1.0  # decision -> new plan generated and preloaded (the old plan serves meanwhile)
    pause_us: float | None = None  # ingest paused at least this long (None: the largest SLO)


@dataclass
class ReplanEvent:
    decided_us: float
    paused_us: float  # ingest paused, old in-flight batches flushing
    resumed_us: float = 0.0  # the new plan's driver took over
    reason: str = ""
    rates_rps: dict[str, float] = field(default_factory=dict)
    capacity_rps: dict[str, float] = field(default_factory=dict)  # the new plan's throughputs
    solve_s: float = 0.0  # wall time of the planner


@dataclass
class ShiftResult:
    arrivals: Sequence[tuple[float, str]]
    outcomes: dict[int, str]  # request index -> met | late | dropped
    duration_us: float
    events: list[ReplanEvent]

    def attainment(self, lo_us: float = 0.0, hi_us: float = float("inf"), model: str | None = None) -> float | None:
        """Met / offered among the requests that arrived in [lo_us, hi_us) (None: none arrived)."""
        idx = [i for i, (t, m) in enumerate(self.arrivals) if lo_us <= t < hi_us and (model is None or m == model)]
        return sum(self.outcomes.get(i) == "met" for i in idx) / len(idx) if idx else None

    def windows(self, window_s: float) -> list[tuple[float, float | None]]:
        """(window start in s, attainment of the requests that arrived in it)."""
        w = window_s * 1e6
        n = int(self.duration_us // w + (self.duration_us % w > 0))
        return [(k * window_s, self.attainment(k * w, (k + 1) * w)) for k in range(n)]


class _Generation:
    """One plan on the virtual cluster: its topology, executor and driver."""

    def __init__(self, plan: Plan, out: _Outcomes, duration_us: float, policy: str, config: DriverConfig,
                 seed: int) -> None:
        self.plan = plan
        topo = topology_from_plan(plan)
        run = VirtualRun(topo, make_scheduler(policy, topo), config, duration_us, seed=seed, on_done=out.done,
                         on_reject=out.dropped)
        self.ex, self.driver = run.executor, run.driver

    def in_flight(self) -> bool:
        return any(e[2] != WAKE for e in self.ex.heap)


def simulate_shifting(plan: Plan, arrivals: Sequence[tuple[float, str]], duration_us: float, *,
                      plan_for: Callable[[dict[str, float]], Plan] | None = None,
                      config: ReplanConfig | None = None, migration: Migration | None = None,
                      policy: str = "ppipe", driver: DriverConfig | None = None, seed: int = 0) -> ShiftResult:
    """Serve ``arrivals`` with ``plan``; with ``plan_for``, re-plan when the trigger says so (see module doc)."""
    slo = {m.name: m.slo_us for m in plan.models}
    out = _Outcomes(list(slo), arrivals, slo)
    dcfg = driver or DriverConfig.ideal()
    mig = migration or Migration()
    cur = _Generation(plan, out, duration_us, policy, dcfg, seed)
    old: _Generation | None = None  # flushing while ingest is paused
    trigger = ReplanTrigger(config or ReplanConfig(), plan.capacity_rps()) if plan_for is not None else None
    pending: tuple[float, Plan, ReplanEvent] | None = None  # (ready at, plan, its event)
    events: list[ReplanEvent] = []
    held: list[int] = []
    pause_end = 0.0
    n, ai = len(arrivals), 0
    while ai < n or cur.ex.heap or old is not None or pending is not None:
        times = [cur.ex.next_time(), arrivals[ai][0] if ai < n else float("inf")]
        if old is not None:
            times += [old.ex.next_time(), pause_end]
        if pending is not None:
            times.append(pending[0])
        if trigger is not None and ai < n:
            times.append(trigger.next_check_us())
        t = min(times)
        while ai < n and arrivals[ai][0] <= t:
            at, model = arrivals[ai]
            out.stats[model].offered += 1
            if trigger is not None:
                trigger.arrived(model, at)
            if old is not None:
                held.append(ai)
            else:
                cur.driver.submit(ai, model, at, at + slo[model])
            ai += 1
        cur.ex.run_due(t)
        if old is not None:
            old.ex.run_due(t)
            if t >= pause_end and not old.in_flight():  # flushed: the new plan takes over
                cur.driver.adopt(old.driver.take_queued(), t)
                for i in held:
                    at, model = arrivals[i]
                    cur.driver.submit(i, model, at, at + slo[model])
                held, old = [], None
                events[-1].resumed_us = t
                assert trigger is not None
                trigger.replanned(cur.plan.capacity_rps(), t)
        if pending is not None and t >= pending[0]:
            old, cur = cur, _Generation(pending[1], out, duration_us, policy, dcfg, seed + len(events))
            pending[2].paused_us = t
            pause_end = t + (mig.pause_us if mig.pause_us is not None else max(slo.values()))
            pending = None
        if trigger is not None:
            decision = trigger.check(t)
            if decision is not None and pending is None and old is None:
                pending = _solve(plan_for, decision, t, mig)  # type: ignore[arg-type]
                events.append(pending[2])
        if old is None:
            cur.ex.wake_at(cur.driver.step(t))
    return ShiftResult(arrivals, out.outcomes, duration_us, events)


def _solve(plan_for: Callable[[dict[str, float]], Plan], d: ReplanDecision, t: float, mig: Migration
           ) -> tuple[float, Plan, ReplanEvent]:
    t0 = time.perf_counter()
    new = plan_for(d.rates_rps)
    ev = ReplanEvent(d.at_us, 0.0, reason=d.reason, rates_rps=d.rates_rps, capacity_rps=new.capacity_rps(),
                     solve_s=time.perf_counter() - t0)
    return t + mig.solve_delay_s * 1e6, new, ev
