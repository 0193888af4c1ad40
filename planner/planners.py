"""The registry of planners, ``PLANNERS``: name -> ``(spec, SolverOptions) -> Plan`` for the throughput objective,
and ``solve_spec(spec, planner, solver, time_limit_s, progress, rel_gap) -> Plan`` on it.

``ppipe`` plans pooled pipelines (planner.ppipe.pooled; co-located with planner.colocation where the spec says
``colocate``, over unequal sizes with planner.sizing.unequal_milp where it has ``cluster.vgpu_sizes``); ``np`` and
``dart-r`` are the baselines of planner.ppipe.baselines on the same spec. Every solve stops at its time limit
(None: never) or when the incumbent is proven within ``rel_gap`` of the optimum; either way the plan is the
incumbent, and it carries the status, the bound and the gap. ``planner.plan`` (the entry point) adds the other
planning features around these.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import replace

from planner.ppipe.baselines import solve_dart_r, solve_np
from planner.ppipe.pooled import InfeasibleError, assemble_plan, solve_pooled
from planner.solvers.milp_solvers import DEFAULT_REL_GAP, SOLVERS, SolverOptions
from plans.plan_json import Plan
from plans.spec.planning_spec import PlanningSpec
from poolpipe_common.errors import InputError

__all__ = ["DEFAULT_TIME_LIMIT_S", "PLANNERS", "InfeasibleError", "check_limits", "check_planner", "run_planner",
           "solve_spec"]

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


def _ppipe(spec: PlanningSpec, opts: SolverOptions) -> Plan:
    """Pooled pipelines: co-located where the spec says so, over unequal vGPU sizes where it has them."""
    t0 = time.perf_counter()
    if spec.colocate:  # GPUs shared across (model, partition) pairs
        from planner.colocation.colocate import plan_colocated

        return plan_colocated(spec, opts)
    if spec.cluster.vgpu_sizes:
        from planner.sizing.unequal_milp import solve_unequal

        models, res, splits = solve_unequal(spec, opts)
        return replace(assemble_plan(spec, "ppipe", opts.solver, time.perf_counter() - t0, models, res),
                       gpu_splits=splits)
    models, res = solve_pooled(spec, spec.cluster, spec.max_partitions, opts)
    return assemble_plan(spec, "ppipe", opts.solver, time.perf_counter() - t0, models, res)


def _baseline(name: str, solve: Callable) -> Callable[[PlanningSpec, SolverOptions], Plan]:
    def run(spec: PlanningSpec, opts: SolverOptions) -> Plan:
        t0 = time.perf_counter()
        models, res = solve(spec, opts)
        return assemble_plan(spec, name, opts.solver, time.perf_counter() - t0, models, res)
    return run


PLANNERS: dict[str, Callable[[PlanningSpec, SolverOptions], Plan]] = {
    "ppipe": _ppipe, "np": _baseline("np", solve_np), "dart-r": _baseline("dart-r", solve_dart_r)}


def check_planner(planner: str) -> str:
    """A registered planner's name (a one-line InputError otherwise)."""
    if planner not in PLANNERS:
        raise InputError(f"unknown planner {planner!r}; choose one of {', '.join(PLANNERS)}")
    return planner


def run_planner(spec: PlanningSpec, planner: str, opts: SolverOptions) -> Plan:
    """Plan ``spec`` for throughput with the registered ``planner``."""
    check_planner(planner)
    if spec.colocate and spec.cluster.vgpu_sizes:
        raise InputError("colocate and cluster.vgpu_sizes cannot be combined yet: co-location packs equal vGPU "
                         "levels; drop one of them")
    return PLANNERS[planner](spec, opts)


def solve_spec(spec: PlanningSpec, planner: str = "ppipe", solver: str = "highs",
               time_limit_s: float | None = None, progress: bool = False,
               rel_gap: float = DEFAULT_REL_GAP) -> Plan:
    """Plan ``spec`` for throughput with ``planner`` (ppipe | np | dart-r) using ``solver`` (highs | cbc | gurobi)."""
    check_planner(planner)
    return run_planner(spec, planner, replace(check_limits(solver, time_limit_s, rel_gap), log=progress))
