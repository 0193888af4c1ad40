"""The baselines of the PPipe paper on the same spec: ``np`` (no partitioning) and ``dart-r``.

np: every pipeline is the whole model on vGPUs of one type (the column MILP with one partition;
the spec's vGPU levels are allowed).

dart-r (as the published artifact computed it): a whole-model plan (one partition, V = 1) first
splits the GPUs among the models (each model gets the fewest GPUs that keep the best smallest
throughput/weight); GPUs it leaves unused are shared out evenly (whole GPUs). Each
model then plans alone on its share: min(count_a, count_b) pairs of one GPU of each of the two
types, each pair planned once (one cut between the two GPUs, or each GPU running the whole
model, V = 1) and copied; the GPUs of the more numerous type that are left over each run the
whole model (V = 1).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from planner.ppipe.pooled import ModelPipelines, solve_pooled
from planner.solvers.milp_solvers import MilpResult, SolverOptions
from plans.plan_json import PipelinePlan
from plans.spec.planning_spec import ClusterSpec, PlanningSpec
from poolpipe_common.errors import InputError


def solve_np(spec: PlanningSpec, opts: SolverOptions) -> tuple[list[ModelPipelines], MilpResult]:
    return solve_pooled(spec, spec.cluster, 1, opts)


def _whole_gpu_cluster(cluster: ClusterSpec, counts: dict[str, int]) -> ClusterSpec:
    """The same servers and NICs with other GPU counts and no vGPU split (V = 1)."""
    return replace(cluster, gpus=dict(counts), vgpu_levels={t: 1 for t in counts},
                   gpus_per_server={t: cluster.gpus_per_server.get(t, 1) for t in counts})


def _scaled(p: PipelinePlan, k: int) -> PipelinePlan:
    parts = tuple(replace(pp, num_vgpus=pp.num_vgpus * k) for pp in p.partitions)
    return PipelinePlan(parts, p.throughput_rps * k, p.latency_us)


def _merge(pipes: list[PipelinePlan]) -> tuple[PipelinePlan, ...]:
    """Merge pipelines with identical partitions (a pair plan copied twice is one pool)."""
    merged: dict[tuple, PipelinePlan] = {}
    for p in pipes:
        key = tuple((pp.blocks, pp.gpu, pp.v, pp.batch) for pp in p.partitions)
        if key in merged:
            q = merged[key]
            parts = tuple(replace(a, num_vgpus=a.num_vgpus + b.num_vgpus) for a, b in zip(q.partitions, p.partitions))
            merged[key] = PipelinePlan(parts, q.throughput_rps + p.throughput_rps, q.latency_us)
        else:
            merged[key] = p
    return tuple(sorted(merged.values(), key=lambda x: -x.throughput_rps))


def _unit_plan(spec: PlanningSpec, model_index: int, counts: dict[str, int], max_parts: int,
               opts: SolverOptions) -> list[PipelinePlan]:
    """Best plan of one model on a tiny cluster (one pair, or one GPU); empty if nothing fits."""
    sub = PlanningSpec(_whole_gpu_cluster(spec.cluster, counts), (spec.models[model_index],), max_parts,
                       spec.batch_unification)
    try:
        models, _ = solve_pooled(sub, sub.cluster, max_parts, SolverOptions(opts.solver, opts.time_limit_s,
                                                                            opts.rel_gap))
    except InputError:  # nothing meets the SLO on this unit
        return []
    return list(models[0].pipelines)


def solve_dart_r(spec: PlanningSpec, opts: SolverOptions) -> tuple[list[ModelPipelines], MilpResult]:
    """The dart-r plan (a heuristic: its status is the base split's; it has no bound)."""
    types = [t for t in spec.cluster.gpu_types if spec.cluster.gpus[t] > 0]
    if len(types) != 2:
        raise InputError(f"--planner dart-r pairs two GPU types, but the cluster has GPUs of "
                         f"{len(types)} type(s) ({', '.join(types) or 'none'}); use --planner ppipe or np")
    # 1. split the GPUs among models with the whole-model plan (V = 1)
    base_cluster = _whole_gpu_cluster(spec.cluster, spec.cluster.gpus)
    base, res = solve_pooled(spec, base_cluster, 1, opts, second_pass="lean")
    used = np.array([[sum(pp.num_vgpus for pl in mp.pipelines for pp in pl.partitions if pp.gpu == t)
                      for t in types] for mp in base])
    remaining = np.array([spec.cluster.gpus[t] for t in types]) - used.sum(0)
    shares = used + remaining // len(spec.models)
    out = []
    for mi, m in enumerate(spec.models):
        share = dict(zip(types, (int(x) for x in shares[mi])))
        pairs = min(share.values())
        extra_type = types[int(np.argmax(shares[mi]))]
        extra = max(share.values()) - pairs
        pipes: list[PipelinePlan] = []
        if pairs:
            unit = _unit_plan(spec, mi, {t: 1 for t in types}, spec.max_partitions, opts)
            pipes += [_scaled(p, pairs) for p in unit]
        if extra:
            unit = _unit_plan(spec, mi, {extra_type: 1}, 1, opts)
            pipes += [_scaled(p, extra) for p in unit]
        out.append(ModelPipelines(m, _merge(pipes)))
    if any(not mp.pipelines for mp in out):
        bad = next(mp.model.name for mp in out if not mp.pipelines)
        raise InputError(f"model {bad} is infeasible under dart-r: no pair or single GPU of its share meets its SLO")
    return out, MilpResult(res.status, None, None, res.seconds)
