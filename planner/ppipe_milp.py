"""The pooled-pipeline MILP over enumerated whole-pipeline candidates (column generation by enumeration).

Variables, for every candidate pipeline c of every model m (see planner.candidates):
  x_c >= 0        throughput of pipeline c (requests/s)
  n_ck in Z>=0    vGPUs of partition k of c (at c's vGPU level V_ck)
  y_mpt in Z>=0   whole physical GPUs of type t at partition position p of model m
  z               (several models) the smallest throughput / weight
Constraints:
  x_c <= r_ck n_ck                         a pipeline runs at its slowest partition
  sum_{c in m, k: pos p, type t} n_ck / V_ck <= y_mpt   vGPUs pack into whole GPUs per position
  sum_{m, p} y_mpt <= G_t                  the cluster's GPUs of each type
  z <= sum_{c in m} x_c / w_m              (several models)
Objective: max sum_c x_c (one model) or max z (several models). These are the reference planner's
terms, with any number of pipelines per GPU-type sequence instead of one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from planner.candidates import Candidates
from planner.milp_solvers import DEFAULT_REL_GAP, MilpArrays, MilpResult, solve_milp


@dataclass(frozen=True)
class ColumnLayout:
    """Where each candidate's variables sit in the MILP (for reading the solution back)."""

    model_of: np.ndarray  # (C,) model index of each candidate
    x_index: np.ndarray  # (C,) column of x_c
    n_index: np.ndarray  # (C, P) column of n_ck, -1 where unused
    y_index: np.ndarray  # (Y,) columns of y_mpt
    z_index: int | None


@dataclass(frozen=True)
class ChosenPipeline:
    model: int
    candidate: int  # row in that model's Candidates
    throughput_rps: float  # x_c from the solution
    num_vgpus: tuple[int, ...]  # per partition (minimal whole vGPUs carrying x_c)


def build_column_milp(cands: list[Candidates], gpu_counts: np.ndarray, weights: list[float],
                      max_min: bool) -> tuple[MilpArrays, ColumnLayout]:
    """Assemble the MILP above as arrays (no per-variable Python objects)."""
    all_c = Candidates.concat(cands, cands[0].gpu.shape[1]) if cands else None
    model_of = np.concatenate([np.full(len(c), i) for i, c in enumerate(cands)]).astype(int)
    num_c, num_p = all_c.gpu.shape
    used = all_c.gpu >= 0
    ci, pi = np.nonzero(used)  # one n variable per used (candidate, position)
    t_of = all_c.gpu[ci, pi]
    v_of = all_c.v[ci, pi]
    r_of = all_c.rate_rps[ci, pi]
    x_idx = np.arange(num_c)
    n_idx_flat = num_c + np.arange(len(ci))
    n_index = np.full((num_c, num_p), -1)
    n_index[ci, pi] = n_idx_flat
    # y per (model, position, type) that some candidate uses
    ykey = np.stack([model_of[ci], pi, t_of], 1)
    ykeys, y_of_n = np.unique(ykey, axis=0, return_inverse=True)
    y_of_n = y_of_n.ravel()
    y_idx = num_c + len(ci) + np.arange(len(ykeys))
    ncols = num_c + len(ci) + len(ykeys) + (1 if max_min else 0)
    z_index = ncols - 1 if max_min else None

    g = gpu_counts.astype(float)
    lower = np.zeros(ncols)
    upper = np.empty(ncols)
    n_ub = g[t_of] * v_of
    x_ub = np.full(num_c, np.inf)
    np.minimum.at(x_ub, ci, r_of * n_ub)
    upper[x_idx] = x_ub
    upper[n_idx_flat] = n_ub
    upper[y_idx] = g[ykeys[:, 2]]
    integer = np.zeros(ncols, bool)
    integer[n_idx_flat] = True
    integer[y_idx] = True
    cost = np.zeros(ncols)
    if max_min:
        upper[z_index] = np.inf
        cost[z_index] = 1.0
    else:
        cost[x_idx] = 1.0

    rows, cols, vals, rlo, rhi = [], [], [], [], []
    r0 = 0
    # (a) x_c - r n_ck <= 0
    k = len(ci)
    rows += [r0 + np.arange(k)] * 2
    cols += [ci, n_idx_flat]
    vals += [np.ones(k), -r_of]
    rlo.append(np.full(k, -np.inf))
    rhi.append(np.zeros(k))
    r0 += k
    # (b) sum n / V - y <= 0
    ny = len(ykeys)
    rows += [r0 + y_of_n, r0 + np.arange(ny)]
    cols += [n_idx_flat, y_idx]
    vals += [1.0 / v_of, -np.ones(ny)]
    rlo.append(np.full(ny, -np.inf))
    rhi.append(np.zeros(ny))
    r0 += ny
    # (c) sum_y per type <= G_t
    rows.append(r0 + ykeys[:, 2])
    cols.append(y_idx)
    vals.append(np.ones(ny))
    rlo.append(np.full(len(g), -np.inf))
    rhi.append(g)
    r0 += len(g)
    # (d) z - sum x / w <= 0
    if max_min:
        nm = len(cands)
        rows += [r0 + np.arange(nm), r0 + model_of]
        cols += [np.full(nm, z_index), x_idx]
        vals += [np.ones(nm), -1.0 / np.asarray(weights, float)[model_of]]
        rlo.append(np.full(nm, -np.inf))
        rhi.append(np.zeros(nm))
        r0 += nm
    milp = MilpArrays(cost, lower, upper, integer, np.concatenate(rows).astype(int),
                      np.concatenate(cols).astype(int), np.concatenate(vals).astype(float),
                      np.concatenate(rlo), np.concatenate(rhi), maximize=True)
    return milp, ColumnLayout(model_of, x_idx, n_index, y_idx, z_index)


