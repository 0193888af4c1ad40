"""Pooled pipelines for every model of a spec: candidates, the column MILP (planner.ppipe.column_milp), and the
Plan assembled from its choice. Every plan carries integer vGPU counts per partition and the transfer
time of one batch out of each partition (0 for the last).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from planner.ppipe import whole_gpu
from planner.ppipe.column_milp import ChosenPipeline, Objective, column_start, relaxation_bound, solve_columns
from planner.ppipe.pipeline_columns import PipelineColumns, enumerate_candidates
from planner.solvers.milp_solvers import MilpResult, SolverOptions, relative_gap
from plans.plan_json import ModelPlan, PartitionPlan, PipelinePlan, Plan, nominal_objective
from plans.spec.planning_spec import ClusterSpec, ModelSpec, PlanningSpec
from poolpipe_common.errors import InputError


class InfeasibleError(InputError):
    """A model has no pipeline that meets its SLO on the cluster (the message names it and why)."""


@dataclass(frozen=True)
class ModelPipelines:
    """One model's planned pipelines before they become a ModelPlan."""

    model: ModelSpec
    pipelines: tuple[PipelinePlan, ...]

    @property
    def throughput_rps(self) -> float:
        return sum(p.throughput_rps for p in self.pipelines)


def gpu_counts(cluster: ClusterSpec) -> np.ndarray:
    return np.array([cluster.gpus[t] for t in cluster.gpu_types], int)


def infeasible_reason(model: ModelSpec, cluster: ClusterSpec) -> str:
    """Why no candidate of ``model`` meets its SLO on ``cluster`` (for the error message)."""
    prof = model.profile
    usable = [t for t in cluster.gpu_types if t in prof.timings and cluster.gpus[t] > 0 and 1 in prof.timings[t]]
    if not usable:
        return (f"its profile has no timings for the cluster's GPU types with GPUs "
                f"({', '.join(t for t in cluster.gpu_types if cluster.gpus[t] > 0)})")
    best_t = min(usable, key=lambda t: prof.latency_us(t, 1, 1))
    fastest = prof.latency_us(best_t, 1, 1)
    return (f"the fastest whole-model latency on the cluster's GPUs is {fastest:.0f} us (batch 1 on {best_t}) but "
            f"slo_us {model.slo_us:.0f} minus slo_margin_us {model.slo_margin_us:.0f} leaves "
            f"{model.latency_budget_us:.0f} us; raise the SLO or lower the margin")


def model_candidates(spec: PlanningSpec, cluster: ClusterSpec, max_parts: int) -> list[PipelineColumns]:
    """Pruned candidates of every model; a model with none is infeasible."""
    out = []
    for m in spec.models:
        c = enumerate_candidates(m, cluster, cluster.gpu_types, max_parts, spec.batch_unification, prune=True)
        if not len(c):
            raise InfeasibleError(f"model {m.name} is infeasible: {infeasible_reason(m, cluster)}")
        out.append(c)
    return out


def pipeline_plan(cand: PipelineColumns, c: int, num_vgpus: tuple[int, ...], gpu_types: list[str]) -> PipelinePlan:
    """Candidate row ``c`` with its vGPU counts as a PipelinePlan (latency: partitions + transfers)."""
    k = int(cand.num_parts[c])
    parts = tuple(PartitionPlan((int(cand.cuts[c, p]), int(cand.cuts[c, p + 1])), gpu_types[int(cand.gpu[c, p])],
                                int(cand.v[c, p]), int(cand.batch[c, p]), int(num_vgpus[p]),
                                float(cand.latency_us[c, p]), float(cand.transfer_us[c, p]))
                  for p in range(k))
    thr = min(pp.num_vgpus * float(cand.rate_rps[c, p]) for p, pp in enumerate(parts))
    lat = float(cand.latency_us[c, :k].sum() + cand.transfer_us[c, :k].sum())
    return PipelinePlan(parts, thr, lat)


def chosen_to_models(spec: PlanningSpec, cands: list[PipelineColumns], chosen: list[ChosenPipeline],
                     gpu_types: list[str]) -> list[ModelPipelines]:
    per = [[] for _ in spec.models]
    for ch in chosen:
        per[ch.model].append(pipeline_plan(cands[ch.model], ch.candidate, ch.num_vgpus, gpu_types))
    return [ModelPipelines(m, tuple(sorted(p, key=lambda x: -x.throughput_rps))) for m, p in zip(spec.models, per)]


