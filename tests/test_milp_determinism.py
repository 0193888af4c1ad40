"""Same inputs, same plan: a MILP with many optimal solutions is answered with the same one every time (one
single-threaded HiGHS search; a race of two seeds answered with whichever finished first), and the quick pass is
bounded by work, not seconds, so a slower machine's first incumbent is the same; so is a screen's whole solve
(SolverOptions.max_nodes)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from planner.solvers import milp_passes, milp_solvers
from planner.solvers.milp_solvers import MilpArrays, SolverOptions
from planner.sustained.search import SCREEN_NODES, screening


def tied_knapsack(n: int = 40) -> MilpArrays:
    """n items of equal value and weight, room for half of them: C(n, n/2) optimal solutions."""
    return MilpArrays(np.ones(n), np.zeros(n), np.ones(n), np.ones(n, bool), np.zeros(n, int), np.arange(n),
                      np.full(n, 3.0), np.array([-np.inf]), np.array([3.0 * n / 2]))


def test_one_milp_one_answer() -> None:
    m = tied_knapsack()
    answers = {tuple(milp_solvers.solve_milp(m, "highs").x) for _ in range(12)}
    assert len(answers) == 1


def test_quick_pass_is_bounded_by_work_not_time() -> None:
    m = tied_knapsack()
    # with no time limit at all the quick pass still ends (mip_max_nodes), and with a generous one it answers the same
    free = milp_passes.solve_two_pass(m, SolverOptions("highs", None), None)
    limited = milp_passes.solve_two_pass(m, SolverOptions("highs", 600.0), None)
    assert free.status == limited.status == "optimal"
    assert np.array_equal(free.x, limited.x)


def correlated_knapsack(n: int = 40, k: int = 5, seed: int = 1) -> MilpArrays:
    """k knapsack rows whose item values track their weights: HiGHS takes tens of seconds to prove the optimum."""
    rng = np.random.default_rng(seed)
    w = rng.integers(50, 100, size=(k, n)).astype(float)
    rows, cols = np.nonzero(np.ones((k, n)))
    return MilpArrays(w.sum(0) + rng.integers(0, 20, n), np.zeros(n), np.ones(n), np.ones(n, bool), rows, cols,
                      w[rows, cols], np.full(k, -np.inf), w.sum(1) / 2)


def test_a_solve_within_max_nodes_ends_at_the_same_point_without_a_clock() -> None:
    m = correlated_knapsack()
    opts = replace(SolverOptions("highs", None, 1e-6), max_nodes=50)
    first, again = (milp_passes.solve_two_pass(m, opts, None) for _ in range(2))
    assert first.status == "node_limit" and first.gap > opts.rel_gap
    assert np.array_equal(first.x, again.x) and first.objective == again.objective
    assert milp_solvers.is_feasible(m, first.x)


def test_screening_bounds_the_work_of_every_solve() -> None:
    assert screening(SolverOptions("highs", 60.0)).max_nodes == SCREEN_NODES
    assert screening(SolverOptions("highs", 60.0, max_nodes=10)).max_nodes == 10
