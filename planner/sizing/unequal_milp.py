"""The pooled-pipeline MILP with unequal vGPU sizes (spec ``cluster.vgpu_sizes``).

Each size of a GPU type is planned as a device of its own (planner.sizing.size_profiles: ``L4@50%`` at level 1),
so the candidates and the column MILP of planner.ppipe.column_milp apply unchanged; this module adds what ties
the sizes to physical GPUs. For every GPU type t with sizes and every allowed split g of one GPU
(plans.spec.vgpu_sizes: an MPS split, or a valid MIG geometry), an integer u_tg counts the GPUs split so:

  sum_{y of size s of t} y  <=  sum_g a_gs u_tg      a size's vGPUs come from the GPUs split to hold them
  sum_{y of t} y + sum_g u_tg  <=  G_t                GPUs split unequally are not shared with equal levels

(a_gs: vGPUs of size s in split g). The equal-level vGPUs (1/V) stay as they are. The plan's partitions
on a size carry ``vgpu_size`` / ``vgpu_share``, and the plan lists its ``gpu_splits``.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import numpy as np

from planner.ppipe.column_milp import ColumnLayout, Objective, build_column_milp, chosen_pipelines
from planner.ppipe.pooled import InfeasibleError, ModelPipelines, chosen_to_models, gpu_counts, model_candidates
from planner.sizing.size_profiles import expanded_cluster, sized_device, sized_profile, split_device
from planner.solvers.milp_solvers import MilpArrays, MilpResult, SolverOptions, solve_with
from plans.plan_json import PipelinePlan
from plans.spec.planning_spec import ClusterSpec, PlanningSpec
from poolpipe_common.errors import InputError


def sized_spec(spec: PlanningSpec) -> tuple[PlanningSpec, ClusterSpec]:
    """The spec whose profiles carry every size's timings, and the cluster with the sizes as GPU types."""
    sizes = spec.cluster.vgpu_sizes or {}
    models = tuple(replace(m, profile=sized_profile(m.profile, sizes)) for m in spec.models)
    return replace(spec, models=models), expanded_cluster(spec.cluster)


def with_splits(milp: MilpArrays, layout: ColumnLayout, types: list[str], cluster: ClusterSpec
                ) -> tuple[MilpArrays, list[tuple[str, tuple[str, ...], int]]]:
    """The MILP with the split variables u_tg and their rows (module doc); also (type, split, column) of each u."""
    ncols, nrows = milp.num_cols, milp.num_rows
    y_type = layout.y_keys[:, 2]
    rows, cols, vals, lo, hi, u = [], [], [], [], [], []

    def row(c: list[int], v: list[float], upper: float) -> None:
        r = nrows + len(lo)
        rows.extend([r] * len(c))
        cols.extend(c)
        vals.extend(v)
        lo.append(-np.inf)
        hi.append(upper)
    for gpu, splits in (cluster.vgpu_sizes or {}).items():
        u_cols = []
        for g in splits.patterns:
            u.append((gpu, g, ncols + len(u)))
            u_cols.append(u[-1])
        ys = layout.y_index[y_type == types.index(gpu)].tolist() if gpu in types else []
        row(ys + [c for _, _, c in u_cols], [1.0] * (len(ys) + len(u_cols)), float(cluster.gpus[gpu]))
        for s in splits.sizes:
            dev = sized_device(gpu, s.label)
            ys = layout.y_index[y_type == types.index(dev)].tolist()
            row(ys + [c for _, _, c in u_cols], [1.0] * len(ys) + [-float(g.count(s.label)) for _, g, _ in u_cols], 0.0)
    k = len(u)
    pad = np.zeros(k)
    out = MilpArrays(np.r_[milp.cost, pad], np.r_[milp.lower, pad],
                     np.r_[milp.upper, [float(cluster.gpus[gpu]) for gpu, _, _ in u]],
                     np.r_[milp.integer, np.ones(k, bool)], np.r_[milp.a_row, rows].astype(int),
                     np.r_[milp.a_col, cols].astype(int), np.r_[milp.a_val, vals], np.r_[milp.row_lower, lo],
                     np.r_[milp.row_upper, hi], milp.maximize)
    return out, u