def solve_with_warm_start(cands: list[PipelineColumns], counts: np.ndarray, objective: Objective, opts: SolverOptions,
                          second_pass: str) -> tuple[MilpResult, list[ChosenPipeline]]:
    """The column MILP started from the whole-GPU DP's plan (planner.ppipe.whole_gpu) where the DP applies.
    One model needs no MILP when the DP's plan is proven: vGPU level 1 everywhere (nothing to share),
    or the LP relaxation within the gap of it."""
    if objective.kind != "throughput" or not whole_gpu.applicable(cands, counts):
        return solve_columns(cands, counts, objective, opts, second_pass)
    t0 = time.perf_counter()
    dp = whole_gpu.whole_gpu_plan(cands, counts, list(objective.weights))
    if len(cands) == 1 and whole_gpu.exact_for(cands) and dp:
        total = dp_objective(dp, 1, objective.weights)
        return MilpResult("optimal", None, total, time.perf_counter() - t0, 0.0, total), dp
    if dp and len(cands) == 1:  # proven within the gap by the LP relaxation: no MILP needed
        obj, bound = dp_objective(dp, 1, objective.weights), relaxation_bound(cands, counts, objective)
        if bound is not None and relative_gap(obj, bound) <= opts.rel_gap:
            return MilpResult("optimal", None, obj, time.perf_counter() - t0, relative_gap(obj, bound), bound), dp
    start = column_start(cands, counts, objective, dp) if dp else None
    res, chosen = solve_columns(cands, counts, objective, opts.remaining(time.perf_counter() - t0), second_pass, start)
    if res.x is None and dp and res.status != "infeasible":  # stopped before it took the start: keep the DP's plan
        obj = dp_objective(dp, len(cands), objective.weights)
        bound = relaxation_bound(cands, counts, objective)
        return MilpResult("time_limit", None, obj, time.perf_counter() - t0, relative_gap(obj, bound), bound), dp
    return MilpResult(res.status, res.x, res.objective, time.perf_counter() - t0, res.gap, res.bound), chosen


def dp_objective(chosen: list[ChosenPipeline], num_models: int, weights: tuple[float, ...]) -> float:
    """Throughput (one model) or smallest throughput/weight of a list of chosen pipelines."""
    thr = np.zeros(num_models)
    for ch in chosen:
        thr[ch.model] += ch.throughput_rps
    return float(thr[0]) if num_models == 1 else float(np.min(thr / np.asarray(weights, float)))


def solve_pooled(spec: PlanningSpec, cluster: ClusterSpec, max_parts: int, opts: SolverOptions,
                 second_pass: str = "fill", objective: Objective | None = None
                 ) -> tuple[list[ModelPipelines], MilpResult]:
    """Plan every model of ``spec`` on ``cluster`` with the column MILP (pipelines of <= max_parts);
    the objective is throughput (the models' weights) unless ``objective`` says otherwise."""
    t0 = time.perf_counter()
    cands = model_candidates(spec, cluster, max_parts)
    objective = objective or Objective("throughput", tuple(m.weight for m in spec.models))
    res, chosen = solve_with_warm_start(cands, gpu_counts(cluster), objective,
                                        opts.remaining(time.perf_counter() - t0), second_pass)
    if res.x is None and not chosen:
        if objective.kind == "cost" and res.status == "infeasible":
            raise InfeasibleError("the cluster cannot serve the requested rates under the SLOs, even with all "
                                  f"of its GPUs ({', '.join(f'{t}={n}' for t, n in cluster.gpus.items())}); "
                                  "lower --rate or add GPUs")
        what = "infeasible" if res.status == "infeasible" else f"stopped without a plan ({res.status})"
        raise InfeasibleError(f"the MILP is {what}; raise --time-limit or check the spec")
    models = chosen_to_models(spec, cands, chosen, cluster.gpu_types)
    starved = [mp.model.name for mp in models if mp.throughput_rps <= 0]
    if starved:
        raise InfeasibleError(f"model {starved[0]} is infeasible together with the others: the cluster's GPUs "
                              f"({', '.join(f'{t}={n}' for t, n in cluster.gpus.items())}) cannot give every one of "
                              f"the {len(models)} models a pipeline that meets its SLO; add GPUs or plan fewer models")
    return models, res


def model_plans(models: list[ModelPipelines]) -> tuple[ModelPlan, ...]:
    return tuple(ModelPlan(mp.model.name, mp.model.slo_us, mp.throughput_rps, mp.pipelines, mp.model.profile,
                           mp.model.weight, mp.model.slo_margin_us, mp.model.batch_wait_us_per_request)
                 for mp in models)


def assemble_plan(spec: PlanningSpec, planner: str, solver: str, seconds: float,
                  models: list[ModelPipelines], res: MilpResult) -> Plan:
    """The throughput Plan: objective = throughput (one model) or smallest throughput/weight, with the
    solver's status, bound and gap (None where the planner has no bound, e.g. dart-r)."""
    mplans = model_plans(models)
    objective = nominal_objective(mplans)
    bound = None if res.bound is None else max(res.bound, objective)  # whole vGPUs may carry a bit more than x
    gap = None if bound is None else (bound - objective) / max(objective, 1e-9)
    return Plan(planner, solver, seconds, spec.cluster, mplans, spec.to_dict(), res.status, objective,
                bound=bound, gap=gap)
