"""The largest load a live system holds: load factors searched on a step grid (or measured on a given grid), each
point judged at >= 99 % SLO attainment, points near it measured again (loadtest.tries). Used by
poolpipe.paper_experiment (live_paper, the demo) and its report."""

from __future__ import annotations

from collections.abc import Callable

from loadtest.tries import judged, tries_of

TARGET = 0.99
STEP = 0.0125  # of the fixed-margin plan's nominal rate: 2.6 % of convnext_large's knee (0.025 was 5.2 %)
# A live point short of TARGET by less than this is measured again and judged as calibration judges its steps
# (loadtest.tries): a stall of this 2-core host fails a 4-6 s point at random (tf_efficientdet_d1 at 2.5x, whole in
# two plans of one layout, held 99.39 % and 93.28 % at 272.4 req/s); short by more: overload.
RECHECK_SHORTFALL = 0.10


def max_passing(points: dict[float, float], target: float = TARGET) -> float:
    """The largest load factor with attainment >= ``target`` below the first one that fell short (0 if none)."""
    best = 0.0
    for lf in sorted(points):
        if points[lf] < target:
            break
        best = lf
    return best


def measure_grid(attainment_at: Callable[[float], float], grid: tuple[float, ...]
                 ) -> tuple[float, dict[float, float]]:
    """Attainment at every load factor of ``grid``, and :func:`max_passing` of it."""
    points = {lf: attainment_at(lf) for lf in sorted(grid)}
    return max_passing(points), points


def rechecked(attainment_at: Callable[[float], float], target: float = TARGET) -> Callable[[float], float]:
    """``attainment_at`` whose points short of ``target`` by less than RECHECK_SHORTFALL are measured again and count
    for the median of their tries (loadtest.tries); every system of a comparison is measured this way."""
    def at(lf: float) -> float:
        return judged(tries_of(lambda _k: attainment_at(lf), float, target, RECHECK_SHORTFALL))
    return at


def search_max_lf(attainment_at: Callable[[float], float], hi: float, step: float = STEP,
                  start: float = 0.7) -> tuple[float, dict[float, float]]:
    """Largest load factor on the step grid in (0, hi] with attainment >= TARGET, by bisection (attainment is
    taken as falling with load); returns it and every point measured."""
    grid = [round(step * i, 4) for i in range(1, int(round(hi / step)) + 1)]
    points: dict[float, float] = {}
    lo_i, hi_i = -1, len(grid)  # grid[lo_i] passes, grid[hi_i] fails (virtual ends)
    i = min(range(len(grid)), key=lambda k: abs(grid[k] - start))
    while hi_i - lo_i > 1:
        points[grid[i]] = attainment_at(grid[i])
        if points[grid[i]] >= TARGET:
            lo_i = i
        else:
            hi_i = i
        i = (lo_i + hi_i) // 2
    return (grid[lo_i] if lo_i >= 0 else 0.0), points
