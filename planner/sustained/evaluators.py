"""The registry of what measures a candidate plan's sustainable rates: name -> ``(plan, arrivals, costs) ->
{model: req/s}``.

``analytic`` (planner.sustained.capacity) is always here. The simulator, which runs the shipped driver loop
against a virtual clock, sits in a layer above the planner, so the planner cannot import it: it is offered as
a package entry point (group ``poolpipe.evaluators``, ``simulated = scheduler.sim.sustain:simulated_rps`` in
pyproject.toml) and loaded on first use, in any process that plans (the CLI, the sidecar's re-planner worker,
the demo), so every plan the product makes is measured by it.
"""

from __future__ import annotations

from collections.abc import Callable

from planner.plan_json import Plan
from planner.sustained.arrivals import Arrivals
from planner.sustained.capacity import predicted_rps
from poolpipe_common.errors import InputError
from poolpipe_common.overheads import Overheads

Evaluator = Callable[[Plan, Arrivals, Overheads], dict[str, float]]
EVALUATORS: dict[str, Evaluator] = {"analytic": predicted_rps}
PREFERRED = ("simulated", "analytic")
NO_EVALUATOR = "none"  # plans that reproduce the paper's nominal figures may skip the measurement
ENTRY_POINT_GROUP = "poolpipe.evaluators"  # where packages above the planner offer evaluators


def _load_entry_points() -> None:
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name not in EVALUATORS:
            try:
                EVALUATORS[ep.name] = ep.load()
            except ImportError:  # an installed package without its optional parts: its evaluator is not offered
                continue


def known_evaluators() -> tuple[str, ...]:
    """Every evaluator's name (entry points loaded), and ``none``."""
    _load_entry_points()
    return (*EVALUATORS, NO_EVALUATOR)


def evaluator(name: str | None = None) -> tuple[str, Evaluator]:
    """The named evaluator, or the best one installed (the simulator where it is)."""
    _load_entry_points()
    if name is None:
        name = next(n for n in PREFERRED if n in EVALUATORS)
    if name not in EVALUATORS:
        raise InputError(f"unknown evaluator {name!r}; registered: {', '.join(EVALUATORS)}")
    return name, EVALUATORS[name]
