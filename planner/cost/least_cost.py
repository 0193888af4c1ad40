"""Capacity and cost planning: the cheapest use of the cluster that serves given rates under the SLOs.

Harpagon's question (least serving cost for a request rate under a latency objective) asked of PPipe's
pooled pipelines: the column MILP of planner.ppipe.column_milp with the objective
``min sum_t price_t x (whole GPUs of type t)`` and ``sum of a model's pipeline throughputs >= its rate``.
The cluster's GPU counts become upper bounds. A GPU is paid for whole, whatever share of it the
plan's vGPUs fill (the MILP already packs vGPUs into whole GPUs per partition position).
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from planner.cost.cost_search import cheapest_counts
from planner.ppipe.column_milp import Objective
from planner.ppipe.pooled import (
    InfeasibleError,
    ModelPipelines,
    assemble_plan,
    chosen_to_models,
    gpu_counts,
    model_candidates,
    solve_pooled,
)
from planner.solvers.milp_solvers import MilpResult, SolverOptions
from plans.plan_json import Plan
from plans.spec.planning_spec import PlanningSpec
from poolpipe_common.errors import InputError

COST_PLANNERS = ("ppipe", "np")


@dataclass(frozen=True)
class CostRequest:
    """The rates to serve (per model name, req/s) and the price of one GPU-hour per GPU type."""

    rates_rps: dict[str, float]
    prices: dict[str, float]


def check_request(spec: PlanningSpec, req: CostRequest) -> CostRequest:
    """Every model has a positive rate and every GPU type a price >= 0; nothing unknown is named."""
    names = [m.name for m in spec.models]
    unknown = sorted(set(req.rates_rps) - set(names))
    if unknown:
        raise InputError(f"--rate names model(s) {', '.join(unknown)} that the spec does not plan "
                         f"(models: {', '.join(names)})")
    missing = [n for n in names if n not in req.rates_rps]
    if missing:
        raise InputError(f"--rate is missing model(s) {', '.join(missing)}; give NAME=REQ_PER_S for every model")
    bad = {n: r for n, r in req.rates_rps.items() if not r > 0 or math.isinf(r)}
    if bad:
        raise InputError(f"--rate must be > 0 req/s, got {', '.join(f'{n}={r:g}' for n, r in bad.items())}")
    types = spec.cluster.gpu_types
    extra = sorted(set(req.prices) - set(types))
    if extra:
        raise InputError(f"--price names GPU type(s) {', '.join(extra)} not in the cluster ({', '.join(types)})")
    unpriced = [t for t in types if t not in req.prices]
    if unpriced:
        raise InputError(f"--price is missing GPU type(s) {', '.join(unpriced)}; give TYPE=PRICE_PER_GPU_HOUR for each")
    neg = {t: p for t, p in req.prices.items() if p < 0 or math.isinf(p)}
    if neg:
        raise InputError(f"--price must be >= 0 per GPU-hour, got {', '.join(f'{t}={p:g}' for t, p in neg.items())}")
    return req


def whole_gpus_used(plan: Plan) -> dict[str, int]:
    """Whole GPUs of each type the plan occupies: its vGPUs packed per (model, partition position, type)."""
    share: dict[tuple[str, int, str], float] = defaultdict(float)
    for m in plan.models:
        for pl in m.pipelines:
            for pos, p in enumerate(pl.partitions):
                share[(m.name, pos, p.gpu)] += p.num_vgpus / p.v
    used = {t: 0 for t in plan.cluster.gpus}
    for (_, _, gpu), g in share.items():
        used[gpu] += math.ceil(g - 1e-9)
    return used


def cost_summary(plan: Plan, req: CostRequest) -> dict[str, Any]:
    """GPUs used per type, cost per hour, and cost per million requests at the requested rates."""
    used = whole_gpus_used(plan)
    per_hour = sum(req.prices[t] * n for t, n in used.items())
    total_rps = sum(req.rates_rps.values())
    return {"rates_rps": dict(req.rates_rps), "prices_per_gpu_hour": dict(req.prices), "gpus_used": used,
            "cost_per_hour": per_hour, "cost_per_million_requests": per_hour / (total_rps * 3600) * 1e6,
            "capacity_rps": {m.name: m.throughput_rps for m in plan.models}}


def _search(spec: PlanningSpec, max_parts: int, objective: Objective, opts: SolverOptions
            ) -> tuple[list[ModelPipelines], MilpResult]:
    """One or two GPU types: the exact staircase search of planner.cost.cost_search."""
    cands = model_candidates(spec, spec.cluster, max_parts)
    res, chosen = cheapest_counts(cands, gpu_counts(spec.cluster), objective.rates_rps, objective.prices, opts)
    if not chosen:
        if res.status == "infeasible":
            raise InfeasibleError("the cluster cannot serve the requested rates under the SLOs, even with all of "
                                  f"its GPUs ({', '.join(f'{t}={n}' for t, n in spec.cluster.gpus.items())}); "
                                  "lower --rate or add GPUs")
        raise InfeasibleError(f"the cost search stopped at --time-limit before it found a plan ({res.status}); "
                              "raise --time-limit")
    return chosen_to_models(spec, cands, chosen, spec.cluster.gpu_types), res


def solve_cost(spec: PlanningSpec, req: CostRequest, planner: str, opts: SolverOptions) -> Plan:
    """The least-cost plan (ppipe: pooled pipelines; np: whole models) that serves ``req.rates_rps``."""
    if planner not in COST_PLANNERS:
        raise InputError(f"--objective cost plans with --planner {' or '.join(COST_PLANNERS)}, not {planner}")
    check_request(spec, req)
    objective = Objective("cost", tuple(m.weight for m in spec.models),
                          tuple(req.rates_rps[m.name] for m in spec.models),
                          tuple(req.prices[t] for t in spec.cluster.gpu_types))
    t0 = time.perf_counter()
    max_parts = spec.max_partitions if planner == "ppipe" else 1
    if len(spec.cluster.gpu_types) <= 2:
        models, res = _search(spec, max_parts, objective, opts)
    else:
        models, res = solve_pooled(spec, spec.cluster, max_parts, opts, second_pass="", objective=objective)
    plan = assemble_plan(spec, planner, opts.solver, time.perf_counter() - t0, models, res)
    summary = cost_summary(plan, req)
    per_hour = summary["cost_per_hour"]
    bound = None if res.bound is None else min(res.bound, per_hour)
    gap = None if bound is None else (per_hour - bound) / max(per_hour, 1e-9)
    return Plan(plan.planner, plan.solver, plan.solve_seconds, plan.cluster, plan.models, plan.spec, plan.status,
                per_hour, bound, gap, "cost", summary)
