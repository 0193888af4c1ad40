"""The simulator as the planner's evaluator: a plan's sustainable rate per model at >= 99 % SLO attainment,
found by bisection over load factors, each point a run of the shipped driver loop (the sidecar's live margins
and lateness learning) with the per-stage costs the sidecar measures. Offered to the planner as the entry point
``simulated`` of group ``poolpipe.evaluators`` (pyproject.toml), since the planner sits below the simulator.
"""

from __future__ import annotations

from planner.plan_json import Plan
from planner.sustained.arrivals import Arrivals
from poolpipe_common.overheads import Overheads
from scheduler.sim.sweep import TARGET_ATTAINMENT, PointJob, run_point
from workloads.arrivals import parse_trace

MIN_REQUESTS = 12_000  # per point, so that 1 % of misses is > 100 requests
MIN_DURATION_S, MAX_DURATION_S = 15.0, 60.0
RESOLUTION = 0.01  # of the nominal rate
MAX_POINTS = 12
HIGHEST = 1.05  # a plan may sustain slightly more than its nominal rate (its pools are rounded up)


def _duration_s(plan: Plan) -> float:
    total = sum(m.throughput_rps for m in plan.models) or 1.0
    return min(MAX_DURATION_S, max(MIN_DURATION_S, MIN_REQUESTS / total))


def simulated_rps(plan: Plan, arrivals: Arrivals, costs: Overheads, seed: int = 0) -> dict[str, float]:
    """Per model, the largest rate (to RESOLUTION of its nominal one) the simulator serves at >= 99 %, every
    model offered the same fraction of its nominal rate (as the max-min objective weighs them)."""
    rates = {m.name: m.throughput_rps for m in plan.models}
    trace = parse_trace(arrivals.text)
    duration = _duration_s(plan)
    lo = {m: 0.0 for m in rates}
    hi = {m: HIGHEST for m in rates}
    for _ in range(MAX_POINTS):
        widest = max(rates, key=lambda m: hi[m] - lo[m])
        if hi[widest] - lo[widest] <= RESOLUTION:
            break
        lf = round(0.5 * (lo[widest] + hi[widest]), 4)
        summary, _ = run_point(PointJob(plan, rates, "ppipe", trace, lf, duration, seed, driver="live",
                                        overheads=costs))
        for m, point in summary["models"].items():  # a point outside a model's bracket tells it nothing new
            if not lo[m] < lf < hi[m]:
                continue
            if point["slo_attainment"] + 1e-12 >= TARGET_ATTAINMENT:
                lo[m] = lf
            else:
                hi[m] = lf
    return {m: lo[m] * rates[m] for m in rates}
