"""The planner: where each model is cut, which pool of (virtual) GPUs serves each partition, with which batch and how
many vGPUs, written as plan.json. One entry point, ``planner.plan(spec, request) -> PlanOutcome`` (planner.entry;
``PlanRequest`` in planner.request): every caller plans through it. The documents it reads and writes (the planning
spec, plan.json, arrivals) sit at the bottom, in ``plans``; planning sits above the simulator, which measures its
candidate plans (planner.sustained.evaluators). Sub-packages by family: ``solvers`` (the MILP in array form and the
solvers), ``ppipe`` (PPipe's pooled-pipeline MILP, its reductions and the np / dart-r baselines), ``sizing`` (PARIS
instance sizing and unequal vGPU sizes), ``colocation`` (InSS-style co-location), ``apps`` (Harpagon: application
SLO splits), ``cost`` (the cheapest GPUs for given rates), ``cli`` (``poolpipe plan``). Top level: ``planners`` and
``objectives`` (the registries ``plan`` dispatches on), ``request``, ``entry``, ``compare`` (planners compared over
one axis: ``poolpipe plan sweep``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["PlanOutcome", "PlanRequest", "plan", "reweighted"]


def __getattr__(name: str) -> Any:
    """``plan``, ``PlanRequest``, ``PlanOutcome`` and ``reweighted``, imported on first use: importing one
    planner module (a solver, say) does not load the simulator the entry point measures plans with."""
    if name in ("plan", "PlanOutcome", "reweighted"):
        from planner import entry

        return getattr(entry, name)
    if name == "PlanRequest":
        from planner.request import PlanRequest

        return PlanRequest
    raise AttributeError(f"module 'planner' has no attribute {name!r}")
