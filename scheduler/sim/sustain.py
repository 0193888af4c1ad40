"""The simulator as the planner's evaluator: a plan's sustainable rate per model at >= 99 % SLO attainment,
found by bisection over load factors, each point a run of the shipped driver loop (the sidecar's live margins
and lateness learning) with the per-stage costs the sidecar measures. The planner, which sits above the
simulator, imports it as its ``simulated`` evaluator (planner.sustained.evaluators).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field, replace

from plans.arrivals import Arrivals
from plans.plan_json import Plan
from poolpipe_common.overheads import Overheads
from scheduler.sim.sweep import TARGET_ATTAINMENT, PointJob, run_point
from workloads.arrivals import TraceSpec, parse_trace

MIN_REQUESTS = 12_000  # per point, so that 1 % of misses is > 100 requests
MIN_DURATION_S, MAX_DURATION_S = 15.0, 60.0
RESOLUTION = 0.01  # of the nominal rate
MAX_POINTS = 12
HIGHEST = 1.05  # a plan may sustain slightly more than its nominal rate (its pools are rounded up)
# A replayed trace is judged stretch by stretch: at least this long and this many requests (1 % of it is 20).
STRETCH_MIN_S, STRETCH_REQUESTS, MIN_STRETCHES = 6.0, 2_000, 3


@dataclass(frozen=True)
class Precision:
    """How finely a plan's sustainable rate is measured: to ``resolution`` of each model's mix rate, on points
    ``fidelity`` times the full length, searching ``start`` first (per model, a (lo, hi) load-factor bracket, each end
    checked before it is trusted: a guess from the closed form or a coarser measurement; where an end is wrong, the
    bracket moves by its width). The defaults are the planner's promise: 1 %, full length, bisection from 0."""

    resolution: float = RESOLUTION
    fidelity: float = 1.0
    start: tuple[tuple[str, float, float], ...] = ()  # (model, lo, hi)
    # the mix as one: the largest fraction of the mix at which every model holds (its rates), one search instead of
    # one per model; what a max-min ranking of plans needs
    joint: bool = False
    # a joint search whose first point (the start's lo) fails ends there, every rate 0: the caller only needs to know
    # whether the plan sustains that much (a candidate that cannot come near the best measured so far)
    floor: bool = False


def _on_grid(x: float, grid: float, up: bool) -> float:
    """``x`` rounded down (or up) to a multiple of ``grid``, kept to 4 places and within [0, HIGHEST]."""
    x = (math.ceil(x / grid - 1e-9) if up else math.floor(x / grid + 1e-9)) * grid
    return round(min(HIGHEST, max(0.0, x)), 4)


@dataclass
class _Bracket:
    """One model's search: it holds at ``lo`` (once ``lo_ok``) and fails at ``hi`` (once ``hi_ok``). Its points are
    multiples of ``grid`` (the resolution), so the rate it ends on is the largest multiple that holds wherever the
    search started: a plan's promise does not depend on the guess it was searched from."""

    lo: float = 0.0
    hi: float = HIGHEST
    lo_ok: bool = True
    hi_ok: bool = True
    step: float = HIGHEST
    grid: float = RESOLUTION

    def width(self) -> float:
        return math.inf if not (self.lo_ok and self.hi_ok) else self.hi - self.lo

    def next_lf(self) -> float:
        if not self.lo_ok:
            return self.lo
        if not self.hi_ok:
            return self.hi
        # the multiple of grid nearest the middle, strictly inside (lo is one; hi is one or HIGHEST)
        k = round(0.5 * (self.lo + self.hi) / self.grid)
        k = min(max(k, round(self.lo / self.grid) + 1), math.ceil(self.hi / self.grid - 1e-9) - 1)
        return round(k * self.grid, 4)

    def tells(self, lf: float) -> bool:
        """Whether a point at ``lf`` says anything new."""
        return self.lo < lf < self.hi or (lf == self.lo and not self.lo_ok) or (lf == self.hi and not self.hi_ok)

    def update(self, lf: float, holds: bool) -> None:
        if holds:
            self.lo, self.lo_ok = lf, True
            if lf >= self.hi:  # the guessed top held: look a step higher, each step twice the last
                self.hi = _on_grid(lf + self.step, self.grid, up=True)
                self.hi_ok = self.hi >= HIGHEST
                self.step *= 2
        else:
            self.hi, self.hi_ok = lf, True
            if lf <= self.lo:  # the guessed bottom failed: look a step lower, each step twice the last
                self.lo = _on_grid(lf - self.step, self.grid, up=False)
                self.lo_ok = self.lo <= 0.0
                self.step *= 2


