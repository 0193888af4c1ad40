"""What serving adds beyond the profiled compute: the per-stage costs a live executor measures (``poolpipe serve
--overheads-out``), which the simulator (``simulate --overheads``) and the planner (``plan --overheads``) use, and
the margin the driver keeps before each deadline. Shared by the planner and the scheduler, so it sits at the bottom.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

OVERHEADS_FORMAT = "poolpipe.overheads/1"
# How each cost grows (poolpipe calibrate fits them; 0: flat): a stage call's lead with the megabytes it sends, its
# tail with the megabytes it receives, both with the rate the sidecar serves (per 1,000 req/s), and the way outside
# the sidecar's clock with the request's input megabytes and with the rate.
SLOPE_FIELDS = ("lead_per_mb_us", "tail_per_mb_us", "lead_per_krps_us", "tail_per_krps_us", "front_per_mb_us",
                "front_per_krps_us")
NUMBER_FIELDS = ("lead_us", "tail_us", "wake_late_us", "slowdown", "front_us", *SLOPE_FIELDS, "front_rate_rps",
                 "rate_calls_per_request", "calibrated_rps", "calibrated_front_us")
SHAPE_FIELDS = ("lead_shape", "tail_shape")
OVERHEADS_FIELDS = ("format", "source", *NUMBER_FIELDS, "front_quantiles_us", "front_slopes_per_krps_us",
                    *SHAPE_FIELDS, "measured_limits", "calibrated_layouts", "calibration")
# The response parameter (int64, µs) in which the sidecar reports a planned request's time on its own clock, from
# its handler to its answer: a client's latency less it is the way outside the sidecar's clock (front_quantiles_us).
SIDECAR_LATENCY_PARAMETER = "poolpipe_sidecar_latency_us"
# How many evenly spaced quantiles describe a measured front path (0, 0.1 %, ..., 100 %). Fine in the tail on
# purpose: between two quantiles the simulator draws linearly, so with 41 (2.5 % apart) one stalled answer of 80 ms
# among 2,400 of about 1 ms made 2.4 % of simulated answers slower than 6 ms (measured: 0.04 %), and a plan's
# prediction fell to nothing; with 1001 that one answer weighs at most 0.1 %.
FRONT_QUANTILES = 1001
# The driver plans every batch against its deadline less max(DRIVER_MIN_MARGIN_US, DRIVER_MARGIN_FRACTION x SLO)
# (scheduler.core.driver.DriverConfig.live), raised to what it learns of late batches; a plan must leave at least
# that free. The floor is only for what the learning cannot see coming: with stage calls of ~0.3 ms each way it
# need not be the 3 ms + 5 % it was when they cost ~1 ms (served live in turns, a 1 ms + 2 % floor held 0.3-1.1 %
# more attainment near the knees of convnext_large, apcnet and centernet at 2.6x, with a few more late answers, and
# changed little on centernet at 3x: serving.md); a request shed for a margin it did not need is as lost as a late one.
DRIVER_MIN_MARGIN_US = 1000.0
# Plans whose stage calls per request are this share apart are of another kind for the costs fitted on one of them
CALLS_TOLERANCE = 0.1
# A promise this many times the highest rate calibrated rests on extrapolated costs (calibrated_rps: the most a step
# fitted served; calibrate's default steps reach the promise of the plan they calibrate, and the last may not hold),
# and no promise goes further (held_to_limits): tf_efficientdet_d1 at 3x, its costs fitted on steps that served
# 167-396 req/s, was promised 1,055 req/s on a plan no calibration had served.
CALIBRATED_REACH = 1.25
DRIVER_MARGIN_FRACTION = 0.02
# The SLO attainment a sustainable rate holds (the simulator's searches, calibration's measured limits)
TARGET_ATTAINMENT = 0.99


@dataclass(frozen=True)
class MeasuredLimit:
    """A rate a calibration measured one plan's model to fall below 99 % SLO attainment at (interpolated between its
    steps): a promise for a plan of that layout (plans.plan_json.layout_key) is held to it, whatever the costs say."""

    layout: str
    model: str
    rps: float

    @classmethod
    def from_dict(cls, raw: Any, where: str) -> "MeasuredLimit":
        if not isinstance(raw, dict) or set(raw) != {"layout", "model", "rps"}:
            raise ValueError(f"{where}: each of measured_limits must be {{layout, model, rps}}, got {raw!r}")
        rps = raw["rps"]
        if isinstance(rps, bool) or not isinstance(rps, (int, float)) or not math.isfinite(rps) or rps < 0:
            raise ValueError(f"{where}: measured_limits rps must be a number >= 0, got {rps!r}")
        return cls(str(raw["layout"]), str(raw["model"]), float(rps))


def driver_margin_us(slo_us: float) -> float:
    """The margin the sidecar's driver keeps before a deadline of a model with this SLO."""
    return max(DRIVER_MIN_MARGIN_US, DRIVER_MARGIN_FRACTION * slo_us)


