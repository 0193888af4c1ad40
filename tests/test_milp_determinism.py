"""Same inputs, same plan: a MILP with many optimal solutions is answered with the same one every time (one
single-threaded HiGHS search; a race of two seeds answered with whichever finished first), and the quick pass is
bounded by work, not seconds, so a slower machine's first incumbent is the same."""

from __future__ import annotations

import numpy as np

from planner.solvers import milp_passes, milp_solvers
from planner.solvers.milp_solvers import MilpArrays, SolverOptions


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
