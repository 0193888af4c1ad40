"""Latency distributions for variable-latency models: quantile functions, batch order statistics, Orloj's score.

A distribution is a piecewise-linear quantile function (latencies at increasing levels in [0, 1]), i.e. a
histogram with one uniform bin between consecutive levels (a zero-width bin is a point mass). A batch is
padded to its longest request, so a batch of k requests drawn from F takes as long as the slowest one:
``F_max = F^k`` (``order_statistic``); requests from different distributions give the product of their
CDFs (``max_of``). ``priority`` is Orloj's score (§4.1) of a request with ``slack`` left before its deadline.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

GRID = 129  # levels of a derived distribution (order statistics, sums, products)


@dataclass(frozen=True)
class QuantileDist:
    """Latencies (µs) at ``levels``; below the first level the first value, above the last the last."""

    levels: tuple[float, ...]
    values: tuple[float, ...]

    def __post_init__(self) -> None:
        lv, vs = self.levels, self.values
        if len(lv) < 2 or len(lv) != len(vs):
            raise ValueError(f"a latency distribution needs >= 2 levels and one value per level, got {lv}, {vs}")
        if lv[0] < 0 or lv[-1] > 1 or any(b <= a for a, b in zip(lv, lv[1:])):
            raise ValueError(f"levels must increase strictly within [0, 1], got {lv}")
        if any(b < a for a, b in zip(vs, vs[1:])) or vs[0] < 0 or not math.isfinite(vs[-1]):
            raise ValueError(f"latencies must be finite, >= 0 and non-decreasing, got {vs}")

    @classmethod
    def point(cls, us: float) -> "QuantileDist":
        """A fixed latency (a model without a measured distribution)."""
        return cls((0.0, 1.0), (float(us), float(us)))

    @classmethod
    def from_arrays(cls, levels: np.ndarray, values: np.ndarray) -> "QuantileDist":
        return cls(tuple(float(x) for x in levels), tuple(float(x) for x in np.maximum.accumulate(values)))

    def _full(self) -> tuple[np.ndarray, np.ndarray]:
        """Levels extended to exactly [0, 1] (the tails flat), as arrays."""
        lv, vs = np.asarray(self.levels), np.asarray(self.values)
        if lv[0] > 0:
            lv, vs = np.concatenate(([0.0], lv)), np.concatenate(([vs[0]], vs))
        if lv[-1] < 1:
            lv, vs = np.concatenate((lv, [1.0])), np.concatenate((vs, [vs[-1]]))
        return lv, vs

    def quantile(self, u: float | np.ndarray) -> float | np.ndarray:
        """The latency at level(s) ``u`` (a sample when ``u`` is uniform)."""
        return np.interp(u, self.levels, self.values)

    def cdf(self, x: float | np.ndarray) -> float | np.ndarray:
        lv, vs = self._full()
        return np.interp(x, vs, lv, left=0.0, right=1.0)

    @property
    def mean(self) -> float:
        lv, vs = self._full()
        return float(np.sum(np.diff(lv) * (vs[1:] + vs[:-1]) / 2))

    @property
    def low(self) -> float:
        return self.values[0]

    @property
    def high(self) -> float:
        return self.values[-1]

    def shifted(self, us: float) -> "QuantileDist":
        return QuantileDist(self.levels, tuple(v + us for v in self.values))

    def order_statistic(self, k: int) -> "QuantileDist":
        """The maximum of ``k`` independent draws: CDF F^k, so its quantile at level u is this one's at u^(1/k)."""
        if k < 1:
            raise ValueError(f"order statistic of k={k} draws: k must be >= 1")
        if k == 1:
            return self
        grid = np.linspace(0.0, 1.0, GRID)
        return QuantileDist.from_arrays(grid, np.asarray(self.quantile(grid ** (1.0 / k))))

    def bins(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The histogram: (bin starts, widths, probability masses)."""
        lv, vs = self._full()
        mass = np.diff(lv)
        keep = mass > 0
        return vs[:-1][keep], np.diff(vs)[keep], mass[keep]


def comonotone_sum(dists: Sequence[QuantileDist]) -> QuantileDist:
    """Latency of stages run one after another on one input: fast or slow together, quantiles add."""
    if len(dists) == 1:
        return dists[0]
    grid = np.linspace(0.0, 1.0, GRID)
    return QuantileDist.from_arrays(grid, np.sum([d.quantile(grid) for d in dists], axis=0))


def max_of(dists: Sequence[QuantileDist]) -> QuantileDist:
    """The maximum of independent draws from each of ``dists`` (not necessarily identical): CDF = product."""
    if not dists:
        raise ValueError("max_of needs at least one distribution")
    if len(dists) == 1:
        return dists[0]
    vs = np.concatenate([np.asarray(d.values) for d in dists])
    xs = np.unique(np.concatenate((vs, np.nextafter(vs, -np.inf))))  # both sides of a point mass's jump
    if len(xs) == 1:
        return QuantileDist.point(float(xs[0]))
    cdf = np.prod([d.cdf(xs) for d in dists], axis=0)
    grid = np.linspace(0.0, 1.0, GRID)
    # the inverse of the product CDF; below its first value the smallest latency any batch can take
    return QuantileDist.from_arrays(grid, np.interp(grid, cdf, xs, left=xs[0], right=xs[-1]))


@dataclass(frozen=True)
class PriorityScore:
    """Orloj's p(t) for requests whose batch takes ``dist``: the expected SLO cost saved by running now instead of
    after an exponentially distributed delay (rate ``b_per_us``), per µs of expected worker time.

    Per histogram bin [l1, l1 + w) of density h = mass / w, with x = deadline - now the slack: the bin's part
    of E[e^(-b(x - L)); L < x] is (h / b) e^(-b(x - l1 - a)) (1 - e^(-b a)) where a = clip(x - l1, 0, w), the
    part of the bin that still meets the deadline. A request certain to make it scores ~ e^(-b x) (earliest
    deadline first); one whose deadline falls inside the distribution scores about its chance of making it;
    one that cannot make it scores 0.
    """

    starts: np.ndarray
    widths: np.ndarray
    masses: np.ndarray
    inv_mean: float
    b_per_us: float

    @classmethod
    def of(cls, dist: QuantileDist, b_per_us: float) -> "PriorityScore":
        if not b_per_us > 0:
            raise ValueError(f"anticipation factor b={b_per_us} must be > 0")
        s, w, m = dist.bins()
        return cls(s, w, m, 1.0 / max(dist.mean, 1e-9), b_per_us)

    def __call__(self, slack_us: np.ndarray) -> np.ndarray:
        b = self.b_per_us
        x = np.asarray(slack_us, dtype=float)[:, None]
        a = np.clip(x - self.starts, 0.0, self.widths)
        wide = self.widths > 0
        frac = np.where(wide, -np.expm1(-b * a) / (b * np.where(wide, self.widths, 1.0)), (x > self.starts) * 1.0)
        part = self.masses * np.exp(-b * np.maximum(x - self.starts - a, 0.0)) * frac
        return part.sum(axis=1) * self.inv_mean


class TabulatedScore:
    """``PriorityScore`` interpolated from a table over the distribution's range (np.interp per request instead
    of a pass over every bin); past the range it is exact: every bin is below the slack, so p falls as e^(-b x)."""

    def __init__(self, score: PriorityScore, low_us: float, high_us: float, points: int = 4097) -> None:
        self.high_us = high_us
        self.b_per_us = score.b_per_us
        self.inv_mean = score.inv_mean
        self.xs = np.linspace(low_us, max(high_us, low_us + 1e-6), points)
        self.ps = score(self.xs)
        self.at_high = float(self.ps[-1])

    def __call__(self, slack_us: np.ndarray) -> np.ndarray:
        x = np.asarray(slack_us, dtype=float)
        beyond = self.at_high * np.exp(-self.b_per_us * np.maximum(x - self.high_us, 0.0))
        return np.where(x > self.high_us, beyond, np.interp(x, self.xs, self.ps, left=0.0))