@dataclass(frozen=True)
class Overheads:
    """Per-stage costs a live executor has beyond the profiled compute (µs), and the driver's wake lateness.

    ``poolpipe serve --overheads-out FILE`` writes what the sidecar measured; ``poolpipe simulate
    --overheads FILE`` runs the shared driver with them, as the sidecar does."""

    lead_us: float = 0.0  # stage sent -> its compute starts (serialisation, the server's input copy)
    tail_us: float = 0.0  # compute end -> response back at the driver
    wake_late_us: float = 0.0  # mean (exponential) lateness of a requested wake-up
    slowdown: float = 1.0  # compute takes this times the profiled latency
    # A request's way outside the sidecar's clock (the client's send and gRPC up to the handler, the answer's way
    # back): the client's latency is the sidecar's plus this, so deadlines (live and simulated) come this much
    # sooner than the SLO from the client's send. Not measurable by the sidecar; `serve --front-us` sets it.
    front_us: float = 0.0
    # The same way as a client measured it, request by request: evenly spaced quantiles (the first at 0 %, the last
    # at 100 %) of its latency less the sidecar's own (the sidecar reports it in each answer). When given, every
    # simulated answer draws its way outside the sidecar's clock from them, so the simulator and the planner see
    # the answers a client counts late that the sidecar cannot (its deadlines still use front_us). Empty: front_us.
    front_quantiles_us: tuple[float, ...] = ()
    # The slopes (SLOPE_FIELDS): lead_us, tail_us and front_us (and the quantiles) are the costs at no bytes and no
    # load; the cost of a call is the base plus its slopes times its megabytes and the sidecar's rate.
    lead_per_mb_us: float = 0.0
    tail_per_mb_us: float = 0.0
    lead_per_krps_us: float = 0.0
    tail_per_krps_us: float = 0.0
    front_per_mb_us: float = 0.0
    # the way outside the sidecar's clock grows with the rate the host serves (its tail first: fitted to the 99th
    # percentile a client measured at several rates); at_rate shifts the whole measured distribution by it, from
    # front_rate_rps (the lowest rate it was measured at: below it, it is taken as measured there, not extrapolated)
    front_per_krps_us: float = 0.0
    front_rate_rps: float = 0.0
    # How each part of that distribution grows (µs per 1,000 req/s at evenly spaced probabilities, 0 % to 100 %;
    # front_per_krps_us is the 99th percentile's): its body grows far slower than its tail. Shifted whole by the
    # tail's slope, tf_efficientdet_d1 at 3x was simulated a median 1.7 ms above the 1.1 ms measured at 600 req/s.
    # Empty: every quantile moves by front_per_krps_us.
    front_slopes_per_krps_us: tuple[float, ...] = ()
    # The stage calls per request of the plan the rate slopes were fitted on (0: unknown, taken as any plan's). What
    # grows with the rate is the sidecar's event loop's work, which is per stage call: a plan with more cuts or
    # smaller batches loads it more at the same request rate, so at_rate scales the rate by the plans' ratio (at 432
    # req/s a client measured 2.5 ms at p99 outside the sidecar's clock serving tf_efficientdet_d1 whole, 4.1 ms
    # serving it in two stages; docs/configuration.md#overheads-file).
    rate_calls_per_request: float = 0.0
    calibrated_rps: float = 0.0  # the highest rate a calibration step served and held (0: not calibrated)
    # The deadline reserve (front_us) the calibration's sidecars served with; calibrate may choose a smaller one, and
    # a promise made with less than was served rests on a reserve no step measured (googlenet-v3 at 2.5x: calibrated
    # with 2 ms, re-planned with 1 ms to 484 req/s, held 432 live). 0: not recorded.
    calibrated_front_us: float = 0.0
    # How a stage call's lead and tail spread about their means: evenly spaced quantiles (0 % to 100 %) of each call's
    # time over its kind's mean; the simulator draws every call's from them (empty: every call takes the mean). On
    # convnext_large at 3x a call's tail was 0.32 ms at the median and 1.5 ms at the 99th percentile, its mean 0.4:
    # simulated with the means alone, its plan was promised 398 req/s and held 340 live.
    lead_shape: tuple[float, ...] = ()
    tail_shape: tuple[float, ...] = ()
    # What calibrations measured plans to hold: the costs are means, and convnext_large at 3x, re-planned with the
    # costs of a calibration whose last step missed (98.9 % at 412.1 req/s), was promised 421.6 and held 365 live.
    measured_limits: tuple[MeasuredLimit, ...] = ()
    # The plans calibrations measured (Plan.layout_key); a plan of another layout rests on costs measured elsewhere
    # (extrapolated_to): tf_efficientdet_d1 at 3x, re-planned with its calibration's costs, was cut another way,
    # promised 786.6 req/s and held 529 live.
    calibrated_layouts: tuple[str, ...] = ()

    @classmethod
    def from_dict(cls, raw: dict[str, Any], where: str = "overheads") -> "Overheads":
        """Validated: known fields, non-negative times, slowdown > 0 (ValueError names the bad field)."""
        unknown = sorted(set(raw) - set(OVERHEADS_FIELDS))
        if unknown:
            raise ValueError(f"{where}: unknown field(s) {', '.join(unknown)} "
                             f"(known: {', '.join(OVERHEADS_FIELDS[2:])})")
        vals: dict[str, float] = {}
        for k in NUMBER_FIELDS:
            if k in raw:
                try:
                    vals[k] = float(raw[k])
                except (TypeError, ValueError):
                    raise ValueError(f"{where}: {k} must be a number, got {raw[k]!r}") from None
                if not (vals[k] > 0 if k == "slowdown" else vals[k] >= 0) or math.isinf(vals[k]):
                    raise ValueError(f"{where}: {k} must be {'> 0' if k == 'slowdown' else '>= 0'}, got {raw[k]!r}")
        # "calibration" (what poolpipe calibrate fitted the slopes to) is kept in the file for people, not read
        limits, layouts = raw.get("measured_limits", []), raw.get("calibrated_layouts", [])
        if not isinstance(limits, list):
            raise ValueError(f"{where}: measured_limits must be a list, got {limits!r}")
        if not isinstance(layouts, list) or not all(isinstance(x, str) for x in layouts):
            raise ValueError(f"{where}: calibrated_layouts must be a list of layout keys, got {layouts!r}")
        return cls(**vals, front_quantiles_us=_quantiles(raw.get("front_quantiles_us", ()), where),
                   front_slopes_per_krps_us=_quantiles(raw.get("front_slopes_per_krps_us", ()), where,
                                                       "front_slopes_per_krps_us"),
                   **{k: _quantiles(raw.get(k, ()), where, k) for k in SHAPE_FIELDS},
                   measured_limits=tuple(MeasuredLimit.from_dict(x, where) for x in limits),
                   calibrated_layouts=tuple(layouts))

    def to_dict(self) -> dict[str, Any]:
        doc = {"format": OVERHEADS_FORMAT, "lead_us": self.lead_us, "tail_us": self.tail_us,
               "wake_late_us": self.wake_late_us, "slowdown": self.slowdown, "front_us": self.front_us}
        doc.update({k: getattr(self, k) for k in (*SLOPE_FIELDS, "front_rate_rps", "rate_calls_per_request",
                                                  "calibrated_rps", "calibrated_front_us") if getattr(self, k)})
        if self.front_quantiles_us:
            doc["front_quantiles_us"] = list(self.front_quantiles_us)
        if self.front_slopes_per_krps_us:
            doc["front_slopes_per_krps_us"] = list(self.front_slopes_per_krps_us)
        doc.update({k: list(getattr(self, k)) for k in SHAPE_FIELDS if getattr(self, k)})
        if self.measured_limits:
            doc["measured_limits"] = [asdict(x) for x in self.measured_limits]
        if self.calibrated_layouts:
            doc["calibrated_layouts"] = list(self.calibrated_layouts)
        return doc

    def held_to_limits(self, layout: str, rates: dict[str, float]) -> dict[str, float]:
        """``rates`` of a plan of ``layout``, each no higher than a calibration measured that layout to hold, and
        together no more than CALIBRATED_REACH x calibrated_rps (costs measured that far; scaled alike)."""
        out = self.within_limits(layout, rates)
        total, reach = sum(out.values()), CALIBRATED_REACH * self.calibrated_rps
        return {m: r * reach / total for m, r in out.items()} if 0 < reach < total else out

    def within_limits(self, layout: str, rates: dict[str, float]) -> dict[str, float]:
        """``rates`` of a plan of ``layout``, each no higher than a calibration measured that layout to hold."""
        caps = {x.model: x.rps for x in self.measured_limits if x.layout == layout}
        return {m: min(r, caps.get(m, r)) for m, r in rates.items()}

    @property
    def rate_dependent(self) -> bool:
        return bool(self.lead_per_krps_us or self.tail_per_krps_us or self.front_per_krps_us)

    def at_rate(self, rps: float, calls_per_request: float = 0.0) -> "Overheads":
        """These costs for a sidecar serving ``rps`` requests/s of a plan whose requests make ``calls_per_request``
        stage calls each (stage_calls_per_request; 0: as the plan they were fitted on): the rate terms folded into
        lead_us, tail_us and the way outside the sidecar's clock (its measured quantiles; front_us where none were
        measured, as it is then the way every answer takes; with quantiles front_us stays the deadlines' offset, as
        serve --front-us)."""
        if not self.rate_dependent:
            return self
        k = self._krps(rps, calls_per_request)
        above = max(0.0, k - self.front_rate_rps / 1e3)
        front = self.front_per_krps_us * above
        return replace(self, lead_us=self.lead_us + self.lead_per_krps_us * k, lead_per_krps_us=0.0,
                       tail_us=self.tail_us + self.tail_per_krps_us * k, tail_per_krps_us=0.0,
                       front_quantiles_us=tuple(float(q) for q in self.front_quantiles_us
                                                + self._front_slopes() * above),
                       front_us=self.front_us + (0.0 if self.front_quantiles_us else front), front_per_krps_us=0.0,
                       front_slopes_per_krps_us=())

    def _front_slopes(self) -> np.ndarray:
        """Each measured quantile's slope in µs per 1,000 req/s (front_slopes_per_krps_us at its probability)."""
        n, slopes = len(self.front_quantiles_us), self.front_slopes_per_krps_us
        if not slopes:
            return np.full(n, self.front_per_krps_us)
        return np.interp(np.linspace(0.0, 1.0, n), np.linspace(0.0, 1.0, len(slopes)), slopes)

    def fitted_on_other_calls(self, calls_per_request: float) -> bool:
        """Whether a plan making ``calls_per_request`` stage calls each is not the kind these rates were fitted on
        (more than CALLS_TOLERANCE apart): its costs are then scaled by at_rate, not measured."""
        fitted = self.rate_calls_per_request
        return fitted > 0 and abs(calls_per_request - fitted) > CALLS_TOLERANCE * fitted

    def extrapolated_to(self, promise_rps: float, calls_per_request: float, layout: str | None = None) -> bool:
        """Whether a plan promising ``promise_rps`` with ``calls_per_request`` stage calls each rests on costs not
        measured for it: CALIBRATED_REACH x calibrated_rps (the most it is promised) or more, of another kind
        (fitted_on_other_calls), given its ``layout``, not a plan calibrated (calibrated_on_another), or with a
        smaller deadline reserve than calibrated (reserve_unserved)."""
        return (self.at_reach(promise_rps) or self.fitted_on_other_calls(calls_per_request)
                or self.calibrated_on_another(layout) or self.reserve_unserved())

    def reserve_unserved(self) -> bool:
        """Whether deadlines keep less of a reserve (front_us) than the calibration served with."""
        return 0.0 < self.calibrated_front_us and self.front_us < self.calibrated_front_us * (1 - 1e-9)

    def at_reach(self, promise_rps: float) -> bool:
        """Whether ``promise_rps`` is CALIBRATED_REACH x calibrated_rps (where held_to_limits holds it) or more."""
        return self.calibrated_rps > 0 and promise_rps >= CALIBRATED_REACH * self.calibrated_rps * (1 - 1e-6)

    def calibrated_on_another(self, layout: str | None) -> bool:
        """Whether calibrations measured plans, none of them of ``layout`` (None: not asked)."""
        return layout is not None and bool(self.calibrated_layouts) and layout not in self.calibrated_layouts

    def _krps(self, rps: float, calls_per_request: float) -> float:
        """``rps`` of a plan making ``calls_per_request`` stage calls each, in 1,000 req/s of the plan fitted on."""
        if calls_per_request > 0 and self.rate_calls_per_request > 0:
            rps *= calls_per_request / self.rate_calls_per_request
        return max(0.0, rps) / 1e3

    def rebased(self, measured: dict[str, float], rps: float, calls_per_request: float = 0.0) -> "Overheads":
        """These costs with lead, tail, wake lateness and slowdown as a serving run measured them at ``rps`` (of a
        plan making ``calls_per_request``, as at_rate): the rate slopes kept, their bases moved so that the costs at
        ``rps`` are the measured ones; the byte slopes dropped (a measured mean already counts the sizes of the calls
        it averaged)."""
        k = self._krps(rps, calls_per_request)
        out = replace(self, **measured, lead_per_mb_us=0.0, tail_per_mb_us=0.0)
        return replace(out, lead_us=max(0.0, out.lead_us - self.lead_per_krps_us * k),
                       tail_us=max(0.0, out.tail_us - self.tail_per_krps_us * k))

    def lead_for(self, in_bytes: float) -> float:
        """A stage call's lead (at the rate folded in by at_rate) when it sends ``in_bytes``."""
        return self.lead_us + self.lead_per_mb_us * in_bytes / 1e6

    def tail_for(self, out_bytes: float) -> float:
        """A stage call's tail when its answer carries ``out_bytes``."""
        return self.tail_us + self.tail_per_mb_us * out_bytes / 1e6

    def front_extra_us(self, input_bytes: float) -> float:
        """What a request of ``input_bytes`` adds to the way outside the sidecar's clock beyond front_at's."""
        return self.front_per_mb_us * input_bytes / 1e6

    def with_front_samples(self, samples_us: Sequence[float]) -> "Overheads":
        """These overheads with the front path's quantiles taken from a client's measured samples (none: as is)."""
        return replace(self, front_quantiles_us=front_quantiles(samples_us)) if len(samples_us) else self

    def front_at(self, u: float | np.ndarray) -> float | np.ndarray:
        """The way outside the sidecar's clock at probability (or probabilities) ``u`` in [0, 1] of the measured
        distribution (linear between quantiles); front_us where none was measured."""
        q = self.front_quantiles_us
        if not q:
            return np.full(np.shape(u), self.front_us) if np.ndim(u) else self.front_us
        return np.interp(u, np.linspace(0.0, 1.0, len(q)), q)


