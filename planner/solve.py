"""The planner entry point: ``solve_spec(spec, planner, solver, time_limit_s, progress) -> Plan``.

``ppipe`` plans pooled pipelines (planner.pooled); ``np`` and ``dart-r`` are the baselines of
planner.baselines on the same spec.
"""

from __future__ import annotations

import math
import time

from planner.baselines import solve_dart_r, solve_np
from planner.milp_solvers import SOLVERS
from planner.plan import Plan
from planner.pooled import InfeasibleError, assemble_plan, solve_pooled
from planner.spec import PlanningSpec
from poolpipe_common.errors import InputError

__all__ = ["PLANNERS", "InfeasibleError", "solve_spec"]

PLANNERS = ("ppipe", "np", "dart-r")


def solve_spec(spec: PlanningSpec, planner: str = "ppipe", solver: str = "highs",
               time_limit_s: float | None = None, progress: bool = False) -> Plan:
    """Plan ``spec`` with ``planner`` (ppipe | np | dart-r) using ``solver`` (highs | cbc | gurobi)."""
    if planner not in PLANNERS:
        raise InputError(f"unknown planner {planner!r}; choose one of {', '.join(PLANNERS)}")
    if solver not in SOLVERS:
        raise InputError(f"unknown solver {solver!r}; choose one of {', '.join(SOLVERS)}")
    if time_limit_s is not None and (not isinstance(time_limit_s, (int, float)) or not time_limit_s > 0
                                     or math.isinf(time_limit_s)):
        raise InputError(f"time limit must be a positive number of seconds, got {time_limit_s!r}")
    t0 = time.perf_counter()
    if planner == "ppipe":
        models, res = solve_pooled(spec, spec.cluster, spec.max_partitions, solver, time_limit_s, progress)
        status = res.status
    elif planner == "np":
        models, status = solve_np(spec, solver, time_limit_s, progress)
    else:
        models, status = solve_dart_r(spec, solver, time_limit_s, progress)
    return assemble_plan(spec, planner, solver, time.perf_counter() - t0, models, status)
