"""The pooled-pipeline MILP over enumerated whole-pipeline candidates (column generation by enumeration).

Variables, for every candidate pipeline c of every model m (see planner.ppipe.pipeline_columns):
  x_c >= 0        throughput of pipeline c (requests/s)
  n_ck in Z>=0    vGPUs of partition k of c (at c's vGPU level V_ck)
  y_mpt in Z>=0   whole physical GPUs of type t at partition position p of model m
  z               (several models) the smallest throughput / weight
Constraints:
  x_c <= r_ck n_ck                         a pipeline runs at its slowest partition
  sum_{c in m, k: pos p, type t} n_ck / V_ck <= y_mpt   vGPUs pack into whole GPUs per position
  sum_{m, p} y_mpt <= G_t                  the cluster's GPUs of each type
  z <= sum_{c in m} x_c / w_m              (several models)
Objective (throughput): max sum_c x_c (one model) or max z (several models). These are the
reference planner's terms, with any number of pipelines per GPU-type sequence instead of one.
Objective (cost, Harpagon's question over pooled pipelines): min sum_t price_t sum_{m,p} y_mpt
subject to sum_{c in m} x_c >= R_m for every model; G_t is then an upper bound on what may be used.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from planner.ppipe import relaxed_dp
from planner.ppipe.pipeline_columns import PipelineColumns
from planner.ppipe.reduction import aggregated_lp, throughput_caps, throughput_duals
from planner.solvers.milp_passes import Tightener, solve_two_pass
from planner.solvers.milp_solvers import MilpArrays, MilpResult, SolverOptions, relative_gap, solve_milp, solve_with


@dataclass(frozen=True)
class Objective:
    """What the MILP optimises: throughput (weights per model) or cost (rates per model, prices per type)."""

    kind: str = "throughput"  # throughput | cost
    weights: tuple[float, ...] = ()
    rates_rps: tuple[float, ...] = ()  # cost: throughput each model must reach
    prices: tuple[float, ...] = ()  # cost: price of one GPU (per hour) for each cluster GPU type

    @property
    def max_min(self) -> bool:
        return self.kind == "throughput" and len(self.weights) > 1


@dataclass(frozen=True)
class ColumnLayout:
    """Where each candidate's variables sit in the MILP (for reading the solution back)."""

    model_of: np.ndarray  # (C,) model index of each candidate
    x_index: np.ndarray  # (C,) column of x_c
    n_index: np.ndarray  # (C, P) column of n_ck, -1 where unused
    y_index: np.ndarray  # (Y,) columns of y_mpt
    y_keys: np.ndarray  # (Y, 3) (model, position, type) of each y
    z_index: int | None


@dataclass(frozen=True)
class ChosenPipeline:
    model: int
    candidate: int  # row in that model's PipelineColumns
    throughput_rps: float  # x_c from the solution
    num_vgpus: tuple[int, ...]  # per partition (minimal whole vGPUs carrying x_c)


