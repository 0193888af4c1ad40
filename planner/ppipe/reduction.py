"""Provable candidate reduction: reduced-cost fixing with whole vGPUs, from the LP relaxation's duals.

Why: on the hard cases many candidates are nearly as efficient as the LP's best, and the MILP's search
is over which of them fill the GPUs with the least rounding waste. Most of them cannot be part of any
plan better than a known one once their vGPUs are whole; dropping those (and capping the throughput of
the rest) leaves the same optimum with a much smaller search.

The bound. Let pi_t >= 0 price a GPU of type t and lam_m >= 0 (sum 1) weigh model m (one model: lam = 1).
For any plan, z <= sum_m lam_m X_m / w_m (z = min_m X_m / w_m) and sum_c use_t(c) <= G_t, so

    z <= B + sum_c term_c,   B = sum_t pi_t G_t,   term_c = lam_m / w_m x_c - sum_k pi_{t_k} n_ck / V_ck.

With pi, lam the aggregated LP's duals, B is the LP bound and every term_c <= 0; with whole vGPUs
(n_ck >= ceil(x_c / r_ck)) term_c is at most M_c(x_c), largest at a throughput where some partition's
vGPUs are exactly full. A plan that runs c at x_c has z <= B + sum_{c' != c} max(0, M_c') + M_c(x_c);
where that is below the incumbent, no better plan runs c at x_c. So c is dropped when even its best
level cannot beat the incumbent, and otherwise capped at its largest level that can.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.ppipe.pipeline_columns import PipelineColumns
from planner.solvers.milp_solvers import MilpArrays, solve_lp

TOLERANCE = 1e-6  # relative: keep whatever comes within this of the incumbent


@dataclass(frozen=True)
class AggregatedLp:
    """The LP relaxation with vGPUs and GPUs continuous: one row per GPU type (and per model)."""

    lp: MilpArrays
    model_of: np.ndarray  # (C,) model of every candidate (all models concatenated)
    num_types: int


@dataclass(frozen=True)
class Duals:
    """Prices of the LP relaxation: the bound B, pi per GPU type and the objective value of 1 req/s per model."""

    bound: float
    price: np.ndarray  # (T,) pi_t >= 0
    coef: np.ndarray  # (M,) lam_m / w_m (throughput objective) or 1 (one model)


def aggregated_lp(cands: list[PipelineColumns], gpu_counts: np.ndarray, kind: str, weights: tuple[float, ...],
                  rates: tuple[float, ...] = (), prices: tuple[float, ...] = ()) -> AggregatedLp:
    """Pipeline c uses sum_k 1 / (r_ck V_ck) GPUs of each type per req/s; rows: types, then models."""
    all_c = PipelineColumns.concat(cands, cands[0].gpu.shape[1])
    model_of = np.concatenate([np.full(len(c), i) for i, c in enumerate(cands)]).astype(int)
    ci, pi = np.nonzero(all_c.gpu >= 0)
    nt, nc, nm = len(gpu_counts), len(all_c), len(cands)
    use = np.zeros((nt, nc))
    np.add.at(use, (all_c.gpu[ci, pi], ci), 1.0 / (all_c.rate_rps[ci, pi] * all_c.v[ci, pi]))
    tr, cc = np.nonzero(use)
    rows, cols, vals = [tr], [cc], [use[tr, cc]]
    lo, hi = [np.full(nt, -np.inf)], [gpu_counts.astype(float)]
    cost = np.zeros(nc + 1)
    max_min = kind == "throughput" and nm > 1
    if kind == "cost":
        rows, cols, vals = rows + [nt + model_of], cols + [np.arange(nc)], vals + [np.ones(nc)]
        lo, hi = lo + [np.asarray(rates, float)], hi + [np.full(nm, np.inf)]
        cost[:nc] = np.asarray(prices, float) @ use
    elif max_min:
        w = np.asarray(weights, float)
        rows += [nt + np.arange(nm), nt + model_of]
        cols += [np.full(nm, nc), np.arange(nc)]
        vals += [np.ones(nm), -1.0 / w[model_of]]
        lo, hi = lo + [np.full(nm, -np.inf)], hi + [np.zeros(nm)]
        cost[nc] = 1.0
    else:
        cost[:nc] = 1.0
    lp = MilpArrays(cost, np.zeros(nc + 1), np.full(nc + 1, np.inf), np.zeros(nc + 1, bool),
                    np.concatenate(rows).astype(int), np.concatenate(cols).astype(int), np.concatenate(vals),
                    np.concatenate(lo), np.concatenate(hi), maximize=kind != "cost")
    return AggregatedLp(lp, model_of, nt)


def throughput_duals(cands: list[PipelineColumns], gpu_counts: np.ndarray, weights: tuple[float, ...]) -> Duals | None:
    """pi and lam from the aggregated LP of the throughput objective (None if the LP has no optimum)."""
    agg = aggregated_lp(cands, gpu_counts, "throughput", weights)
    res = solve_lp(agg.lp)
    if res is None:
        return None
    _, row_dual = res
    price = np.maximum(np.abs(row_dual[:agg.num_types]), 0.0)  # <= rows of a maximisation: pi >= 0
    if len(cands) == 1:
        coef = np.ones(1)
    else:
        lam = np.abs(row_dual[agg.num_types:])
        if lam.sum() <= 0:
            return None
        coef = lam / lam.sum() / np.asarray(weights, float)
    return Duals(float(price @ gpu_counts), price, coef)


def candidate_levels(c: PipelineColumns, i: int, gpu_counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Throughputs where some partition of candidate i is exactly full, and the vGPUs each needs there."""
    k = int(c.num_parts[i])
    r, v, t = c.rate_rps[i, :k], c.v[i, :k], c.gpu[i, :k]
    x_max = float(np.min(r * gpu_counts[t] * v))
    lv = np.unique(np.concatenate([r[p] * np.arange(1, gpu_counts[t[p]] * v[p] + 1) for p in range(k)]))
    lv = lv[lv <= x_max * (1 + 1e-12)]
    return lv, np.ceil(lv[:, None] / r[None, :] - 1e-9)


def level_terms(c: PipelineColumns, i: int, gpu_counts: np.ndarray, duals: Duals, model: int
                ) -> tuple[np.ndarray, np.ndarray]:
    """(levels, term at each level) of candidate i: lam/w x minus the priced whole vGPUs it needs."""
    k = int(c.num_parts[i])
    lv, n = candidate_levels(c, i, gpu_counts)
    per_vgpu = duals.price[c.gpu[i, :k]] / c.v[i, :k]
    return lv, duals.coef[model] * lv - n @ per_vgpu


def throughput_caps(cands: list[PipelineColumns], gpu_counts: np.ndarray, duals: Duals, incumbent: float
                    ) -> list[np.ndarray]:
    """Per model, the largest throughput of each candidate that a plan better than ``incumbent`` may
    give it (0: the candidate is in no such plan); see the module doc."""
    terms = [[level_terms(c, i, gpu_counts, duals, m) for i in range(len(c))] for m, c in enumerate(cands)]
    best = [np.array([t.max() if len(t) else -np.inf for _, t in mt]) for mt in terms]
    positive = sum(float(np.maximum(b, 0.0).sum()) for b in best)
    slack = TOLERANCE * max(1.0, abs(incumbent))
    caps = []
    for mt, b in zip(terms, best):
        need = incumbent - slack - (duals.bound + positive - np.maximum(b, 0.0))  # each term_c must reach this
        caps.append(np.array([lv[t >= nd].max(initial=0.0) for (lv, t), nd in zip(mt, need)]))
    return caps