@dataclass(frozen=True)
class Run:
    """One simulated run a load point is judged on: its seed (for a replay, where in the trace it starts:
    seed 0 at the trace's first arrival) and its length; longer (up to ``longest_s``) at a point whose rate would
    offer fewer than ``min_requests`` in it."""

    seed: int
    duration_s: float
    min_requests: float = 0.0
    longest_s: float = 0.0

    def length_s(self, offered_rps: float) -> float:
        """How long the run counts at a point offering ``offered_rps`` (all models together). A plan that sustains a
        small share of its nominal rate (tight SLOs) is searched at points far below it: judged on its nominal
        rate's length, a point there held a quarter of MIN_REQUESTS, and the rate found had a standard deviation of
        6 % over seeds (googlenet on 4 L4 + 12 P4 at 2x its latency; 4 % with MIN_REQUESTS held)."""
        if offered_rps <= 0:
            return self.duration_s
        return max(self.duration_s, min(self.longest_s, self.min_requests / offered_rps))


def _duration_s(plan: Plan, fidelity: float = 1.0) -> float:
    total = sum(m.throughput_rps for m in plan.models) or 1.0
    return fidelity * min(MAX_DURATION_S, max(MIN_DURATION_S, MIN_REQUESTS / total))


def point_runs(plan: Plan, trace: TraceSpec, seed: int = 0, fidelity: float = 1.0) -> list[Run]:
    """A stationary process (Poisson, gamma gaps) is judged on one long run. A recorded trace is not stationary:
    its bursts cluster (azure-conv's first 2,000 gaps have a CV of 1.14, later stretches 0.99-1.06), and one long
    run both dilutes a burst among lulls and, scaled to the whole run's mean, offers a busy stretch less than the
    rate. So the same amount of trace is cut into stretches, each offered the point's rate on its own, the first at
    the trace's start, and the point holds only where every stretch holds: what a load test of any one of them
    measures."""
    duration = _duration_s(plan, fidelity)
    if trace.kind != "replay":
        return [Run(seed, duration, fidelity * MIN_REQUESTS, fidelity * MAX_DURATION_S)]
    total = sum(m.throughput_rps for m in plan.models) or 1.0
    stretch = min(duration, max(STRETCH_MIN_S, STRETCH_REQUESTS / total))
    n = max(MIN_STRETCHES, math.ceil(duration / stretch - 1e-9))
    return [Run(seed + k, stretch) for k in range(n)]


def _holds(attainment: float) -> bool:
    return attainment + 1e-12 >= TARGET_ATTAINMENT


@dataclass(frozen=True)
class Point:
    """One load point of a search, judged on its runs: picklable, so a pool of processes can judge it
    (planner.sustained.measure_pool) while the search goes on elsewhere."""

    plan: Plan
    rates: dict[str, float]
    trace: TraceSpec
    lf: float
    runs: tuple[Run, ...]
    costs: Overheads
    open_: tuple[str, ...]  # the models whose brackets the point tells something (the others may stop early)
    joint: bool = False


def judge(point: Point) -> dict[str, float]:
    """Per model, the least attainment over the point's runs; stops once every open model has missed (joint: once
    one has)."""
    least = {m: 1.0 for m in point.rates}
    for run in point.runs:
        length = run.length_s(point.lf * sum(point.rates.values()))
        summary, _ = run_point(PointJob(point.plan, point.rates, "ppipe", point.trace, point.lf, length, run.seed,
                                        driver="live", overheads=point.costs, stop_when_failed=point.open_,
                                        stop_on_any_failed=point.joint))
        for m, p in summary["models"].items():
            least[m] = min(least[m], p["slo_attainment"])
        if not any(_holds(least[m]) for m in point.open_) or (point.joint and not all(map(_holds, least.values()))):
            break
    return least


# Judges a point: (point, speculative) -> its future, or None where a speculative point is not worth running now (no
# idle process). The search asks for the points it needs in order; a speculative one is the point it will need next
# if the pending one goes as expected, so a pool with an idle process judges both at once.
PointRunner = Callable[[Point, bool], "Future[dict[str, float]] | None"]


def judge_here(point: Point, speculative: bool) -> Future[dict[str, float]] | None:
    """Judge ``point`` in this process now; no speculation (it would only cost time)."""
    if speculative:
        return None
    done: Future[dict[str, float]] = Future()
    done.set_result(judge(point))
    return done


def mix_rates(plan: Plan) -> dict[str, float]:
    """Each model's rate in the spec's workload mix (its weight), scaled so that the model with the least nominal
    throughput per weight is offered its nominal rate: the mix PPipe's max-min objective plans for. A model with
    more nominal throughput than its share gets its share, not its nominal rate: its clients come in the mix."""
    served = {m.name: m for m in plan.models if m.throughput_rps > 0 and m.weight > 0}
    base = min((m.throughput_rps / m.weight for m in served.values()), default=0.0)
    return {m.name: m.weight * base if m.name in served else m.throughput_rps for m in plan.models}


