"""The registry of objectives, ``OBJECTIVES``: name -> ``(spec, request) -> Plan``. A new objective is one function
here; ``planner.plan`` dispatches on ``PlanRequest.objective`` and adds what every objective shares (application SLO
splits, co-location, recording the request). Each wraps the request's planner (planner.planners) and, where it
measures, an evaluator (planner.sustained.evaluators); no objective calls another.

- ``sustained`` (the default): the most request rate held at >= 99 % SLO attainment under the request's arrivals,
  with serving's per-stage costs counted (planner.sustained.search over candidate plans, measured).
- ``throughput``: PPipe's nominal objective, as much as the cluster serves with its pools always busy (the
  smallest throughput/weight of several models), with the request's planner; PARIS instance sizing instead where
  the request has a batch-size PDF. Kept to reproduce the paper; measured only with ``verify``.
- ``cost``: the least cost per hour whose plan sustains the request's rates at >= 99 % (planner.cost, asked for
  more until the evaluator says the rates hold).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Protocol

from planner.cost.least_cost import CostRequest, solve_cost
from planner.planners import Dedicated, Planner, Relabelled, planner_for
from planner.solvers.milp_solvers import SolverOptions
from planner.sustained.evaluators import NO_EVALUATOR, evaluator
from planner.sustained.rate_target import cheapest_sustaining
from planner.sustained.search import plan_sustained, with_serving_costs, with_sustainable
from plans.arrivals import parse_arrivals
from plans.plan_json import Plan
from plans.spec.planning_spec import PlanningSpec
from poolpipe_common.overheads import CALIBRATED_REACH, Overheads

COST_MARGIN = 0.1  # share of the SLO a cost plan keeps for queueing beyond the driver's margin (then measured)
# How far promises made with the default costs fell from what emulated servers of other hosts held live (issue 49's
# measurements: 0.48-1.01 over unseen models, 0.60 on 1 V100 + 3 P4): said with every plan made without --overheads.
UNCALIBRATED_RANGE = (0.48, 1.01)


def costs_note(request: ObjectiveInputs) -> tuple[str, ...]:
    """One line where the promise rests on this project's default per-stage costs, not the user's servers'."""
    if request.overheads is not None:
        return ()
    c = request.costs()
    lo, hi = UNCALIBRATED_RANGE
    return (f"costs uncalibrated: the promise assumes this project's default per-stage costs ({c.lead_us:.0f} + "
            f"{c.tail_us:.0f} us per stage call, {c.front_us / 1e3:.1f} ms outside the sidecar), measured on emulated "
            f"servers; on other hosts such promises held {lo:.2f}-{hi:.2f} of themselves live. Measure yours with "
            "'poolpipe calibrate DEPLOYMENT' (it writes ./poolpipe-costs.json, which plan then uses) and re-plan",)


def reach_note(plan: Plan, costs: Overheads | None) -> tuple[str, ...]:
    """One line where the promise rests on costs calibrated elsewhere (Overheads.extrapolated_to): at rates far below
    it, on a plan whose requests make other stage calls (its costs then scaled by Overheads.at_rate), on another
    plan, or with a larger deadline reserve than the plan keeps."""
    if costs is None:
        return ()
    promise, calls, layout = sum(plan.capacity_rps().values()), plan.stage_calls_per_request(), plan.layout_key()
    if not costs.extrapolated_to(promise, calls, layout):
        return ()
    other = " (not this one: it is cut, sized or batched otherwise)" if costs.calibrated_on_another(layout) else ""
    reach = CALIBRATED_REACH * costs.calibrated_rps
    held = f" (held to {CALIBRATED_REACH:g}x that: {reach:,.1f})" if costs.at_reach(promise) else ""
    served, kept = ((f" served with a {costs.calibrated_front_us / 1e3:.1f} ms deadline reserve",
                     f" and keeps {costs.front_us / 1e3:.1f} ms") if costs.reserve_unserved() else ("", ""))
    return (f"costs extrapolated: calibrated up to {costs.calibrated_rps:,.0f} req/s on a plan making "
            f"{costs.rate_calls_per_request:.2f} stage calls per request{other}{served}; this plan promises "
            f"{promise:,.1f} req/s{held} making {calls:.2f}{kept}. Calibrate its deployment ('poolpipe calibrate "
            "DEPLOYMENT') and re-plan",)


