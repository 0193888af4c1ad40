"""The column MILP of planner.ppipe.column_milp with GPUs shared across models and partitions (co-location).

Dedicated placement gives every (model, position, GPU type) its own whole GPUs, so each rounds up on its
own. Here a physical GPU split at level V holds any V vGPUs of that level, whatever (model, partition) they
serve: with g_tV in Z>=0 the GPUs of type t split at level V,

  x_c <= r_ck n_ck                          a pipeline runs at its slowest partition
  sum_{c,k: type t, level V} n_ck <= V g_tV  vGPU slots of one level pack into GPUs of that level
  sum_V g_tV <= G_t                         the cluster's GPUs of each type
  z <= sum_{c in m} x_c / w_m               (several models)

Objective: max sum x (one model) or max z, then a second pass that keeps z and fills what is left.
Where each slot goes (which co-runners it gets) is decided afterwards by planner.colocation.colocate.
"""

from __future__ import annotations

import numpy as np

from planner.ppipe.column_milp import ChosenPipeline, ColumnLayout, chosen_pipelines
from planner.ppipe.pipeline_columns import PipelineColumns
from planner.solvers.milp_solvers import MilpArrays, MilpResult, SolverOptions, solve_with


def build_colocated_milp(cands: list[PipelineColumns], gpu_counts: np.ndarray, weights: tuple[float, ...]
                         ) -> tuple[MilpArrays, ColumnLayout]:
    all_c = PipelineColumns.concat(cands, cands[0].gpu.shape[1])
    model_of = np.concatenate([np.full(len(c), i) for i, c in enumerate(cands)]).astype(int)
    num_c, num_p = all_c.gpu.shape
    ci, pi = np.nonzero(all_c.gpu >= 0)
    n_index = np.full((num_c, num_p), -1)
    n_index[ci, pi] = num_c + np.arange(len(ci))
    t_of, v_of, r_of = all_c.gpu[ci, pi], all_c.v[ci, pi], all_c.rate_rps[ci, pi]
    gkeys, g_of_n = np.unique(np.stack([t_of, v_of], 1), axis=0, return_inverse=True)
    g_of_n = g_of_n.ravel()
    g_idx = num_c + len(ci) + np.arange(len(gkeys))
    max_min = len(cands) > 1
    z = int(g_idx[-1] + 1) if max_min else None
    ncols = num_c + len(ci) + len(gkeys) + (1 if max_min else 0)
    g = gpu_counts.astype(float)
    lower, upper, integer, cost = np.zeros(ncols), np.zeros(ncols), np.zeros(ncols, bool), np.zeros(ncols)
    x_ub = np.full(num_c, np.inf)
    np.minimum.at(x_ub, ci, r_of * g[t_of] * v_of)
    upper[:num_c] = x_ub
    n_idx = n_index[ci, pi]
    upper[n_idx] = np.minimum(g[t_of] * v_of, np.ceil(x_ub[ci] / r_of - 1e-9))
    upper[g_idx] = g[gkeys[:, 0]]
    integer[n_idx] = True
    integer[g_idx] = True
    rows, cols, vals, lo, hi = [], [], [], [], []

    def add(r, c, v, lo_, hi_):
        base = len(lo)
        rows.append(base + np.asarray(r))
        cols.append(np.asarray(c))
        vals.append(np.asarray(v, float))
        lo.extend(lo_)
        hi.extend(hi_)

    k = len(ci)
    add(np.r_[np.arange(k), np.arange(k)], np.r_[ci, n_idx], np.r_[np.ones(k), -r_of], [-np.inf] * k, [0.0] * k)
    ng = len(gkeys)
    add(np.r_[g_of_n, np.arange(ng)], np.r_[n_idx, g_idx], np.r_[np.ones(k), -gkeys[:, 1].astype(float)],
        [-np.inf] * ng, [0.0] * ng)
    types = np.unique(gkeys[:, 0])
    row_of_type = {int(t): i for i, t in enumerate(types)}
    add([row_of_type[int(t)] for t in gkeys[:, 0]], g_idx, np.ones(ng), [-np.inf] * len(types),
        [g[int(t)] for t in types])
    if max_min:
        nm = len(cands)
        w = np.asarray(weights, float)
        upper[z] = np.inf
        cost[z] = 1.0
        add(np.r_[np.arange(nm), model_of], np.r_[np.full(nm, z), np.arange(num_c)],
            np.r_[np.ones(nm), -1.0 / w[model_of]], [-np.inf] * nm, [0.0] * nm)
    else:
        cost[:num_c] = 1.0
    milp = MilpArrays(cost, lower, upper, integer, np.concatenate(rows).astype(int), np.concatenate(cols).astype(int),
                      np.concatenate(vals), np.asarray(lo, float), np.asarray(hi, float), maximize=True)
    return milp, ColumnLayout(model_of, np.arange(num_c), n_index, g_idx, np.c_[np.zeros(ng, int), gkeys], z)


def solve_colocated(cands: list[PipelineColumns], gpu_counts: np.ndarray, weights: tuple[float, ...],
                    opts: SolverOptions) -> tuple[MilpResult, list[ChosenPipeline]]:
    """Solve the MILP above (with the fill pass for several models); the pipelines it chose."""
    milp, lay = build_colocated_milp(cands, gpu_counts, weights)
    res = solve_with(milp, opts)
    if res.x is None:
        return res, []
    if lay.z_index is not None and res.objective and res.objective > 0:
        lower = milp.lower.copy()
        lower[lay.z_index] = res.objective * (1 - 1e-9)
        cost = np.zeros_like(milp.cost)
        cost[lay.x_index] = 1.0 / np.asarray(weights, float)[lay.model_of]
        fill = MilpArrays(cost, lower, milp.upper, milp.integer, milp.a_row, milp.a_col, milp.a_val,
                          milp.row_lower, milp.row_upper, True)
        left = opts.remaining(res.seconds)
        res2 = solve_with(fill, left, res.x)
        if res2.x is not None:
            res = MilpResult(res.status, res2.x, res.objective, res.seconds + res2.seconds, res.gap, res.bound)
    return res, chosen_pipelines(cands, lay, res.x)
