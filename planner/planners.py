"""The planner entry point: ``solve_spec(spec, planner, solver, time_limit_s, progress, rel_gap) -> Plan``.

``ppipe`` plans pooled pipelines (planner.ppipe.pooled); ``np`` and ``dart-r`` are the baselines of
planner.ppipe.baselines on the same spec. Every solve stops at its time limit (None: never) or when the
incumbent is proven within ``rel_gap`` of the optimum; either way the plan is the incumbent, and it
carries the status, the bound and the gap.
"""

from __future__ import annotations

import math
import time

from planner.plan_json import Plan
from planner.ppipe.baselines import solve_dart_r, solve_np
from planner.ppipe.pooled import InfeasibleError, assemble_plan, solve_pooled
from planner.solvers.milp_solvers import DEFAULT_REL_GAP, SOLVERS, SolverOptions
from planner.spec.planning_spec import PlanningSpec
from poolpipe_common.errors import InputError

__all__ = ["DEFAULT_TIME_LIMIT_S", "PLANNERS", "InfeasibleError", "check_limits", "solve_spec"]

PLANNERS = ("ppipe", "np", "dart-r")
DEFAULT_TIME_LIMIT_S = 60.0  # the CLI's default: a plan is re-run whenever the workload shifts


def check_limits(solver: str, time_limit_s: float | None, rel_gap: float) -> SolverOptions:
    """Validated solver options (one-line InputErrors that name the flag)."""
    if solver not in SOLVERS:
        raise InputError(f"unknown solver {solver!r}; choose one of {', '.join(SOLVERS)}")
    if time_limit_s is not None and (isinstance(time_limit_s, bool) or not isinstance(time_limit_s, (int, float))
                                     or not time_limit_s > 0 or math.isinf(time_limit_s)):
        raise InputError(f"time limit must be a positive number of seconds (--time-limit 0: none), "
                         f"got {time_limit_s!r}")
    if isinstance(rel_gap, bool) or not isinstance(rel_gap, (int, float)) or not 0 <= rel_gap < 1:
        raise InputError(f"--gap must be a relative MIP gap in [0, 1), e.g. 1e-4; got {rel_gap!r}")
    return SolverOptions(solver, None if time_limit_s is None else float(time_limit_s), float(rel_gap))


def solve_spec(spec: PlanningSpec, planner: str = "ppipe", solver: str = "highs",
               time_limit_s: float | None = None, progress: bool = False,
               rel_gap: float = DEFAULT_REL_GAP) -> Plan:
    """Plan ``spec`` with ``planner`` (ppipe | np | dart-r) using ``solver`` (highs | cbc | gurobi)."""
    if planner not in PLANNERS:
        raise InputError(f"unknown planner {planner!r}; choose one of {', '.join(PLANNERS)}")
    opts = check_limits(solver, time_limit_s, rel_gap)
    opts = SolverOptions(opts.solver, opts.time_limit_s, opts.rel_gap, progress)
    t0 = time.perf_counter()
    if spec.colocate and spec.cluster.vgpu_sizes:
        raise InputError("colocate and cluster.vgpu_sizes cannot be combined yet: co-location packs equal vGPU "
                         "levels; drop one of them")
    if planner == "ppipe" and spec.colocate:  # GPUs shared across (model, partition) pairs: planner.colocation.colocate
        from planner.colocation.colocate import plan_colocated
        return plan_colocated(spec, opts)
    if planner == "ppipe" and spec.cluster.vgpu_sizes:
        from dataclasses import replace

        from planner.sizing.unequal_milp import solve_unequal

        models, res, splits = solve_unequal(spec, opts)
        return replace(assemble_plan(spec, planner, solver, time.perf_counter() - t0, models, res), gpu_splits=splits)
    if planner == "ppipe":
        models, res = solve_pooled(spec, spec.cluster, spec.max_partitions, opts)
    elif planner == "np":
        models, res = solve_np(spec, opts)
    else:
        models, res = solve_dart_r(spec, opts)
    return assemble_plan(spec, planner, solver, time.perf_counter() - t0, models, res)
