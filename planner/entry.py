"""The one planning entry point: ``plan(spec, request) -> PlanOutcome``, what ``poolpipe plan`` does for its flags.

In order: each application's SLO is split into module budgets (planner.apps, at the request's prices) and every
model is planned under the least budget a module running it was given; the spec is co-located if the request
says so; the request's objective plans it (planner.objectives: the planner, PARIS sizing, cost); the plan gets
the applications (module budgets, rates, dummy-request flags, for ``generate``) and the request. The sustained and
cost objectives measure every model's ``sustainable_rps`` (planner.sustained); the throughput objective only when the
request says ``verify``; a measured plan records the per-stage costs its promise assumed (plans.plan_costs). The
CLI, the sidecar's re-planner, the simulator's re-planning and the demo all plan through here; a re-planner re-weights
the spec by the measured rates with ``reweighted`` first.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from planner.apps.app_plan import plan_applications, spec_under_budgets
from planner.objectives import OBJECTIVES
from planner.request import PlanRequest
from planner.sustained.search import annotate
from plans.arrivals import parse_arrivals
from plans.plan_costs import with_assumed_costs
from plans.plan_json import Plan
from plans.spec.planning_spec import PlanningSpec
from poolpipe_common.errors import InputError

MIN_WEIGHT_SHARE = 0.01  # a model measured at (almost) no rate still gets this share of the busiest one's weight


@dataclass(frozen=True)
class PlanOutcome:
    """The plan, the spec it was planned for (module budgets and co-location applied), and what ``poolpipe plan``
    prints after the plan's tables (PARIS's sizing, each application's split)."""

    plan: Plan
    spec: PlanningSpec
    lines: tuple[str, ...] = ()


def plan(spec: PlanningSpec, request: PlanRequest | None = None) -> PlanOutcome:
    """Plan ``spec`` as ``request`` says (default: ``PlanRequest()``, the CLI's defaults)."""
    request = request or PlanRequest()
    if request.prices and request.objective != "cost" and not spec.applications:
        raise InputError("--rate and --price go with --objective cost (--price also with a spec's applications)")
    apps = plan_applications(spec, request.app_split, request.prices or {}) if spec.applications else ()
    planned = spec_under_budgets(spec, apps) if apps else spec
    if request.colocate:
        planned = replace(planned, colocate=True)
    result = OBJECTIVES[request.objective](planned, request)
    if request.verify and any(m.sustainable_rps is None for m in result.models):
        result = annotate(result, parse_arrivals(request.arrivals), request.costs(), request.evaluator,
                          request.jobs)
    if result.sustained is not None:  # what the promise assumed, for the sidecar's promise check
        result = replace(result, sustained=with_assumed_costs(result.sustained, request.costs()))
    result = replace(result, applications=tuple(a.to_plan_dict() for a in apps), request=request.to_dict())
    return PlanOutcome(result, planned, (*result.notes, *(x for a in apps for x in a.lines())))


def reweighted(spec: PlanningSpec, rates_rps: Mapping[str, float]) -> PlanningSpec:
    """The spec with each model's weight set to its measured rate (at least MIN_WEIGHT_SHARE of the largest)."""
    top = max(rates_rps.values(), default=1.0) or 1.0
    return replace(spec, models=tuple(replace(m, weight=max(rates_rps.get(m.name, 0.0), MIN_WEIGHT_SHARE * top))
                                      for m in spec.models))


def spec_planner(spec: PlanningSpec, request: PlanRequest | None = None) -> Callable[[dict[str, float]], Plan]:
    """A re-planner's ``plan_for``: ``plan`` on the spec re-weighted by the measured rates, as ``request`` says
    (default: the CLI's, with a 30 s time limit). The simulator's re-planning (scheduler.sim.replan) receives it."""
    req = request or PlanRequest(time_limit_s=30.0)

    def plan_for(rates_rps: dict[str, float]) -> Plan:
        return plan(reweighted(spec, rates_rps), req).plan
    return plan_for
