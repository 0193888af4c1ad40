"""The registry of objectives, ``OBJECTIVES``: name -> ``(spec, request) -> (Plan, report lines)``. A new objective
is one function here; ``planner.plan`` dispatches on ``PlanRequest.objective`` and adds what every objective
shares (application SLO splits, co-location, recording the request).

- ``throughput``: as much as the cluster serves (the smallest throughput/weight of several models), with the
  request's planner; PARIS instance sizing instead where the request has a batch-size PDF.
- ``cost``: the least cost per hour that serves the request's rates at its prices (planner.cost).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

from planner.cost.least_cost import CostRequest, solve_cost
from planner.plan_json import Plan
from planner.planners import run_planner
from planner.sizing.paris import paris_plan
from planner.solvers.milp_solvers import SolverOptions
from planner.spec.planning_spec import PlanningSpec

Outcome = tuple[Plan, tuple[str, ...]]


class ObjectiveInputs(Protocol):
    """What an objective reads of a planner.request.PlanRequest (which checks its names against OBJECTIVES)."""

    planner: str
    rates_rps: Mapping[str, float] | None
    prices: Mapping[str, float] | None
    paris_batch_pdf: Mapping[int, float] | None

    def solver_options(self) -> SolverOptions: ...


def throughput(spec: PlanningSpec, request: ObjectiveInputs) -> Outcome:
    """The most throughput; with a PARIS batch-size PDF, PARIS's instance sizes (its lines say how it sized)."""
    if request.paris_batch_pdf is not None:
        plan, sizing = paris_plan(spec, request.paris_batch_pdf, request.solver_options())
        return plan, tuple(sizing.lines())
    return run_planner(spec, request.planner, request.solver_options()), ()


def cost(spec: PlanningSpec, request: ObjectiveInputs) -> Outcome:
    """The least cost per hour that serves ``request.rates_rps`` at ``request.prices``."""
    req = CostRequest(dict(request.rates_rps or {}), dict(request.prices or {}))
    return solve_cost(spec, req, request.planner, request.solver_options()), ()


OBJECTIVES: dict[str, Callable[[PlanningSpec, ObjectiveInputs], Outcome]] = {"throughput": throughput, "cost": cost}