def simulated_rps(plan: Plan, arrivals: Arrivals, costs: Overheads, precision: Precision | None = None,
                  seed: int = 0, points: PointRunner = judge_here) -> dict[str, float]:
    """Per model, the largest rate (to ``precision.resolution`` of its rate in the mix) the simulator serves at
    >= 99 %, every model offered the same fraction of its rate in the spec's workload mix (``mix_rates``). Models
    that share links or GPUs slow each other down, so a promise measured with the others offered less than their
    share (their nominal fractions) would not hold in the mix clients send. ``points`` judges the search's points
    (a pool judges the next one beside the pending one); the rates do not depend on it."""
    precision = precision or Precision()
    rates = mix_rates(plan)
    trace = parse_trace(arrivals.text)
    runs = tuple(point_runs(plan, trace, seed, precision.fidelity))
    search = _Search(precision, rates, joint=precision.joint)

    def point(lf: float, open_: tuple[str, ...]) -> Point:
        return Point(plan, rates, trace, lf, runs, costs, open_, precision.joint)

    pending: dict[tuple[float, tuple[str, ...]], Future[dict[str, float]]] = {}
    try:
        judged = 0
        while judged < MAX_POINTS and (asked := search.next_points()):
            now = [pending.pop(a, None) or points(point(*a), False) for a in asked]
            for after in search.expected(asked).next_points():
                if after not in pending and (ahead := points(point(*after), True)) is not None:
                    pending[after] = ahead
            for a, f in zip(asked, now, strict=True):
                if not search.update(*a, f.result()):  # type: ignore[union-attr]
                    return {m: 0.0 for m in rates}
            judged += len(asked)
        return search.rates()
    finally:
        for unused in pending.values():  # a guess that did not come true: not started, it never runs
            unused.cancel()


@dataclass
class _Search:
    """The brackets of one search: per model, or one for the whole mix (joint) under the name "*"."""

    precision: Precision
    mix: dict[str, float]
    joint: bool
    brackets: dict[str, _Bracket] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.brackets:
            names = ("*",) if self.joint else tuple(self.mix)
            self.brackets = {m: _start(self.precision, m) for m in names}

    def next_points(self) -> list[tuple[float, tuple[str, ...]]]:
        """The load factors to judge next, side by side, each with the models it tells something (none: the search
        is done): the widest bracket's next point, then the widest of the brackets it leaves out, and so on (a
        model's bracket moves only on its own points, so they are judged at once where workers are idle; with one
        process in turn, the same points)."""
        out: list[tuple[float, tuple[str, ...]]] = []
        taken: set[str] = set()
        while (p := self._next_point(taken)) is not None:
            out.append(p)
            taken.update(("*",) if self.joint else p[1])  # the brackets the point moves
        return out

    def _next_point(self, taken: set[str]) -> tuple[float, tuple[str, ...]] | None:
        """The next load factor of the widest bracket not ``taken`` and the models not taken it tells something."""
        free = [m for m in self.brackets if m not in taken]
        if not free:
            return None
        widest = max(free, key=lambda m: self.brackets[m].width())
        if self.brackets[widest].width() <= self.precision.resolution + 1e-9:  # ends are kept to 4 places
            return None
        lf = round(self.brackets[widest].next_lf(), 4)  # bracket ends are kept to 4 places, so an end is a point
        if self.joint:
            return lf, tuple(sorted(self.mix))
        open_ = tuple(sorted(m for m in free if self.brackets[m].tells(lf)))  # a point outside a bracket tells
        return (lf, open_) if open_ else None  # that model nothing

    def update(self, lf: float, open_: tuple[str, ...], least: dict[str, float]) -> bool:
        """Take a judged point in; False where a floor search ends (its first point failed: every rate 0)."""
        if self.joint:
            b, holds = self.brackets["*"], all(_holds(a) for a in least.values())
            if self.precision.floor and not holds and not b.lo_ok and lf == b.lo:
                return False
            b.update(lf, holds)
            return True
        for m in open_:
            self.brackets[m].update(lf, _holds(least[m]))
        return True

    def expected(self, asked: list[tuple[float, tuple[str, ...]]]) -> _Search:
        """A copy of the search as it will be if the points ``asked`` (its next_points) go as expected: an
        unverified low end holds, an unverified high end fails, a midpoint holds."""
        guess = _Search(self.precision, self.mix, self.joint, {m: replace(b) for m, b in self.brackets.items()})
        for lf, open_ in asked:
            fails = any(b.hi == lf and not b.hi_ok for b in self.brackets.values())
            guess.update(lf, open_, {m: 0.0 if fails else 1.0 for m in self.mix})
        return guess

    def rates(self) -> dict[str, float]:
        """Each model's rate at the lowest end its bracket held (0 where none held)."""
        def held(b: _Bracket) -> float:
            return b.lo if b.lo_ok else 0.0
        return {m: held(self.brackets["*" if self.joint else m]) * r for m, r in self.mix.items()}


def _start(precision: Precision, model: str) -> _Bracket:
    """The bracket ``precision.start`` gives ``model`` (the lowest lo and highest hi where it names the model more
    than once), or the whole range."""
    given = [(lo, hi) for m, lo, hi in precision.start if m == model and 0.0 <= lo < hi]
    grid = precision.resolution
    if not given:
        return _Bracket(grid=grid)
    lo = _on_grid(min(x for x, _ in given), grid, up=False)
    hi = _on_grid(max(x for _, x in given), grid, up=True)
    return _Bracket(lo, hi, lo <= 0.0, hi >= HIGHEST, max(hi - lo, 2 * grid), grid)
