"""The live comparison's search for the largest load factor held at >= 99 %: bisection on the step grid, and the
second run a point gets when it falls just short (a stall of the host), never when it is overloaded."""

from __future__ import annotations

from poolpipe.paper_experiment import RECHECK_SHORTFALL, TARGET, max_passing, rechecked, search_max_lf


def curve(knee: float):
    """Attainment that holds 99.5 % up to ``knee`` and falls 20 % per 0.1 of load factor beyond it."""
    return lambda lf: 0.995 if lf <= knee else max(0.0, 0.995 - 2.0 * (lf - knee))


def test_bisection_finds_the_knee_on_the_grid():
    best, points = search_max_lf(curve(0.8), hi=1.6, start=0.7)
    assert best == 0.8
    assert points[0.8] >= TARGET and points[0.825] < TARGET
    assert len(points) <= 8  # bisection, not a sweep of 64 points


def test_a_stalled_point_is_measured_again_and_the_better_run_counts():
    calls: list[float] = []
    stalls = {0.75}  # the first run at 0.75 meets a stall of the host

    def at(lf: float) -> float:
        calls.append(lf)
        if lf in stalls:
            stalls.discard(lf)
            return TARGET - RECHECK_SHORTFALL / 2
        return curve(0.8)(lf)

    best, _ = search_max_lf(rechecked(at), hi=1.6, start=0.75)
    assert best == 0.8
    assert calls.count(0.75) == 2
    # without the second run the stall decides the search
    stalls.add(0.75)
    assert search_max_lf(at, hi=1.6, start=0.75)[0] < 0.75


def test_an_overloaded_point_is_measured_once():
    calls: list[float] = []

    def at(lf: float) -> float:
        calls.append(lf)
        return 0.5

    assert rechecked(at)(1.2) == 0.5 and calls == [1.2]
    assert max_passing({0.5: 0.999, 0.6: 0.98, 0.7: 0.995}) == 0.5  # the first failure ends the curve