def limit_note(plan: Plan, costs: Overheads | None) -> tuple[str, ...]:
    """One line where a model's promise was held to what a calibration measured this plan's layout to hold
    (Overheads.measured_limits), above which the costs alone would have promised more."""
    key, rates = plan.layout_key(), plan.capacity_rps()
    held = [x for x in (costs.measured_limits if costs is not None else ())
            if x.layout == key and rates.get(x.model, 0.0) >= x.rps * (1 - 1e-9)]
    if not held:
        return ()
    return ("promise held to measurement: a calibration of this very plan saw SLO attainment fall below 99 % above "
            + ", ".join(f"{x.model} {x.rps:,.1f} req/s" for x in held)
            + ", and the costs it fitted alone put the plan no lower: the promise is held there. "
            "Calibrate again ('poolpipe calibrate DEPLOYMENT') after the servers change",)


def measured_notes(plan: Plan, costs: Overheads | None) -> tuple[str, ...]:
    return (*reach_note(plan, costs), *limit_note(plan, costs))


class ObjectiveInputs(Protocol):
    """What an objective reads of a planner.request.PlanRequest (which checks its names against OBJECTIVES)."""

    planner: str
    rates_rps: Mapping[str, float] | None
    prices: Mapping[str, float] | None
    paris_batch_pdf: Mapping[int, float] | None
    overheads: Overheads | None
    arrivals: str
    evaluator: str | None
    jobs: int | None

    def solver_options(self) -> SolverOptions: ...

    def costs(self) -> Overheads: ...


def throughput(spec: PlanningSpec, request: ObjectiveInputs) -> Plan:
    """The most throughput; with a PARIS batch-size PDF, PARIS's instance sizes (its notes say how it sized)."""
    return planner_for(request.planner, request.paris_batch_pdf).solve(spec, request.solver_options())


def sustained_planners(spec: PlanningSpec, request: ObjectiveInputs) -> list[Planner]:
    """The request's planner, and the narrower ones whose plans the sustained measure may prefer: the nominal
    objective favours what queueing can punish, so a co-located spec weighs dedicated plans (in a small pool sharing
    can cost more queueing than it saves), and ppipe weighs whole-model pools (pooled pipelines of one partition:
    each cut costs a stage call's lead and tail)."""
    main = planner_for(request.planner, request.paris_batch_pdf)
    out: list[Planner] = [main]
    if spec.colocate:
        out.append(Dedicated(main))
    if request.planner == "ppipe" and request.paris_batch_pdf is None and not spec.cluster.vgpu_sizes:
        out.append(Relabelled(Dedicated(planner_for("np")), "ppipe"))
    return out


def sustained(spec: PlanningSpec, request: ObjectiveInputs) -> Plan:
    """The candidate plan (over SLO margins, serving's costs counted) that sustains the most."""
    # ranking needs a measure: with evaluator none the closed form alone ranks (and its rate is recorded)
    name = "analytic" if request.evaluator == NO_EVALUATOR else request.evaluator
    plan, lines = plan_sustained(spec, sustained_planners(spec, request), request.solver_options(),
                                 parse_arrivals(request.arrivals), request.costs(), name, request.jobs)
    return replace(plan, notes=(*lines, *costs_note(request), *measured_notes(plan, request.overheads)), sustained={
        **(plan.sustained or {}), "costs": "default" if request.overheads is None else "measured"})


def cost(spec: PlanningSpec, request: ObjectiveInputs) -> Plan:
    """The least cost per hour whose plan sustains ``request.rates_rps`` at >= 99 % (``request.prices``)."""
    prices = dict(request.prices or {})
    if request.evaluator == NO_EVALUATOR:  # nominal rates, as the cost MILP reads them
        return solve_cost(spec, CostRequest(dict(request.rates_rps or {}), prices), request.planner,
                          request.solver_options())
    arrivals, costs = parse_arrivals(request.arrivals), request.costs()
    planned = with_serving_costs(spec, COST_MARGIN, costs)
    name, evaluate = evaluator(request.evaluator)
    plan, held, rounds = cheapest_sustaining(
        lambda rates: solve_cost(planned, CostRequest(rates, prices), request.planner, request.solver_options()),
        dict(request.rates_rps or {}), arrivals, costs, evaluate)
    line = (f"cost objective: sustains {', '.join(f'{m} {r:,.1f} req/s' for m, r in held.items())} at >= 99 % "
            f"under {arrivals} ({name}; {rounds} round(s))")
    out = with_sustainable(plan, held, arrivals, name)
    return replace(out, notes=(line, *costs_note(request), *measured_notes(out, request.overheads)))


OBJECTIVES: dict[str, Callable[[PlanningSpec, ObjectiveInputs], Plan]] = {
    "sustained": sustained, "throughput": throughput, "cost": cost}
