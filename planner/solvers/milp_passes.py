"""How the column MILP is solved: a quick pass, then either a search on the objective (where a bound
tighter than the LP's is known) or HiGHS's defaults, each on the MILP reduced to what can beat the
best plan known when it starts (planner.ppipe.reduction, planner.ppipe.relaxed_dp).

The search: with an incumbent z and a bound U, solve the MILP reduced for an aspiration a = (z + U) / 2
with the row objective >= a. Every plan worth a or more is in that MILP, so a solution is a better
incumbent (and proven optimal when the solve is) while infeasibility proves U = a. The reduced MILPs
are small because the reductions are strong at a high aspiration, and the search needs no good
incumbent to start.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from planner.solvers.milp_solvers import (
    MilpArrays,
    MilpResult,
    SolverOptions,
    is_feasible,
    relative_gap,
    solve_with,
)

# (MILP, incumbent) -> (the MILP without what cannot beat the incumbent, a bound on what can)
Tightener = Callable[[MilpArrays, float], tuple[MilpArrays, float | None]]


def _better_bound(a: float | None, b: float | None, maximize: bool) -> float | None:
    if a is None or b is None:
        return b if a is None else a
    return min(a, b) if maximize else max(a, b)


def _tightened(milp: MilpArrays, tighten: Tightener | None, x: np.ndarray | None
               ) -> tuple[MilpArrays, float, float | None]:
    """The MILP without what cannot beat the feasible point ``x``, x's objective (-inf: untouched) and
    a bound on any plan that beats it (None: none known beyond the solver's)."""
    if tighten is None or x is None or not milp.maximize or not is_feasible(milp, x):
        return milp, -np.inf, None
    z = float(milp.cost @ x)
    m, bound = tighten(milp, z)
    return m, z, bound


def _solve_tightened(milp: MilpArrays, tighten: Tightener | None, opts: SolverOptions, start: np.ndarray | None,
                     quick: bool = False) -> MilpResult:
    """One solve of the tightened MILP (none when the tightening's bound proves ``start``). Its bound is
    the better of the solver's and the tightening's, lifted to the incumbent it was tightened by (the
    columns it lacks are in no plan better than that); stopped without a point, the start is the
    incumbent; a tightened MILP found infeasible (numerics: the start is in it) is solved again as is."""
    t0 = time.perf_counter()
    m, z, known = _tightened(milp, tighten, start)
    if known is not None and relative_gap(z, max(known, z)) <= opts.rel_gap:
        return MilpResult("optimal", start, z, time.perf_counter() - t0, relative_gap(z, max(known, z)), max(known, z))
    res = solve_with(m, opts.remaining(time.perf_counter() - t0), start, quick)
    res = replace(res, seconds=time.perf_counter() - t0)
    if m is milp:
        return res
    if res.status == "infeasible":
        return solve_with(milp, opts.remaining(res.seconds), start, quick)
    if res.x is None:
        res = MilpResult("time_limit", start, z, res.seconds, None, res.bound)
    bounds = [b for b in (res.bound, known) if b is not None]
    bound = max(min(bounds), z) if bounds else None
    status = res.status if bound is None or relative_gap(res.objective, bound) > opts.rel_gap else "optimal"
    return replace(res, status=status, bound=bound, gap=relative_gap(res.objective, bound))


def _at_least(m: MilpArrays, aspiration: float) -> MilpArrays:
    """``m`` with the row objective >= aspiration."""
    cols = np.flatnonzero(m.cost)
    row = m.num_rows
    return replace(m, a_row=np.r_[m.a_row, np.full(len(cols), row)], a_col=np.r_[m.a_col, cols],
                   a_val=np.r_[m.a_val, m.cost[cols]], row_lower=np.r_[m.row_lower, aspiration],
                   row_upper=np.r_[m.row_upper, np.inf])


def aspiration_search(milp: MilpArrays, tighten: Tightener, opts: SolverOptions, x: np.ndarray, upper: float
                      ) -> MilpResult:
    """Bisect on the objective between the feasible point ``x`` and the bound ``upper`` (module doc)."""
    t0 = time.perf_counter()
    best, z = x, float(milp.cost @ x)
    status = "optimal"
    while relative_gap(z, upper) > opts.rel_gap:
        left = opts.remaining(time.perf_counter() - t0)
        aspiration = z + (upper - z) / 2
        reduced, _ = tighten(milp, aspiration)
        res = solve_with(_at_least(reduced, aspiration), left)
        if res.x is not None and res.objective > z:
            best, z = res.x[:milp.num_cols], float(res.objective)
        if res.status in ("optimal", "infeasible"):
            upper = min(upper, aspiration if res.bound is None else max(res.bound, aspiration))
        else:  # out of time or nodes: what the solve proved still holds
            upper = upper if res.bound is None else min(upper, max(res.bound, aspiration))
            status = "node_limit" if res.status == "node_limit" else "time_limit"
            break
    gap = relative_gap(z, max(upper, z))
    if status != "optimal" and gap <= opts.rel_gap:
        status = "optimal"
    return MilpResult(status, best, z, time.perf_counter() - t0, gap, max(upper, z))


def solve_two_pass(milp: MilpArrays, opts: SolverOptions, start: np.ndarray | None,
                   tighten: Tightener | None = None) -> MilpResult:
    """HiGHS: a quick pass (root presolve only, at most QUICK_PASS_NODES nodes) proves most models at the root; the
    rest go on from the quick pass's incumbent, by the search on the objective where the tightening
    knows a bound, else with HiGHS's defaults. Other solvers: one pass. Each solve is of the MILP as
    ``tighten`` reduces it for the best point known when it starts."""
    if opts.solver != "highs":
        return _solve_tightened(milp, tighten, opts, start)
    first = _solve_tightened(milp, tighten, opts, start, quick=True)
    left = opts.remaining(first.seconds)
    if first.status in ("optimal", "infeasible") or (opts.time_limit_s is not None and left.time_limit_s <= 1e-3):
        return first
    x = first.x if first.x is not None else start
    _, _, known = _tightened(milp, tighten, x)
    if known is not None:
        res = aspiration_search(milp, tighten, left, x, known)
    else:
        res = _solve_tightened(milp, tighten, left, x)
    bound = _better_bound(first.bound, res.bound, milp.maximize)
    if res.x is None and first.x is not None:
        res = first
    return MilpResult(res.status, res.x, res.objective, first.seconds + res.seconds,
                      relative_gap(res.objective, bound) if res.status != "optimal" else res.gap, bound)