def spread(shape: Sequence[float], u: float) -> float:
    """A call's time over its kind's mean at probability ``u`` in [0, 1) of ``shape`` (Overheads.lead_shape,
    tail_shape: linear between its quantiles); 1 where there is none."""
    if len(shape) < 2:
        return 1.0
    x = u * (len(shape) - 1)
    i = min(int(x), len(shape) - 2)
    return shape[i] + (x - i) * (shape[i + 1] - shape[i])


def stage_calls_per_request(pipelines: Iterable[tuple[float, int, int]]) -> float:
    """The stage calls a request makes, over pipelines given as (planned rate, stages, batch): one call per stage
    per batch, weighted by each pipeline's rate (0 where none has a rate)."""
    rows = [(r, n, b) for r, n, b in pipelines if r > 0 and b > 0]
    total = sum(r for r, _, _ in rows)
    return sum(r * n / b for r, n, b in rows) / total if total else 0.0


def median_overheads(runs: Sequence[Overheads]) -> Overheads:
    """Several serving runs' costs as one: the median of each cost, so that a run a host stall or a short burst
    inflated does not set them (the front path: the first run's, as its quantiles do not combine; the lead's and
    tail's shapes: the median of each quantile)."""
    if not runs:
        raise ValueError("median_overheads: no runs")
    med = {k: float(np.median([getattr(r, k) for r in runs])) for k in ("lead_us", "tail_us", "wake_late_us",
                                                                        "slowdown")}
    for k in SHAPE_FIELDS:  # quantile by quantile, over the runs that measured one as long as the first's
        shapes = [getattr(r, k) for r in runs if getattr(r, k)]
        shapes = [x for x in shapes if len(x) == len(shapes[0])]
        med[k] = tuple(float(x) for x in np.median(shapes, axis=0)) if shapes else ()
    return replace(runs[0], **med)


