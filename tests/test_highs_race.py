"""The two-thread HiGHS race (planner.solvers.highs_race) proves the same optimum as one search, and a race stopped
by its time limit keeps the better incumbent and the tighter bound."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.solvers import highs_race, milp_solvers
from planner.solvers.milp_solvers import MilpArrays, MilpResult


def knapsack(values: list[int], weights: list[int], capacity: int) -> MilpArrays:
    n = len(values)
    return MilpArrays(np.asarray(values, float), np.zeros(n), np.full(n, 3.0), np.ones(n, bool),
                      np.zeros(n, int), np.arange(n), np.asarray(weights, float), np.array([-np.inf]),
                      np.array([float(capacity)]))


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 60), st.integers(1, 40)), min_size=2, max_size=12), st.integers(10, 120))
def test_race_finds_the_optimum_one_search_finds(items: list[tuple[int, int]], capacity: int) -> None:
    m = knapsack([v for v, _ in items], [w for _, w in items], capacity)
    raced = milp_solvers._solve_highs(m, None, 0.0, False, race=True)
    alone = milp_solvers._solve_highs(m, None, 0.0, False, race=False)
    assert raced.status == alone.status == "optimal"
    assert raced.objective == pytest.approx(alone.objective)
    assert milp_solvers.is_feasible(m, raced.x)


def test_race_runs_two_searches_and_stops_the_loser() -> None:
    m = knapsack(list(range(1, 30)), [(7 * i) % 23 + 5 for i in range(1, 30)], 97)
    made: list[object] = []

    def make(extra: dict) -> object:
        h = milp_solvers._highs_model(m)
        for k, v in extra.items():
            h.setOptionValue(k, v)
        made.append(h)
        return h

    first, both = highs_race.race(make)
    assert len(made) == 2 and first in both
    assert str(first.getModelStatus()).endswith("kOptimal")


def test_unfinished_searches_keep_the_best_incumbent_and_the_tightest_bound() -> None:
    a = MilpResult("time_limit", np.array([1.0]), 10.0, 1.0, None, 14.0)
    b = MilpResult("time_limit", np.array([2.0]), 12.0, 1.0, None, 15.0)
    best = milp_solvers._better_of([a, b], maximize=True)
    assert best.objective == 12.0 and best.bound == 14.0 and best.gap == pytest.approx(2 / 12)
    low = milp_solvers._better_of([a, b], maximize=False)
    assert low.objective == 10.0 and low.bound == 15.0
