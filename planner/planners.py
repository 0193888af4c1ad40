"""Every planner behind one interface, ``Planner.solve(spec, options) -> Plan`` (PPipe's throughput objective), and
the registry of the ones a request names, ``PLANNERS``.

``ppipe`` plans pooled pipelines (planner.ppipe.pooled; co-located with planner.colocation where the spec says
``colocate``, over unequal vGPU sizes with planner.sizing.unequal_milp where it has ``cluster.vgpu_sizes``); ``np`` and
``dart-r`` are the baselines of planner.ppipe.baselines on the same spec; ``ParisSizing`` sizes instances from a
batch-size PDF (planner.sizing.paris). ``Dedicated`` and ``Relabelled`` wrap a planner for the sustained search's
narrower candidates. Every solve stops at its time limit (None: never) or when the incumbent is proven within
``rel_gap`` of the optimum; either way the plan is the incumbent, and it carries the status, the bound and the gap.
``planner.plan`` (the entry point) adds the objectives and the other planning features around these.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Protocol

from planner.ppipe.baselines import solve_dart_r, solve_np
from planner.ppipe.pooled import InfeasibleError, assemble_plan, solve_pooled
from planner.solvers.milp_solvers import DEFAULT_REL_GAP, SOLVERS, SolverOptions
from plans.plan_json import Plan
from plans.spec.planning_spec import PlanningSpec
from poolpipe_common.errors import InputError

__all__ = ["DEFAULT_TIME_LIMIT_S", "PLANNERS", "Dedicated", "InfeasibleError", "ParisSizing", "Planner", "Relabelled",
           "check_limits", "check_planner", "planner_for", "solve_spec"]

DEFAULT_TIME_LIMIT_S = 60.0  # the CLI's default: a plan is re-run whenever the workload shifts


class Planner(Protocol):
    """One spec in, one plan out: the most throughput (max-min over the models' weights) the spec's cluster serves."""

    name: str

    def solve(self, spec: PlanningSpec, options: SolverOptions) -> Plan: ...


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


@dataclass(frozen=True)
class PooledPipelines:
    """PPipe: pooled pipelines, co-located where the spec says so, over unequal vGPU sizes where it has them."""

    name: str = "ppipe"

    def solve(self, spec: PlanningSpec, options: SolverOptions) -> Plan:
        if spec.colocate and spec.cluster.vgpu_sizes:
            raise InputError("colocate and cluster.vgpu_sizes cannot be combined yet: co-location packs equal vGPU "
                             "levels; drop one of them")
        t0 = time.perf_counter()
        if spec.colocate:  # GPUs shared across (model, partition) pairs
            from planner.colocation.colocate import plan_colocated

            return plan_colocated(spec, options)
        if spec.cluster.vgpu_sizes:
            from planner.sizing.unequal_milp import solve_unequal

            models, res, splits = solve_unequal(spec, options)
            return replace(assemble_plan(spec, self.name, options.solver, time.perf_counter() - t0, models, res),
                           gpu_splits=splits)
        models, res = solve_pooled(spec, spec.cluster, spec.max_partitions, options)
        return assemble_plan(spec, self.name, options.solver, time.perf_counter() - t0, models, res)


@dataclass(frozen=True)
class Baseline:
    """One of PPipe's baselines (np: whole models on one GPU type; dart-r: low/high pairs) on the same spec."""

    name: str
    milp: Callable

    def solve(self, spec: PlanningSpec, options: SolverOptions) -> Plan:
        if spec.colocate and spec.cluster.vgpu_sizes:
            raise InputError("colocate and cluster.vgpu_sizes cannot be combined yet: co-location packs equal vGPU "
                             "levels; drop one of them")
        t0 = time.perf_counter()
        models, res = self.milp(spec, options)
        return assemble_plan(spec, self.name, options.solver, time.perf_counter() - t0, models, res)


@dataclass(frozen=True)
class ParisSizing:
    """PARIS: instance sizes for a batch-size PDF on the spec's GPU type with vgpu_sizes; its sizing in the notes."""

    pdf: Mapping[int, float]
    name: str = "paris"

    def solve(self, spec: PlanningSpec, options: SolverOptions) -> Plan:
        from planner.sizing.paris import paris_plan

        plan, sizing = paris_plan(spec, self.pdf, options)
        return replace(plan, notes=(*plan.notes, *sizing.lines()))


@dataclass(frozen=True)
class Dedicated:
    """``inner`` on the spec with no co-location (a plan that shares no GPU is a co-located plan too)."""

    inner: Planner

    @property
    def name(self) -> str:
        return self.inner.name

    def solve(self, spec: PlanningSpec, options: SolverOptions) -> Plan:
        return self.inner.solve(replace(spec, colocate=False), options)


@dataclass(frozen=True)
class Relabelled:
    """``inner``'s plan under another planner's name: np's whole-model pools are pooled pipelines of one partition."""

    inner: Planner
    name: str

    def solve(self, spec: PlanningSpec, options: SolverOptions) -> Plan:
        return replace(self.inner.solve(spec, options), planner=self.name)


PLANNERS: dict[str, Planner] = {"ppipe": PooledPipelines(), "np": Baseline("np", solve_np),
                                "dart-r": Baseline("dart-r", solve_dart_r)}


def check_planner(planner: str) -> str:
    """A registered planner's name (a one-line InputError otherwise)."""
    if planner not in PLANNERS:
        raise InputError(f"unknown planner {planner!r}; choose one of {', '.join(PLANNERS)}")
    return planner


def planner_for(name: str, paris_batch_pdf: Mapping[int, float] | None = None) -> Planner:
    """The registered planner ``name``, or PARIS sizing where a batch-size PDF is given."""
    check_planner(name)
    return ParisSizing(paris_batch_pdf) if paris_batch_pdf is not None else PLANNERS[name]


def solve_spec(spec: PlanningSpec, planner: str = "ppipe", solver: str = "highs",
               time_limit_s: float | None = None, progress: bool = False,
               rel_gap: float = DEFAULT_REL_GAP) -> Plan:
    """Plan ``spec`` for throughput with ``planner`` (ppipe | np | dart-r) using ``solver`` (highs | cbc | gurobi)."""
    return planner_for(planner).solve(spec, replace(check_limits(solver, time_limit_s, rel_gap), log=progress))