def front_quantiles(samples_us: Sequence[float], n: int = FRONT_QUANTILES) -> tuple[float, ...]:
    """``n`` evenly spaced quantiles (0 % to 100 %, linear interpolation) of measured front-path times (a sample
    below 0, which the sidecar's time lying within the client's rules out, counts as 0)."""
    if not len(samples_us):
        return ()
    xs = np.maximum(np.asarray(samples_us, dtype=float), 0.0)
    return tuple(float(x) for x in np.quantile(xs, np.linspace(0.0, 1.0, n)))


def _quantiles(raw: Any, where: str, name: str = "front_quantiles_us") -> tuple[float, ...]:
    """A list over evenly spaced probabilities (front_quantiles_us, front_slopes_per_krps_us) validated: finite,
    non-negative, non-decreasing numbers."""
    if not isinstance(raw, (list, tuple)):
        raise ValueError(f"{where}: {name} must be a list of microseconds, got {raw!r}")
    try:
        q = tuple(float(x) for x in raw)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: {name} must hold numbers, got {raw!r}") from None
    if any(not math.isfinite(x) or x < 0 for x in q) or any(b < a for a, b in zip(q, q[1:])):
        raise ValueError(f"{where}: {name} must be finite, >= 0 and non-decreasing (from 0 % to 100 %)")
    return q