def chosen_pipelines(cands: list[Candidates], layout: ColumnLayout, x: np.ndarray,
                     min_rps: float = 1e-6) -> list[ChosenPipeline]:
    """Pipelines with positive throughput in a solution, with the whole vGPUs each partition needs."""
    out = []
    offsets = np.cumsum([0] + [len(c) for c in cands])
    for c_all in np.flatnonzero(x[layout.x_index] > min_rps):
        m = int(layout.model_of[c_all])
        c = int(c_all - offsets[m])
        cand = cands[m]
        thr = float(x[layout.x_index[c_all]])
        kk = int(cand.num_parts[c])
        solver_n = np.rint(x[layout.n_index[c_all, :kk]]).astype(int)
        need = [max(1, math.ceil(thr / float(cand.rate_rps[c, p]) - 1e-7)) for p in range(kk)]
        out.append(ChosenPipeline(m, c, thr, tuple(min(a, b) if b >= 1 else a for a, b in zip(need, solver_n))))
    return out


def solve_columns(cands: list[Candidates], gpu_counts: np.ndarray, weights: list[float], solver: str,
                  time_limit_s: float | None, log: bool = False, rel_gap: float = DEFAULT_REL_GAP,
                  second_pass: str | None = "fill") -> tuple[MilpResult, list[ChosenPipeline]]:
    """Solve the column MILP. With several models a second pass keeps the smallest throughput/weight
    and either spends what is left over ("fill": maximise total throughput/weight) or frees it
    ("lean": use as few physical GPUs as possible)."""
    max_min = len(cands) > 1
    milp, layout = build_column_milp(cands, gpu_counts, weights, max_min)
    res = solve_milp(milp, solver, time_limit_s, rel_gap, log)
    if res.x is None:
        return res, []
    if max_min and second_pass and res.objective is not None and res.objective > 0:
        z = res.objective
        lower = milp.lower.copy()
        lower[layout.z_index] = z * (1 - 1e-9)
        cost = np.zeros_like(milp.cost)
        if second_pass == "fill":
            cost[layout.x_index] = 1.0 / np.asarray(weights, float)[layout.model_of]
        else:
            cost[layout.y_index] = -1.0
        second = MilpArrays(cost, lower, milp.upper, milp.integer, milp.a_row, milp.a_col, milp.a_val,
                            milp.row_lower, milp.row_upper, True)
        left = None if time_limit_s is None else max(1e-3, time_limit_s - res.seconds)
        res2 = solve_milp(second, solver, left, rel_gap, log)
        if res2.x is not None:
            res = MilpResult(res.status if res2.status == "optimal" else res2.status, res2.x, z,
                             res.seconds + res2.seconds, res.gap)
    return res, chosen_pipelines(cands, layout, res.x)
