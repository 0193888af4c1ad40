"""The registry of what measures a candidate plan's sustainable rates: name -> ``(plan, arrivals, costs) ->
{model: req/s}``.

``analytic`` is the closed form (planner.sustained.capacity); ``simulated`` runs the shipped driver loop against a
virtual clock (scheduler.sim.sustain), which the planner imports directly: planning sits above the simulator.
"""

from __future__ import annotations

from collections.abc import Callable

from planner.sustained.capacity import predicted_rps
from plans.arrivals import Arrivals
from plans.plan_json import Plan
from poolpipe_common.errors import InputError
from poolpipe_common.overheads import Overheads
from scheduler.sim.sustain import PointRunner, Precision, judge_here, simulated_rps

# (plan, arrivals, costs, precision, points) -> {model: req/s}; precision None: the promise's; points: what judges a
# search's load points (scheduler.sim.sustain.PointRunner: here, or a pool's workers)
Evaluator = Callable[..., dict[str, float]]


def analytic_rps(plan: Plan, arrivals: Arrivals, costs: Overheads, precision: Precision | None = None,
                 points: PointRunner = judge_here) -> dict[str, float]:
    """The closed form (planner.sustained.capacity); it has no precision to choose and no points to judge."""
    return predicted_rps(plan, arrivals, costs)


def held_simulated_rps(plan: Plan, arrivals: Arrivals, costs: Overheads, precision: Precision | None = None,
                       points: PointRunner = judge_here) -> dict[str, float]:
    """The simulator's rates, each no higher than a calibration measured a plan of the same layout to hold
    (Overheads.held_to_limits, as predicted_rps holds the closed form's): a measurement of the very plan outranks a
    model of its costs."""
    return costs.held_to_limits(plan.layout_key(), simulated_rps(plan, arrivals, costs, precision, points=points))


EVALUATORS: dict[str, Evaluator] = {"simulated": held_simulated_rps, "analytic": analytic_rps}
DEFAULT_EVALUATOR = "simulated"
NO_EVALUATOR = "none"  # plans that reproduce the paper's nominal figures may skip the measurement


def known_evaluators() -> tuple[str, ...]:
    """Every evaluator's name, and ``none``."""
    return (*EVALUATORS, NO_EVALUATOR)


def evaluator(name: str | None = None) -> tuple[str, Evaluator]:
    """The named evaluator (default: the simulator); each holds its rates to what calibrations measured."""
    name = DEFAULT_EVALUATOR if name is None else name
    if name not in EVALUATORS:
        raise InputError(f"unknown evaluator {name!r}; registered: {', '.join(EVALUATORS)}")
    return name, EVALUATORS[name]