def unsized_pipeline(pl: PipelinePlan, cluster: ClusterSpec) -> PipelinePlan:
    """A pipeline whose partitions on a size device ('L4@50%') become partitions of the GPU with that size."""
    parts = []
    for p in pl.partitions:
        gpu, label = split_device(p.gpu)
        if label is None:
            parts.append(p)
        else:
            share = cluster.vgpu_sizes[gpu].size(label).share
            parts.append(replace(p, gpu=gpu, v=1, size=label, share=share))
    return replace(pl, partitions=tuple(parts))


def splits_used(x: np.ndarray, u: list[tuple[str, tuple[str, ...], int]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for gpu, g, c in u:
        n = int(round(x[c]))
        if n > 0:
            out.setdefault(gpu, []).append({"vgpus": list(g), "gpus": n})
    return out


def solve_unequal(spec: PlanningSpec, opts: SolverOptions
                  ) -> tuple[list[ModelPipelines], MilpResult, dict[str, list[dict[str, Any]]]]:
    """Plan ``spec`` (which has ``cluster.vgpu_sizes``) for throughput; the models carry sized profiles."""
    t0 = time.perf_counter()
    s_spec, ext = sized_spec(spec)
    types = ext.gpu_types
    cands = model_candidates(s_spec, ext, spec.max_partitions)
    objective = Objective("throughput", tuple(m.weight for m in spec.models))
    milp, layout = build_column_milp(cands, gpu_counts(ext), objective)
    milp, u = with_splits(milp, layout, types, spec.cluster)
    start = equal_level_start(spec, cands, layout, types, objective, gpu_counts(ext), milp.num_cols,
                              opts.remaining(time.perf_counter() - t0))
    left = opts.remaining(time.perf_counter() - t0)
    res = solve_with(milp, left, start)
    if res.x is None:
        raise InfeasibleError(f"the MILP with unequal vGPU sizes is {res.status}; raise --time-limit or check the "
                              "spec")
    chosen = chosen_pipelines(cands, layout, res.x)
    models = [ModelPipelines(mp.model, tuple(unsized_pipeline(pl, spec.cluster) for pl in mp.pipelines))
              for mp in chosen_to_models(s_spec, cands, chosen, types)]
    res = MilpResult(res.status, res.x, res.objective, time.perf_counter() - t0, res.gap, res.bound)
    return models, res, splits_used(res.x, u)


def equal_level_start(spec: PlanningSpec, cands: list, layout: ColumnLayout, types: list[str], objective: Objective,
                      counts: np.ndarray, ncols: int, opts: SolverOptions) -> np.ndarray | None:
    """The MILP point of the plan without sizes (planner.ppipe.pooled on the equal levels), so the solve starts
    from it and never returns less; None where that plan's pipelines are not among the candidates."""
    from planner.ppipe.column_milp import ChosenPipeline, column_start
    from planner.ppipe.pooled import solve_pooled

    base = replace(spec, cluster=replace(spec.cluster, vgpu_sizes=None))
    try:
        models, _ = solve_pooled(base, base.cluster, spec.max_partitions, opts)
    except InputError:
        return None
    chosen = []
    for mi, mp in enumerate(models):
        c = cands[mi]
        for pl in mp.pipelines:
            k = len(pl.partitions)
            hit = (c.num_parts == k)
            for p, part in enumerate(pl.partitions):
                hit &= ((c.cuts[:, p] == part.blocks[0]) & (c.cuts[:, p + 1] == part.blocks[1])
                        & (c.gpu[:, p] == types.index(part.gpu)) & (c.v[:, p] == part.v)
                        & (c.batch[:, p] == part.batch))
            rows = np.flatnonzero(hit)
            if not len(rows):
                return None
            chosen.append(ChosenPipeline(mi, int(rows[0]), pl.throughput_rps,
                                         tuple(p.num_vgpus for p in pl.partitions)))
    x = column_start(cands, counts, objective, chosen)
    return np.r_[x, np.zeros(ncols - len(x))]
