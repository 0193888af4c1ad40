"""Exact least-cost GPU counts for one or two GPU types: a search over GPU counts, cheapest first.

Why not one MILP: with cost as the objective the LP relaxation pays for fractional GPUs, and HiGHS
must then rule out every cheaper whole-GPU count one branch at a time (even 4 + 8 GPUs can take it
minutes). Here the question "can (A high, B low) GPUs serve the rates?" is asked of the counts in
order of cost; the first yes is the optimum. Whether (A, B) serve the rates is monotone in A and B,
so most answers are free: below the LP relaxation's least B for that A (one small LP per A) it is
no, where the whole-GPU DP (planner.ppipe.whole_gpu) serves the rates it is yes, and a point below a no or
above a yes shares its answer. The rest are feasibility MILPs (the column MILP with the rates as
constraints and no objective), each capped at a share of the time left; a point left undecided is
retried with more time, and when time runs out the cheapest undecided point is the proven bound.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from planner.ppipe import whole_gpu
from planner.ppipe.column_milp import ChosenPipeline, Objective, relaxation_bound, solve_columns
from planner.ppipe.pipeline_columns import PipelineColumns
from planner.solvers.milp_solvers import MilpResult, SolverOptions

CHECK_SHARE = 0.2  # a feasibility MILP may use this share of the time left (at least MIN_CHECK_S)
MIN_CHECK_S = 0.5


@dataclass
class Feasibility:
    """Answers to "do these GPU counts serve the rates?", with the plan for every yes."""

    cands: list[PipelineColumns]
    rates: tuple[float, ...]
    opts: SolverOptions
    dp: np.ndarray | None  # max-min of F_m / R_m over (A, B) from the whole-GPU DP, if it applies
    tables: list | None
    splits: list | None
    yes: dict[tuple[int, int], list[ChosenPipeline]] = field(default_factory=dict)
    no: list[tuple[int, int]] = field(default_factory=list)
    ntypes: int = 2
    deadline: float | None = None

    def _dp_plan(self, a: int, b: int) -> list[ChosenPipeline]:
        if len(self.cands) == 1:
            return whole_gpu.chosen(0, self.cands[0], whole_gpu.rebuild(self.tables[0], a, b))
        out = []
        splits = whole_gpu.split_max_min(self.splits, (a, b))
        for m, (am, bm) in enumerate(splits):
            out += whole_gpu.chosen(m, self.cands[m], whole_gpu.rebuild(self.tables[m], am, bm))
        return out

    def _milp(self, a: int, b: int) -> bool | None:
        """A feasibility MILP on (a, b) within its share of the time left; None when undecided."""
        left = None if self.deadline is None else self.deadline - time.perf_counter()
        if left is not None and left <= 1e-3:
            return None
        cap = None if left is None else min(left, max(MIN_CHECK_S, CHECK_SHARE * left))
        objective = Objective("cost", self.rates, self.rates, (0.0,) * self.ntypes)
        counts = np.array([a, b][: self.ntypes])
        res, chosen = solve_columns(self.cands, counts, objective,
                                    SolverOptions(self.opts.solver, cap, self.opts.rel_gap, self.opts.log),
                                    second_pass=None)
        if res.x is not None:
            self.yes[(a, b)] = chosen
            return True
        if res.status == "infeasible":
            self.no.append((a, b))
            return False
        return None


def lp_least_b(cands: list[PipelineColumns], counts: np.ndarray, rates: tuple[float, ...]) -> list[int]:
    """For every A, the fewest low GPUs with which even the LP relaxation serves the rates (B + 1: never)."""
    ga, gb = int(counts[0]), int(counts[1])
    out = []
    for a in range(ga + 1):
        low = relaxation_bound(cands, np.array([a, gb]), Objective("cost", rates, rates, (0.0, 1.0)))
        out.append(gb + 1 if low is None else max(0, math.ceil(low - 1e-7)))
    return out


def _ordered_points(counts: np.ndarray, prices: tuple[float, ...], least_b: list[int]) -> list[tuple[float, int, int]]:
    """(cost, A, B) of every count the LP relaxation allows, cheapest first (then fewer GPUs)."""
    two = len(counts) == 2
    pts = [(prices[0] * a + (prices[1] * b if two else 0.0), a, b)
           for a in range(int(counts[0]) + 1) for b in (range(least_b[a], int(counts[1]) + 1) if two else [0])]
    return sorted(pts, key=lambda p: (round(p[0], 9), p[1] + p[2], p[1]))


def _answer(feasible: Feasibility, a: int, b: int) -> bool | None:
    """Free answers first (known, dominated, DP), then the MILP."""
    if (a, b) in feasible.yes:
        return True
    if any(a <= na and b <= nb for na, nb in feasible.no):
        return False
    if feasible.dp is not None and feasible.dp[a, b] >= 1 - 1e-9:
        feasible.yes[(a, b)] = feasible._dp_plan(a, b)
        return True
    return feasible._milp(a, b)


def cheapest_counts(cands: list[PipelineColumns], counts: np.ndarray, rates: tuple[float, ...],
                    prices: tuple[float, ...], opts: SolverOptions) -> tuple[MilpResult, list[ChosenPipeline]]:
    """Least-cost (A, B) that serves ``rates`` and its plan; status time_limit if the search was cut short
    (its bound: the cheapest count still undecided)."""
    t0 = time.perf_counter()
    tables = [whole_gpu.model_table(c, counts) for c in cands] if whole_gpu.applicable(cands, counts) else None
    dp, splits = (None, None) if tables is None else whole_gpu.combine(tables, list(rates))
    feasible = Feasibility(cands, rates, opts, dp, tables, splits, ntypes=len(counts),
                           deadline=None if opts.time_limit_s is None else t0 + opts.time_limit_s)
    least_b = lp_least_b(cands, counts, rates) if len(counts) == 2 else [0] * (int(counts[0]) + 1)
    best, pending = _search(feasible, _ordered_points(counts, prices, least_b))
    secs = time.perf_counter() - t0
    if best is None:
        return MilpResult("time_limit" if pending else "infeasible", None, None, secs), []
    bound = min([best[0]] + [c for c, _, _ in pending])
    status = "optimal" if not pending else "time_limit"
    return (MilpResult(status, None, best[0], secs, (best[0] - bound) / max(best[0], 1e-9), bound),
            feasible.yes[(best[1], best[2])])


def _search(feasible: Feasibility, pending: list[tuple[float, int, int]]
            ) -> tuple[tuple[float, int, int] | None, list[tuple[float, int, int]]]:
    """Cheapest yes, and the cheaper points left undecided when time ran out (passes with growing caps)."""
    best = None
    while pending:
        undecided = []
        for pt in pending:
            if best is not None and pt[0] >= best[0] - 1e-12:
                break
            ans = _answer(feasible, pt[1], pt[2])
            if ans:
                best = pt
                break
            if ans is None:
                undecided.append(pt)
        pending = undecided
        if feasible.deadline is not None and time.perf_counter() >= feasible.deadline - 1e-3:
            break
    return best, pending
