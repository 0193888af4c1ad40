"""The cost model fitted to what a deployment measured (``poolpipe calibrate``): a stage call's lead and tail as a
base plus slopes in its megabytes and in the rate the sidecar serves, and the way outside the sidecar's clock as a
base distribution plus slopes in the request's input megabytes and in the rate (poolpipe_common.overheads.Overheads
holds them).

Least squares weighted by calls, with no slope below 0: a cost that seems to fall with the bytes or the rate is noise
on this host (a larger call never costs less to serialise), and a negative slope would promise more at higher rates."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

import numpy as np

from poolpipe_common.overheads import Overheads, front_quantiles, median_overheads

# A measured rate's 99th percentile of the way outside the sidecar's clock is read only with this many answers
# (5 beyond it)
TAIL_SAMPLES = 500
# A run whose attainment fell below this is overloaded: the costs it measured (the way outside the sidecar's clock
# among them) are the overload's queues, not what a plan at that rate would see, so no fit takes them (not_overloaded)
HELD_ATTAINMENT = 0.95
# The rate's slope (of the way outside the sidecar's clock, and of a stage call's lead and tail) is fitted only where
# the rates measured span at least this factor: the 99th percentile of one short run moves by 1-2 ms on this host, and
# two runs at rates 1.5x apart gave a slope of 13 ms per 1,000 req/s that promised 0.75x of what the plan held live
# (googlenet at 2.5x); two live points at 212 and 216 req/s gave lead and tail 25 and 41 ms per 1,000 req/s, and the
# simulator then put their plan (gcnet at 3x, held 216 live) at 71
MIN_RATE_SPAN = 2.0
# The probabilities (evenly spaced, 0 % to 100 %) at which the way outside the sidecar's clock is given its own
# slope in the rate; above the 99th percentile a short run's answers are too few, and the 99th's slope is used
FRONT_SLOPE_LEVELS = 101
TAIL_LEVEL = 0.99

T = TypeVar("T")


def not_overloaded(runs: Sequence[T], attainment: Callable[[T], float], floor: float = HELD_ATTAINMENT) -> list[T]:
    """The runs whose attainment reached ``floor`` (an overloaded run's costs are its queues'); all of them where
    none did."""
    return [r for r in runs if attainment(r) >= floor] or list(runs)


@dataclass(frozen=True)
class CostPoint:
    """The mean lead and tail of the stage calls of one size at one rate (one stage and batch of one step)."""

    rate_rps: float  # the rate the sidecar served while these calls were made
    sent_bytes: float  # per call (profiled bytes: what plans count)
    back_bytes: float
    lead_us: float | None  # None: no call of this kind went to an idle server (its lead is not seen)
    tail_us: float
    calls: int


def fit_line(rows: Sequence[tuple[float, ...]], ys: Sequence[float], weights: Sequence[float]) -> tuple[float, ...]:
    """(intercept, slope per column): weighted least squares with every coefficient >= 0 (a column whose slope
    comes out negative, or that does not vary, is dropped and the rest refitted)."""
    x = np.asarray(rows, dtype=float).reshape(len(ys), -1)
    y = np.asarray(ys, dtype=float)
    w = np.sqrt(np.asarray(weights, dtype=float))
    keep = [j for j in range(x.shape[1]) if np.ptp(x[:, j]) > 0]
    while True:
        a = np.column_stack([np.ones(len(y)), x[:, keep]]) * w[:, None]
        coef = np.linalg.lstsq(a, y * w, rcond=None)[0]
        bad = [keep[i] for i, c in enumerate(coef[1:]) if c < 0]
        if not bad:
            break
        keep = [j for j in keep if j not in bad]
    out = [max(0.0, float(coef[0]))] + [0.0] * x.shape[1]
    for i, j in enumerate(keep):
        out[1 + j] = float(coef[1 + i])
    return tuple(out)


def fit_stage_costs(points: Sequence[CostPoint], base: Overheads) -> Overheads:
    """``base`` (slowdown, wake lateness, the way outside the sidecar) with lead and tail fitted to ``points``."""
    if not points:
        raise ValueError("no stage calls were measured: nothing to fit the costs to")
    led = [p for p in points if p.lead_us is not None]
    lead0, lead_mb, lead_k = (fit_line([(p.sent_bytes / 1e6, p.rate_rps / 1e3) for p in led],
                                       [p.lead_us for p in led], [p.calls for p in led])  # type: ignore[misc]
                              if led else (base.lead_us, base.lead_per_mb_us, base.lead_per_krps_us))
    tail0, tail_mb, tail_k = fit_line([(p.back_bytes / 1e6, p.rate_rps / 1e3) for p in points],
                                      [p.tail_us for p in points], [p.calls for p in points])
    return replace(base, lead_us=lead0, lead_per_mb_us=lead_mb, lead_per_krps_us=lead_k, tail_us=tail0,
                   tail_per_mb_us=tail_mb, tail_per_krps_us=tail_k)


def leveled(fitted: Overheads, points: Sequence[CostPoint], base: Overheads, rate_rps: float) -> Overheads:
    """``fitted``'s slopes through ``base``'s lead and tail at ``rate_rps`` and the points' mean call: the sidecar's
    own lead (as calibrated, plus the high percentile it learns under load: what its driver plans with) and tail
    where it measured them, the fit saying only how they grow. A mean of idle-server leads is below what the
    driver plans with, and the simulator would then start stages earlier than the sidecar does."""
    calls = sum(p.calls for p in points) or 1
    sent = sum(p.sent_bytes * p.calls for p in points) / calls / 1e6
    back = sum(p.back_bytes * p.calls for p in points) / calls / 1e6
    k = rate_rps / 1e3
    lead, lead_k = _through(base.lead_us - fitted.lead_per_mb_us * sent, fitted.lead_per_krps_us, k)
    tail, tail_k = _through(base.tail_us - fitted.tail_per_mb_us * back, fitted.tail_per_krps_us, k)
    return replace(fitted, lead_us=lead, lead_per_krps_us=lead_k, tail_us=tail, tail_per_krps_us=tail_k)


def _through(at_k: float, slope: float, k: float) -> tuple[float, float]:
    """(intercept, slope per 1,000 req/s) of a line through ``at_k`` at ``k``, its slope lowered where it would cross
    0 above no load (an intercept held at 0 would put the cost at ``k`` above what was measured there)."""
    at_k = max(0.0, at_k)
    slope = min(slope, at_k / k) if k > 0 else slope
    return max(0.0, at_k - slope * k), slope


def fit_runs(runs: Sequence[Overheads], points: Sequence[CostPoint]) -> Overheads:
    """Several serving runs' costs as one: the median of each (median_overheads), growing as ``points`` say with the
    bytes and the rate (levelled at their median rate) where they were served at rates MIN_RATE_SPAN apart."""
    base = median_overheads(runs)
    rates = sorted(p.rate_rps for p in points)
    if len({round(r, 1) for r in rates}) < 2 or (rates[0] > 0 and rates[-1] < MIN_RATE_SPAN * rates[0]):
        return base
    return leveled(fit_stage_costs(points, base), points, base, rates[len(rates) // 2])


def fit_front(costs: Overheads, samples: Sequence[tuple[float, float]],
              rates_rps: Sequence[float] | None = None) -> Overheads:
    """``costs`` with the way outside the sidecar's clock fitted to (input bytes, µs) samples a client measured:
    a slope per input megabyte where inputs of several sizes were sent, a slope per 1,000 req/s where ``rates_rps``
    (per sample, the rate the sidecar served) holds several (:func:`front_rate_slopes`), and the distribution of what
    is left as measured at the lowest of those rates (at_rate moves each quantile by its slope). Moved there from the
    higher rates by the tail's slope, their bodies went below 0: tf_efficientdet_d1 at 3x, whose median grew
    1.05 -> 1.47 ms from 257 to 758 req/s while its 99th percentile grew 2.9 -> 6.6 ms, was fitted a median of 0.
    ``front_us`` stays the deadlines' offset the sidecar served with (`serve --front-us`): set to the measured
    median, the simulator gave each request 0.7 ms more than the live sidecar did, and planned a T4 pool of fsaf at
    3x the sidecar found no slack in (it shed every request sent there)."""
    if not samples:
        return costs
    mb = np.array([s[0] for s in samples], dtype=float) / 1e6
    us = np.array([s[1] for s in samples], dtype=float)
    slope = fit_line(mb.reshape(-1, 1), us, np.ones(len(us)))[1]
    rest = us - slope * mb
    krps = np.zeros(len(us)) if rates_rps is None else np.asarray(rates_rps, dtype=float) / 1e3
    slopes, lowest = front_rate_slopes(rest, krps)
    if slopes:
        rest = rest[_rate_keys(krps) == _rate_keys(lowest)]
    return replace(costs, front_per_mb_us=slope, front_per_krps_us=slopes[-1] if slopes else 0.0,
                   front_rate_rps=lowest * 1e3,
                   front_quantiles_us=front_quantiles(rest), front_slopes_per_krps_us=slopes)


def front_rate_slopes(us: np.ndarray, krps: np.ndarray) -> tuple[tuple[float, ...], float]:
    """(µs per 1,000 req/s at FRONT_SLOPE_LEVELS probabilities, the lowest rate they were fitted from, in 1,000
    req/s): how fast each part of the way outside the sidecar's clock grows with the rate, a line through that
    quantile at each rate measured with at least TAIL_SAMPLES answers, weighted by answers; above TAIL_LEVEL the
    tail's; never falling from one level to the next (((), 0) where fewer than two rates qualify, they span less
    than MIN_RATE_SPAN, or nothing grows). Body and tail apart: on this project's 2-core host the median stayed near
    1-2 ms from 35 to 560 req/s while the 99th percentile rose from 3.4 to 5-6 ms; with the tail's slope alone, plans
    promised from costs measured at a low rate held 0.62-0.84 of their promise (googlenet at 2.5x and 3x), and the
    tail's slope applied to the whole put the simulated median 1.7 ms above the 1.1 ms measured at 600 req/s
    (tf_efficientdet_d1 at 3x)."""
    rates, inverse = np.unique(_rate_keys(krps), return_inverse=True)
    counts = np.bincount(inverse, minlength=len(rates))
    kept = [i for i in range(len(rates)) if counts[i] >= TAIL_SAMPLES]
    if len(kept) < 2 or rates[kept[-1]] < MIN_RATE_SPAN * rates[kept[0]]:
        return (), 0.0
    levels = np.minimum(np.linspace(0.0, 1.0, FRONT_SLOPE_LEVELS), TAIL_LEVEL)
    at = np.array([np.quantile(us[inverse == i], levels) for i in kept])  # rates x levels
    xs, weights = [(rates[i],) for i in kept], [counts[i] for i in kept]
    slopes = np.maximum.accumulate([fit_line(xs, at[:, j], weights)[1] for j in range(len(levels))])
    if not slopes[-1]:
        return (), 0.0
    return tuple(float(s) for s in slopes), float(rates[kept[0]])


def _rate_keys(krps):
    """Rates (1,000 req/s) rounded to tell one step's from another's: the answers of one step share a key."""
    return np.round(krps, 4)