def sidecar_slo_us(slo_us: float, front_us: float) -> float:
    """The time the sidecar (live or simulated) has for a request whose client sees ``slo_us``."""
    return max(0.0, slo_us - front_us)


# Chosen from loopback runs with a Python tritonclient at ~400 req/s on this project's 2-core machine: with it the
# late answers the client counted and the sidecar did not fell from 29 and 24 to 19 and 5 in 1,740 (a scratch
# run), while sheds rose; the tail outside the sidecar's clock is longer. `serve --front-us` sets it.
DEFAULT_FRONT_US = 2000.0
# What the sidecar measures per stage call on emulated servers (this project's own calibration, `poolpipe serve
# --overheads-out`): what plans assume when no --overheads file is given. `benchmarks/emulated_sidecar.py --quick`
# printed lead 452 / tail 338 µs on the native emulated backend (generate's default where a C compiler exists) with
# requests one at a time; the live PPipe comparison measured 282 / 226 at load. The Python backend costs about twice
# (833 / 765): plan with --overheads where servers are slower than these.
DEFAULT_OVERHEADS = Overheads(lead_us=450.0, tail_us=350.0, wake_late_us=0.0, slowdown=1.0,
                              front_us=DEFAULT_FRONT_US)


# Where `poolpipe calibrate` writes the cost model by default and `poolpipe plan` looks for one when not given
# --overheads (the directory it runs in)
COSTS_FILE = "poolpipe-costs.json"


def costs_file(given: str | Path | None) -> Path | None:
    """The costs file a command uses: the one given, else ./poolpipe-costs.json where calibrate wrote one."""
    if given:
        return Path(given)
    return Path(COSTS_FILE) if Path(COSTS_FILE).is_file() else None


def read_overheads(path: str | Path, flag: str = "--overheads") -> Overheads:
    """An overheads file (``poolpipe serve --overheads-out``), validated; a bad one is a one-line InputError."""
    from poolpipe_common.documents import check_fields, read_document
    from poolpipe_common.errors import InputError

    raw = check_fields(read_document(path, "overheads file"), OVERHEADS_FIELDS, f"{flag} {path}")
    try:
        return Overheads.from_dict(raw, f"{flag} {path}")
    except ValueError as e:
        raise InputError(str(e)) from None
