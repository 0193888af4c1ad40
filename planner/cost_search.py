"""Exact least-cost GPU counts for one or two GPU types: a search over the staircase of GPU counts.

Why not one MILP: with cost as the objective the LP relaxation pays for fractional GPUs, and HiGHS
must then rule out every cheaper whole-GPU count one branch at a time (even 4 + 8 GPUs can take it
minutes). Here the question "can (A high, B low) GPUs serve the rates?" is monotone in A and B, so
for each A the least B is found by bisection, and the cheapest (A, B) over all A is the optimum.
Each question is answered, cheapest first, by: the whole-GPU DP (planner.whole_gpu: yes if its plan
serves the rates), a known answer for a point that dominates or is dominated, or a feasibility MILP
(the column MILP with the rates as constraints and no objective).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from planner import whole_gpu
from planner.candidates import Candidates
from planner.milp_solvers import MilpResult, SolverOptions
from planner.ppipe_milp import ChosenPipeline, Objective, solve_columns


@dataclass
class Feasibility:
    """Answers to "do these GPU counts serve the rates?", with the plan for every yes."""

    cands: list[Candidates]
    rates: tuple[float, ...]
    opts: SolverOptions
    dp: np.ndarray | None  # max-min of F_m / R_m over (A, B) from the whole-GPU DP, if it applies
    tables: list | None
    splits: list | None
    yes: dict[tuple[int, int], list[ChosenPipeline]] = field(default_factory=dict)
    no: list[tuple[int, int]] = field(default_factory=list)
    ntypes: int = 2
    deadline: float | None = None
    stopped: bool = False

    def __call__(self, a: int, b: int) -> bool:
        if (a, b) in self.yes:
            return True
        if any(a <= na and b <= nb for na, nb in self.no):
            return False
        if any(a >= ya and b >= yb for ya, yb in self.yes):
            self.yes[(a, b)] = self.yes[next((ya, yb) for ya, yb in self.yes if a >= ya and b >= yb)]
            return True
        if self.dp is not None and self.dp[a, b] >= 1 - 1e-9:
            self.yes[(a, b)] = self._dp_plan(a, b)
            return True
        return self._milp(a, b)

    def _dp_plan(self, a: int, b: int) -> list[ChosenPipeline]:
        if len(self.cands) == 1:
            return whole_gpu.chosen(0, self.cands[0], whole_gpu.rebuild(self.tables[0], a, b))
        out = []
        splits = whole_gpu.split_max_min(self.splits, (a, b))
        for m, (am, bm) in enumerate(splits):
            out += whole_gpu.chosen(m, self.cands[m], whole_gpu.rebuild(self.tables[m], am, bm))
        return out

    def _milp(self, a: int, b: int) -> bool:
        left = None if self.deadline is None else self.deadline - time.perf_counter()
        if left is not None and left <= 0:
            self.stopped = True
            return False
        objective = Objective("cost", self.rates, self.rates, (0.0,) * self.ntypes)
        counts = np.array([a, b][: self.ntypes])
        opts = SolverOptions(self.opts.solver, left, self.opts.rel_gap, self.opts.log)
        res, chosen = solve_columns(self.cands, counts, objective, opts, second_pass=None)
        if res.x is not None:
            self.yes[(a, b)] = chosen
            return True
        if res.status == "infeasible":
            self.no.append((a, b))
        else:
            self.stopped = True
        return False


def _least_b(feasible: Feasibility, a: int, hi: int) -> int | None:
    """Least B <= hi with (a, B) feasible, by bisection (None if even (a, hi) is not)."""
    if not feasible(a, hi):
        return None
    lo = -1  # (a, lo) infeasible (virtual)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if feasible(a, mid):
            hi = mid
        else:
            lo = mid
    return hi


def cheapest_counts(cands: list[Candidates], counts: np.ndarray, rates: tuple[float, ...],
                    prices: tuple[float, ...], opts: SolverOptions) -> tuple[MilpResult, list[ChosenPipeline]]:
    """Least-cost (A, B) that serves ``rates`` and its plan; status time_limit if the search was cut short."""
    t0 = time.perf_counter()
    two = len(counts) == 2
    tables = [whole_gpu.model_table(c, counts) for c in cands] if whole_gpu.applicable(cands, counts) else None
    dp, splits = (None, None) if tables is None else whole_gpu.combine(tables, list(rates))
    feasible = Feasibility(cands, rates, opts, dp, tables, splits, ntypes=len(counts),
                           deadline=None if opts.time_limit_s is None else t0 + opts.time_limit_s)
    ga, gb = int(counts[0]), int(counts[1]) if two else 0
    pa, pb = float(prices[0]), float(prices[1]) if two else 0.0
    best: tuple[float, int, int] | None = None
    hi = gb
    for a in range(ga + 1):
        if best is not None and pa * a > best[0] + 1e-12:
            break
        b = _least_b(feasible, a, hi) if two else (0 if feasible(a, 0) else None)
        if b is None:
            continue
        hi = b  # the least B never grows with A
        if best is None or pa * a + pb * b < best[0] - 1e-12:
            best = (pa * a + pb * b, a, b)
        if feasible.stopped:
            break
    secs = time.perf_counter() - t0
    if best is None:
        return MilpResult("time_limit" if feasible.stopped else "infeasible", None, None, secs), []
    status = "time_limit" if feasible.stopped else "optimal"
    return MilpResult(status, None, best[0], secs, 0.0 if status == "optimal" else None,
                      best[0] if status == "optimal" else None), feasible.yes[(best[1], best[2])]