@dataclass
class _Rows:
    """COO rows being assembled: lo <= sum(val * col) <= hi."""

    rows: list
    cols: list
    vals: list
    lo: list
    hi: list
    count: int = 0

    def add(self, local_rows: np.ndarray, cols: np.ndarray, vals: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> None:
        self.rows.append(self.count + np.asarray(local_rows))
        self.cols.append(np.asarray(cols))
        self.vals.append(np.asarray(vals, float))
        self.lo.append(np.asarray(lo, float))
        self.hi.append(np.asarray(hi, float))
        self.count += len(lo)


def _layout(cands: list[PipelineColumns], max_min: bool
            ) -> tuple[PipelineColumns, ColumnLayout, np.ndarray, np.ndarray]:
    """Column positions of x, n, y (and z); also the (candidate, position) of every n and its y row."""
    all_c = PipelineColumns.concat(cands, cands[0].gpu.shape[1])
    model_of = np.concatenate([np.full(len(c), i) for i, c in enumerate(cands)]).astype(int)
    num_c, num_p = all_c.gpu.shape
    ci, pi = np.nonzero(all_c.gpu >= 0)  # one n variable per used (candidate, position)
    n_index = np.full((num_c, num_p), -1)
    n_index[ci, pi] = num_c + np.arange(len(ci))
    ykeys, y_of_n = np.unique(np.stack([model_of[ci], pi, all_c.gpu[ci, pi]], 1), axis=0, return_inverse=True)
    y_idx = num_c + len(ci) + np.arange(len(ykeys))
    z_index = y_idx[-1] + 1 if max_min else None
    layout = ColumnLayout(model_of, np.arange(num_c), n_index, y_idx, ykeys.reshape(-1, 3), z_index)
    return all_c, layout, np.stack([ci, pi]), y_of_n.ravel()


def build_column_milp(cands: list[PipelineColumns], gpu_counts: np.ndarray, objective: Objective
                      ) -> tuple[MilpArrays, ColumnLayout]:
    """Assemble the MILP above as arrays (no per-variable Python objects)."""
    all_c, lay, (ci, pi), y_of_n = _layout(cands, objective.max_min)
    t_of, v_of, r_of = all_c.gpu[ci, pi], all_c.v[ci, pi], all_c.rate_rps[ci, pi]
    n_idx = lay.n_index[ci, pi]
    ncols = len(all_c) + len(ci) + len(lay.y_index) + (1 if objective.max_min else 0)
    g = gpu_counts.astype(float)
    x_ub = np.full(len(all_c), np.inf)
    np.minimum.at(x_ub, ci, r_of * g[t_of] * v_of)
    lower, upper, integer, cost = np.zeros(ncols), np.zeros(ncols), np.zeros(ncols, bool), np.zeros(ncols)
    upper[lay.x_index] = x_ub
    upper[n_idx] = np.minimum(g[t_of] * v_of, np.ceil(x_ub[ci] / r_of - 1e-9))  # no more vGPUs than x_c can use
    upper[lay.y_index] = g[lay.y_keys[:, 2]]
    integer[n_idx] = True
    integer[lay.y_index] = True
    rows = _Rows([], [], [], [], [])
    k = len(ci)
    rows.add(np.r_[np.arange(k), np.arange(k)], np.r_[ci, n_idx], np.r_[np.ones(k), -r_of],
             np.full(k, -np.inf), np.zeros(k))  # x_c - r n_ck <= 0
    ny = len(lay.y_index)
    rows.add(np.r_[y_of_n, np.arange(ny)], np.r_[n_idx, lay.y_index], np.r_[1.0 / v_of, -np.ones(ny)],
             np.full(ny, -np.inf), np.zeros(ny))  # sum n / V - y <= 0
    rows.add(lay.y_keys[:, 2], lay.y_index, np.ones(ny), np.full(len(g), -np.inf), g)  # sum y <= G_t
    nm = len(cands)
    if objective.kind == "cost":
        rows.add(lay.model_of, lay.x_index, np.ones(len(all_c)), np.asarray(objective.rates_rps, float),
                 np.full(nm, np.inf))  # sum x >= R_m
        cost[lay.y_index] = np.asarray(objective.prices, float)[lay.y_keys[:, 2]]
    elif objective.max_min:
        upper[lay.z_index] = np.inf
        cost[lay.z_index] = 1.0
        w = np.asarray(objective.weights, float)
        rows.add(np.r_[np.arange(nm), lay.model_of], np.r_[np.full(nm, lay.z_index), lay.x_index],
                 np.r_[np.ones(nm), -1.0 / w[lay.model_of]], np.full(nm, -np.inf), np.zeros(nm))  # z <= x / w
    else:
        cost[lay.x_index] = 1.0
    milp = MilpArrays(cost, lower, upper, integer, np.concatenate(rows.rows).astype(int),
                      np.concatenate(rows.cols).astype(int), np.concatenate(rows.vals), np.concatenate(rows.lo),
                      np.concatenate(rows.hi), maximize=objective.kind != "cost")
    return milp, lay


def chosen_pipelines(cands: list[PipelineColumns], layout: ColumnLayout, x: np.ndarray,
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


def _second_pass(milp: MilpArrays, layout: ColumnLayout, objective: Objective, z: float, how: str) -> MilpArrays:
    """Keep the smallest throughput/weight at ``z`` and spend what is left ("fill") or free it ("lean")."""
    lower = milp.lower.copy()
    lower[layout.z_index] = z * (1 - 1e-9)
    cost = np.zeros_like(milp.cost)
    if how == "fill":
        cost[layout.x_index] = 1.0 / np.asarray(objective.weights, float)[layout.model_of]
    else:
        cost[layout.y_index] = -1.0
    return MilpArrays(cost, lower, milp.upper, milp.integer, milp.a_row, milp.a_col, milp.a_val,
                      milp.row_lower, milp.row_upper, True)


def relaxation_bound(cands: list[PipelineColumns], gpu_counts: np.ndarray, objective: Objective) -> float | None:
    """The LP relaxation's optimum from an aggregated LP (planner.ppipe.reduction.aggregated_lp): with vGPUs
    and GPUs continuous it has the full relaxation's value. A bound for solves stopped before their root LP."""
    agg = aggregated_lp(cands, gpu_counts, objective.kind, objective.weights, objective.rates_rps, objective.prices)
    return solve_milp(agg.lp).objective


def capped(milp: MilpArrays, layout: ColumnLayout, rates: np.ndarray, caps: np.ndarray) -> MilpArrays:
    """The MILP with x_c <= cap_c and n_ck <= ceil(cap_c / r_ck) (caps from planner.ppipe.reduction)."""
    upper = milp.upper.copy()
    upper[layout.x_index] = np.minimum(upper[layout.x_index], caps)
    ci, pi = np.nonzero(layout.n_index >= 0)
    cols = layout.n_index[ci, pi]
    upper[cols] = np.minimum(upper[cols], np.ceil(caps[ci] / rates[ci, pi] - 1e-9))
    return replace(milp, upper=upper)


def throughput_tightener(cands: list[PipelineColumns], gpu_counts: np.ndarray, objective: Objective,
                         layout: ColumnLayout) -> Tightener | None:
    """For the throughput objective: a function giving the MILP without the columns that no plan better
    than an incumbent can use (planner.ppipe.reduction, then planner.ppipe.relaxed_dp where it applies, with its
    bound); None for cost or when the LP has no duals."""
    if objective.kind != "throughput":
        return None
    duals = throughput_duals(cands, gpu_counts, objective.weights)
    if duals is None:
        return None
    rates = PipelineColumns.concat(cands, cands[0].gpu.shape[1]).rate_rps
    rel: dict[float, relaxed_dp.Relaxation] = {}  # built at the first incumbent: valid for any better one

    def tighten(milp: MilpArrays, incumbent: float) -> tuple[MilpArrays, float | None]:
        caps = throughput_caps(cands, gpu_counts, duals, incumbent)
        if not relaxed_dp.applicable(cands, gpu_counts):
            return capped(milp, layout, rates, np.concatenate(caps)), None
        if not rel or min(rel) > incumbent:
            rel.clear()
            rel[incumbent] = relaxed_dp.relax(cands[0], gpu_counts, caps[0])
        r = next(iter(rel.values()))
        return capped(milp, layout, rates, relaxed_dp.dp_caps(cands[0], gpu_counts, caps[0], incumbent, r)), r.bound
    return tighten


def solve_columns(cands: list[PipelineColumns], gpu_counts: np.ndarray, objective: Objective, opts: SolverOptions,
                  second_pass: str | None = "fill", start: np.ndarray | None = None
                  ) -> tuple[MilpResult, list[ChosenPipeline]]:
    """Solve the column MILP (from the MILP point ``start`` if given). With several models a second
    pass keeps the smallest throughput/weight and either spends what is left over ("fill": maximise
    total throughput/weight) or frees it ("lean": use as few physical GPUs as possible). The result
    reports the first pass's incumbent, bound and gap (the objective the plan is judged by)."""
    milp, layout = build_column_milp(cands, gpu_counts, objective)
    res = solve_two_pass(milp, opts, start, throughput_tightener(cands, gpu_counts, objective, layout))
    if res.x is None:
        return res, []
    if res.status != "optimal":
        res = _with_relaxation_bound(res, relaxation_bound(cands, gpu_counts, objective), milp.maximize)
    if objective.max_min and second_pass and res.objective is not None and res.objective > 0:
        left = opts.remaining(res.seconds)
        res2 = solve_with(_second_pass(milp, layout, objective, res.objective, second_pass), left, res.x)
        if res2.x is not None:
            res = MilpResult(res.status, res2.x, res.objective, res.seconds + res2.seconds, res.gap, res.bound)
    return res, chosen_pipelines(cands, layout, res.x)


def _with_relaxation_bound(res: MilpResult, lp: float | None, maximize: bool) -> MilpResult:
    """The better of the solver's bound and the LP relaxation's."""
    if lp is None:
        return res
    bound = lp if res.bound is None else (min(res.bound, lp) if maximize else max(res.bound, lp))
    return MilpResult(res.status, res.x, res.objective, res.seconds, relative_gap(res.objective, bound), bound)


def column_start(cands: list[PipelineColumns], gpu_counts: np.ndarray, objective: Objective,
                 chosen: list[ChosenPipeline]) -> np.ndarray:
    """The MILP point of a set of chosen pipelines (x, n, y and z filled in), to start a solve from."""
    milp, lay = build_column_milp(cands, gpu_counts, objective)
    x = np.zeros(milp.num_cols)
    offsets = np.cumsum([0] + [len(c) for c in cands])
    use = np.zeros(len(lay.y_index))
    ykey = {tuple(k): i for i, k in enumerate(lay.y_keys.tolist())}
    for ch in chosen:
        c_all = offsets[ch.model] + ch.candidate
        x[lay.x_index[c_all]] = ch.throughput_rps
        cand = cands[ch.model]
        for p, n in enumerate(ch.num_vgpus):
            x[lay.n_index[c_all, p]] = n
            use[ykey[(ch.model, p, int(cand.gpu[ch.candidate, p]))]] += n / float(cand.v[ch.candidate, p])
    x[lay.y_index] = np.ceil(use - 1e-9)
    if lay.z_index is not None:
        thr = np.bincount(lay.model_of, x[lay.x_index], minlength=len(cands))
        x[lay.z_index] = float(np.min(thr / np.asarray(objective.weights, float)))
    return x
