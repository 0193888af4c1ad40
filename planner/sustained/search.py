"""Plan for the rate a cluster sustains: candidate plans over SLO margins, ranked by the closed form, the best
measured by the registered evaluator (the simulator), the one that sustains the most kept (the spec's own plan where
none sustains clearly more: within the simulator's spread between seeds, a different plan is no gain).

Why margins: a pooled pipeline needs slack under its SLO for batches to wait in its pools, and how much depends
on the pools' sizes and batches, which the MILP picks. A plan made with no margin fills the SLO with compute
and sustains little; one made with a large margin gives up throughput it could have held. Every candidate is
planned with the per-stage costs of serving inside its latency (lead and tail of each stage call) and with the
margin the sidecar's driver keeps, so none is shed whole at serve time. The best measured candidates that leave
whole GPUs idle (a wide margin can rule out every pipeline on a slow GPU type) also have those GPUs planned at
smaller margins (planner.sustained.fill), and the merged plans are measured too.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace

from tqdm import tqdm

from planner.sustained.capacity import predicted_rps
from planner.sustained.evaluators import evaluator
from planner.sustained.fill import Solve, fills, idle_gpus
from planner.sustained.measure_pool import measure_all
from plans.arrivals import Arrivals
from plans.plan_json import Plan
from plans.spec.planning_spec import PlanningSpec
from poolpipe_common.errors import InputError
from poolpipe_common.overheads import Overheads, driver_margin_us

# Shares of each model's SLO kept free for queueing, beyond the driver's own margin.
MARGIN_FRACTIONS = (0.0, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4)
MEASURED_CANDIDATES = 6  # how many of the best-predicted candidates the evaluator measures (the closed form
# ranks plans of one batch size well, but undervalues larger batches, so most candidates are measured)
FILLED_CANDIDATES = 3  # how many of the best measured candidates that leave whole GPUs idle get them filled
# A candidate replaces the spec's own plan only if it sustains more than this share more: the simulator's rates for
# one plan move by about 1 % between seeds at 100 GPUs, and a plan kept for a gain within that left apcnet 7 % below
# the reference plan on the seed the planner had not seen (benchmarks/sim_paper_sustained.py, V100 + T4, group 0).
OWN_PLAN_TOLERANCE = 0.02


@dataclass
class Candidate:
    margin: float | None  # share of the SLO kept beyond the driver's; None: the spec's own margin, no serving costs
    plan: Plan
    lines: tuple[str, ...]
    predicted: dict[str, float]
    measured: dict[str, float] | None = None
    fill_margin: float | None = None  # the plan's idle GPUs were planned at this margin (planner.sustained.fill)

    def rates(self) -> dict[str, float]:
        return self.measured if self.measured is not None else self.predicted


def score(plan: Plan, rates: dict[str, float]) -> float:
    """PPipe's max-min objective on sustained rates: the smallest rate / weight over the plan's models."""
    return min((rates.get(m.name, 0.0) / (m.weight or 1.0) for m in plan.models), default=0.0)


def costed(spec: PlanningSpec, margin: float, costs: Overheads) -> PlanningSpec:
    """``spec`` with each model's margin = the driver's + the way outside the sidecar's clock + ``margin`` x SLO
    (at least the spec's own) and the per-stage cost of serving added to every partition's latency."""
    return replace(spec, models=tuple(
        replace(m, slo_margin_us=max(m.slo_margin_us,
                                     driver_margin_us(m.slo_us) + costs.front_us + margin * m.slo_us),
                stage_overhead_us=costs.lead_us + costs.tail_us)
        for m in spec.models))


def _signature(plan: Plan) -> str:
    return repr([[p.to_dict() for p in m.pipelines] for m in plan.models])


def candidates(spec: PlanningSpec, solves: Sequence[Solve], arrivals: Arrivals, costs: Overheads
               ) -> list[Candidate]:
    """One plan per margin and planner, and the plan of the spec as it is (its own margin, no serving costs: PPipe's
    nominal plan, which on large pools often holds well), plans equal to an earlier one dropped; best predicted
    first."""
    out: dict[str, Candidate] = {}
    last_error: Exception | None = None
    for solve in solves:
        for margin in (None, *MARGIN_FRACTIONS):
            try:
                plan, lines = solve(spec if margin is None else costed(spec, margin, costs))
            except InputError as e:  # this margin leaves no pipeline within the SLO
                last_error = e
                continue
            out.setdefault(_signature(plan), Candidate(margin, plan, lines, predicted_rps(plan, arrivals, costs)))
    if not out:
        raise InputError(f"no plan fits the SLOs once serving's per-stage costs ({costs.lead_us:.0f} + "
                         f"{costs.tail_us:.0f} us per stage) and the driver's margin are counted: {last_error}; "
                         "raise the SLO or measure the costs (poolpipe serve --overheads-out) and pass --overheads")
    return sorted(out.values(), key=lambda c: -score(c.plan, c.predicted))


def with_sustainable(plan: Plan, rates: dict[str, float], arrivals: Arrivals, evaluated_by: str,
                     table: list[dict] | None = None) -> Plan:
    """``plan`` with each model's sustainable rate and the arrivals it assumed recorded."""
    models = tuple(replace(m, sustainable_rps=float(rates.get(m.name, 0.0)), arrivals=arrivals.text)
                   for m in plan.models)
    info = {"evaluated_by": evaluated_by, **({"candidates": table} if table is not None else {})}
    return replace(plan, models=models, sustained=info)


def plan_sustained(spec: PlanningSpec, solves: Sequence[Solve], arrivals: Arrivals, costs: Overheads,
                   evaluator_name: str | None = None, jobs: int | None = None) -> tuple[Plan, tuple[str, ...]]:
    """The candidate plan that sustains the most (max-min over models), with its sustainable rates recorded; the
    candidates are measured in up to ``jobs`` processes (planner.sustained.measure_pool)."""
    cands = candidates(spec, solves, arrivals, costs)
    name, _ = evaluator(evaluator_name)
    if name != "analytic":
        # the spec's own plan is always measured, so the kept plan never sustains less than it
        chosen = [c for i, c in enumerate(cands) if i < MEASURED_CANDIDATES or c.margin is None]
        # a bar on a terminal only (disable=None): the re-planner's and the tests' stderr stay clean
        with tqdm(total=0, desc=f"measuring candidate plans ({name})", unit="plan", file=sys.stderr, disable=None,
                  leave=False) as bar:
            _measure(chosen, name, arrivals, costs, jobs, bar)
            extra = filled(spec, cands, solves, arrivals, costs)
            _measure(extra, name, arrivals, costs, jobs, bar)
        cands += extra
    pool = [c for c in cands if c.measured is not None] or cands
    best = kept(pool)
    table = [{"margin_fraction": c.margin, "fill_margin_fraction": c.fill_margin,
              "nominal_rps": {m.name: m.throughput_rps for m in c.plan.models},
              "predicted_rps": c.predicted, "measured_rps": c.measured, "chosen": c is best} for c in cands]
    how = ("the spec's own margin" if best.margin is None
           else f"margin {best.margin:g} x SLO (+ the driver's) and serving's costs")
    if best.fill_margin is not None:
        how += f", its idle GPUs planned at margin {best.fill_margin:g}"
    lines = [f"sustained objective: {len(cands)} candidate plan(s) over SLO margins; kept the one planned with "
             f"{how}; {name} sustains "
             + ", ".join(f"{m} {r:,.1f} req/s" for m, r in best.rates().items()) + f" under {arrivals}"]
    return with_sustainable(best.plan, best.rates(), arrivals, name, table), (*best.lines, *lines)


def kept(pool: Sequence[Candidate]) -> Candidate:
    """The candidate that sustains the most (the smaller margin on a tie), unless the spec's own plan sustains within
    OWN_PLAN_TOLERANCE of it: then that one."""
    def held(c: Candidate) -> float:
        return score(c.plan, c.rates())

    best = max(pool, key=lambda c: (held(c), -(c.margin or 0.0)))
    own = [c for c in pool if c.margin is None and c.measured is not None]
    mine = max(own, key=held, default=None)
    return mine if mine is not None and held(best) <= (1.0 + OWN_PLAN_TOLERANCE) * held(mine) else best


def fill_margins(margin: float) -> tuple[float, ...]:
    """The margins a candidate's idle GPUs are planned at: none (their pools are small, so this is the most
    they add) and the grid's margin halfway down to it (slack for those small pools), each merged plan being one
    more simulation."""
    half = max((m for m in MARGIN_FRACTIONS if m <= margin / 2), default=0.0)
    return tuple(sorted({0.0, half})) if margin > 0 else ()


def filled(spec: PlanningSpec, cands: Sequence[Candidate], solves: Sequence[Solve], arrivals: Arrivals,
           costs: Overheads) -> list[Candidate]:
    """The best measured candidates that leave whole GPUs idle, those GPUs planned at smaller margins
    (:func:`fill_margins`, planner.sustained.fill), not yet measured; plans equal to a candidate's dropped."""
    seen = {_signature(c.plan) for c in cands}
    idle = [(c, gpus) for c in cands if c.measured is not None and c.margin is not None
            for gpus in [idle_gpus(c.plan, spec.cluster.gpus)] if gpus]
    bases = sorted(idle, key=lambda cg: -score(cg[0].plan, cg[0].rates()))[:FILLED_CANDIDATES]
    out = []
    for base, gpus in bases:
        for fill_margin, plan, lines in fills(spec, base.plan, gpus, fill_margins(base.margin), solves,
                                              lambda s, m: costed(s, m, costs)):
            if _signature(plan) in seen:
                continue
            seen.add(_signature(plan))
            out.append(Candidate(base.margin, plan, base.lines + lines, predicted_rps(plan, arrivals, costs),
                                 None, fill_margin))
    return out


def _measure(cands: Sequence[Candidate], name: str, arrivals: Arrivals, costs: Overheads, jobs: int | None,
             bar: tqdm) -> None:
    """Each candidate's rates measured by the evaluator ``name`` (planner.sustained.measure_pool), ``bar`` counting."""
    bar.total += len(cands)
    bar.refresh()
    for c, rates in zip(cands, measure_all(name, [c.plan for c in cands], arrivals, costs, jobs, bar.update),
                        strict=True):
        c.measured = rates


def annotate(plan: Plan, arrivals: Arrivals, costs: Overheads, evaluator_name: str | None = None) -> Plan:
    """Any plan with its sustainable rates measured (for the objectives that do not plan for them)."""
    name, evaluate = evaluator(evaluator_name)
    return with_sustainable(plan, evaluate(plan, arrivals, costs), arrivals, name)
