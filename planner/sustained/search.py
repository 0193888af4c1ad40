"""Plan for the rate a cluster sustains: candidate plans over SLO margins, each made by the request's planners with
serving's costs counted, ranked by the closed form; the best few measured by the evaluator (the simulator), and the
one that sustains the most kept (planner.sustained.choice: the robust one among those within MODEL_ERROR of the
best, the spec's own plan where none sustains clearly more, the resilient one where another holds clearly more once
costs rise).

Why margins: a pooled pipeline needs slack under its SLO for batches to wait in its pools, and how much depends
on the pools' sizes and batches, which the MILP picks. A plan made with no margin fills the SLO with compute
and sustains little; one made with a large margin gives up throughput it could have held. Every candidate is
planned with the per-stage costs of serving inside its latency (lead and tail of each stage call) and with the
margin the sidecar's driver keeps, so none is shed whole at serve time. The best-predicted candidate that leaves
whole GPUs idle (a wide margin can rule out every pipeline on a slow GPU type) also has those GPUs planned at
smaller margins (planner.sustained.fill), and the merged plans are ranked with the others.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import replace

from tqdm import tqdm

from planner.planners import Planner
from planner.solvers.milp_solvers import SolverOptions
from planner.sustained.capacity import (
    COST_RISE,
    cost_resilience,
    predicted_rps,
    slack_reserve_us,
    without_dead_pipelines,
)
from planner.sustained.choice import (
    MODEL_ERROR,
    CandidatePlan,
    kept,
    risen_score,
    rival,
    score,
    stage_calls,
    to_verify,
    unique,
)
from planner.sustained.evaluators import evaluator
from planner.sustained.fewer_cuts import most_partitions, worth_fewer_cuts
from planner.sustained.fill import SolveEach, fill_specs, idle_gpus, merged_fills
from planner.sustained.measure_pool import WorkerPool, measure_all
from plans.arrivals import Arrivals
from plans.plan_json import Plan
from plans.spec.planning_spec import ModelSpec, PlanningSpec
from poolpipe_common.errors import InputError
from poolpipe_common.overheads import Overheads, driver_margin_us
from scheduler.sim.sustain import Precision, mix_rates

# Shares of each model's SLO kept free for queueing, beyond the driver's own margin.
MARGIN_FRACTIONS = (0.0, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4)
# PipelineColumns are screened, not proven: their MILPs stop within this relative gap (queueing moves a plan's rate by
# more than 1 %), which takes HiGHS from tens of seconds to under one on 100 GPUs and three models.
SCREEN_GAP = 0.01
# ... and within this many branch-and-bound nodes (a bound on work, so the same on any machine): every screen of the
# timing specs needed 23 or fewer; fills of their idle T4s found their best plan at the root and ran to the bound.
SCREEN_NODES = 500
MEASURED_CANDIDATES = 3  # the best-predicted candidates the evaluator measures, and as many whole-model ones, with
# the spec's own plan: what np planned the same way would measure, so the kept plan does not sustain less than it
FILLED_CANDIDATES = 2  # each planner's best-predicted candidates that leave whole GPUs idle get them filled
# The candidates are screened on quarter-length points to MODEL_ERROR, the search starting from the closed form's rate
# (within GUESS_BAND of the simulator's on most plans); the kept one is then measured to the promise's precision
# (scheduler.sim.sustain.Precision's defaults) from its screened rate.
SCREEN_FIDELITY = 0.25
GUESS_BAND = 0.1
# The kept plan's promise: the screened rate verified on full-length points, to the screen's own resolution (the lo of
# a bracket MODEL_ERROR wide: at most that much below what the plan holds on the planner's seed). Bisecting it to 1 %
# took two more full-length points (half of the planning time at 16 GPUs), and the promise it found was 1-5 % above
# what a 3x longer run on another seed held (benchmarks/promise_grid.py): the finer figure was not the truer one.
PROMISE_RESOLUTION = MODEL_ERROR


def with_serving_costs(spec: PlanningSpec, margin: float, costs: Overheads) -> PlanningSpec:
    """``spec`` with each model's margin = the driver's + the way outside the sidecar's clock + a stage call's costs
    (capacity.slack_reserve_us) + ``margin`` x SLO (at least the spec's own) and the per-stage cost of serving added
    to every partition's latency (a call the size of the model's input, at no load: the MILP screens; the closed form
    then counts each call's bytes and the rate).
    Compute that runs ``costs.slowdown`` times the profile's: the budget and the stage cost divided by it, so that
    profiled latency + cost <= budget says slowed latency + cost <= the SLO less the margin (a T4 pool of fsaf at 3x,
    59.05 ms profiled against 60.0 left, was planned; its sidecar, measuring 60.0-60.2 ms with the 2.5 % slowdown and
    the stage calls, shed every request sent to it, and the plan held 0.5 of its promise)."""
    def stage_cost(m: ModelSpec) -> float:
        size = m.profile.input_bytes or 0
        return costs.lead_for(size) + costs.tail_for(size)

    def slowed_margin(m: ModelSpec) -> float:
        size = m.profile.input_bytes or 0
        kept = max(m.slo_margin_us, driver_margin_us(m.slo_us) + costs.front_us + costs.front_extra_us(size)
                   + slack_reserve_us(costs, size) + margin * m.slo_us)
        return m.slo_us - (m.slo_us - kept) / costs.slowdown

    return replace(spec, models=tuple(
        replace(m, slo_margin_us=slowed_margin(m), stage_overhead_us=stage_cost(m) / costs.slowdown)
        for m in spec.models))


def screening(options: SolverOptions) -> SolverOptions:
    """The request's solver options with at least SCREEN_GAP, within SCREEN_NODES."""
    nodes = SCREEN_NODES if options.max_nodes is None else min(options.max_nodes, SCREEN_NODES)
    return replace(options, rel_gap=max(options.rel_gap, SCREEN_GAP), max_nodes=nodes)


def _signature(plan: Plan) -> str:
    return repr([[p.to_dict() for p in m.pipelines] for m in plan.models])


def solve_one(planner: Planner, spec: PlanningSpec, options: SolverOptions) -> Plan | InputError:
    """The planner's plan of ``spec``, or the InputError it raised (this margin leaves no pipeline within the SLO)."""
    try:
        return planner.solve(spec, options)
    except InputError as e:
        return e


def solve_each(pool: WorkerPool, options: SolverOptions) -> SolveEach:
    """Solves (planner, spec) pairs in ``pool``'s workers, side by side (each MILP is deterministic for its inputs)."""
    return lambda asked: pool.map(solve_one, [(planner, spec, options) for planner, spec in asked])


def candidate(margin: float | None, plan: Plan, arrivals: Arrivals, costs: Overheads, fill_margin: float | None = None,
              origins: tuple[int, ...] = (0,)) -> CandidatePlan:
    """A candidate as the closed form rates it: its predicted rates and how much of them it keeps as costs rise."""
    return CandidatePlan(margin, plan, predicted_rps(plan, arrivals, costs), None, fill_margin,
                         origins=origins, resilience=cost_resilience(plan, arrivals, costs))


def candidate_plans(spec: PlanningSpec, planners: Sequence[Planner], options: SolverOptions, arrivals: Arrivals,
                    costs: Overheads, pool: WorkerPool | None = None) -> list[CandidatePlan]:
    """One plan per margin and planner, and the plan of the spec as it is (its own margin, no serving costs: PPipe's
    nominal plan, which on large pools often holds well), plans equal to an earlier one dropped; best predicted
    first (ties: the order made, so the same inputs rank the same). The MILPs run in ``pool`` (None: here)."""
    out: dict[str, CandidatePlan] = {}
    asked = [(i, planner, margin) for i, planner in enumerate(planners) for margin in (None, *MARGIN_FRACTIONS)]
    solved = solve_each(pool or WorkerPool(1), screening(options))(
        [(planner, spec if margin is None else with_serving_costs(spec, margin, costs)) for _, planner, margin in
         asked])
    last_error: Exception | None = None
    for (origin, _, margin), plan in zip(asked, solved, strict=True):
        if isinstance(plan, InputError):
            last_error = plan
            continue
        if margin is None and (plan := without_dead_pipelines(plan, costs)) is None:
            continue
        if (same := out.get(_signature(plan))) is not None:
            same.origins = tuple(sorted({*same.origins, origin}))
            continue
        out[_signature(plan)] = candidate(margin, plan, arrivals, costs, origins=(origin,))
    if not out:
        raise InputError(f"no plan fits the SLOs once serving's per-stage costs ({costs.lead_us:.0f} + "
                         f"{costs.tail_us:.0f} us per stage) and the driver's margin are counted: {last_error}; "
                         "raise the SLO or measure the costs (poolpipe serve --overheads-out) and pass --overheads")
    return sorted(out.values(), key=lambda c: -score(c.plan, c.predicted))


def all_candidates(spec: PlanningSpec, planners: Sequence[Planner], options: SolverOptions, arrivals: Arrivals,
                   costs: Overheads, pool: WorkerPool | None = None) -> list[CandidatePlan]:
    """Every candidate the search weighs, best predicted first: one per margin and planner (:func:`candidate_plans`),
    the best with three or more partitions planned with one fewer (:func:`fewer_cut`), and the best that leave
    whole GPUs idle with those GPUs filled (:func:`filled`)."""
    cands = candidate_plans(spec, planners, options, arrivals, costs, pool)
    fewer = fewer_cut(spec, cands, planners, options, arrivals, costs, pool)
    made = {_signature(c.plan) for c in fewer}
    fills = [c for c in filled(spec, cands, planners, options, arrivals, costs, pool) if _signature(c.plan) not in made]
    return sorted(cands + fewer + fills, key=lambda c: -score(c.plan, c.predicted))


def fewer_cut(spec: PlanningSpec, cands: Sequence[CandidatePlan], planners: Sequence[Planner], options: SolverOptions,
              arrivals: Arrivals, costs: Overheads, pool: WorkerPool | None = None) -> list[CandidatePlan]:
    """Each planner's best-predicted candidates with three or more partitions, planned again by it at their margin
    with one partition fewer (planner.sustained.fewer_cuts); plans equal to a candidate's dropped."""
    seen = {_signature(c.plan) for c in cands}
    bases = unique(c for group in by_origin(cands) for c in worth_fewer_cuts(group))
    asked = [(planners[base.origins[0]], replace(with_serving_costs(spec, base.margin, costs),
                                                 max_partitions=most_partitions(base.plan) - 1)) for base in bases]
    out = []
    for base, plan in zip(bases, solve_each(pool or WorkerPool(1), screening(options))(asked), strict=True):
        if isinstance(plan, InputError) or _signature(plan) in seen:
            continue
        seen.add(_signature(plan))
        out.append(replace(candidate(base.margin, plan, arrivals, costs, origins=base.origins), fewer_cuts=True))
    return out


def by_origin(cands: Sequence[CandidatePlan]) -> list[list[CandidatePlan]]:
    """The candidates of each planner (CandidatePlan.origins), in their order."""
    return [[c for c in cands if o in c.origins] for o in sorted({o for c in cands for o in c.origins})]


def to_measure(cands: Sequence[CandidatePlan]) -> list[CandidatePlan]:
    """The best-predicted MEASURED_CANDIDATES, as many best-predicted whole-model plans, and the spec's own plan; and
    of each planner's candidates as many and its own plan, so that the kept plan sustains no less than the narrower
    planner's search (np planned the same way) would keep; those counted without the plans with one cut fewer, whose
    best-predicted is measured beside them, not in their place (the closed form ranks plans of different cuts least
    surely: fsaf at 2.5x with 100 Gbps links, a two-partition plan predicted at 282 req/s sustains 309, simulated,
    and one with a cut fewer predicted at 300 pushed it out of the three). The best-predicted comes first: the screen
    measures it first, and its rate is the others' floor."""
    plain = [c for c in cands if not c.fewer_cuts]
    whole = [c for c in plain if stage_calls(c.plan) == 1.0][:MEASURED_CANDIDATES]
    mine = [c for group in by_origin(plain) for c in (*group[:MEASURED_CANDIDATES],
                                                      *[c for c in group if c.margin is None][:1])]
    own = [c for c in plain if c.margin is None][:1]
    fewer = [c for c in cands if c.fewer_cuts][:1]
    return unique((*cands[:1], *plain[:MEASURED_CANDIDATES], *whole, *own, *mine, *fewer))


def with_sustainable(plan: Plan, rates: dict[str, float], arrivals: Arrivals, evaluated_by: str,
                     table: list[dict] | None = None) -> Plan:
    """``plan`` with each model's sustainable rate and the arrivals it assumed recorded."""
    models = tuple(replace(m, sustainable_rps=float(rates.get(m.name, 0.0)), arrivals=arrivals.text)
                   for m in plan.models)
    info = {"evaluated_by": evaluated_by, **({"candidates": table} if table is not None else {})}
    return replace(plan, models=models, sustained=info)


def plan_sustained(spec: PlanningSpec, planners: Sequence[Planner], options: SolverOptions, arrivals: Arrivals,
                   costs: Overheads, evaluator_name: str | None = None, jobs: int | None = None
                   ) -> tuple[Plan, tuple[str, ...]]:
    """The candidate plan that sustains the most (max-min over models), with its sustainable rates recorded; the
    candidates are measured in up to ``jobs`` processes (planner.sustained.measure_pool)."""
    name, _ = evaluator(evaluator_name)
    with WorkerPool(jobs, preload=(__name__,)) as workers:  # started now or by the CLI: imports overlap MILPs
        cands = all_candidates(spec, planners, options, arrivals, costs, workers)
        pool, best = (cands, kept(cands)) if name == "analytic" else _measured(cands, name, arrivals, costs, workers)
    table = [{"margin_fraction": c.margin, "fill_margin_fraction": c.fill_margin,
              "nominal_rps": {m.name: m.throughput_rps for m in c.plan.models}, "stage_calls": stage_calls(c.plan),
              "partitions": most_partitions(c.plan), "predicted_rps": c.predicted, "measured_rps": c.measured,
              "resilience": c.resilience,
              "chosen": c is best,
              **({"fell_short": True} if c.fell_short else {})} for c in cands]
    how = ("the spec's own margin" if best.margin is None
           else f"margin {best.margin:g} x SLO (+ the driver's) and serving's costs")
    if best.fill_margin is not None:
        how += f", its idle GPUs planned at margin {best.fill_margin:g}"
    short = sum(c.fell_short for c in cands)
    keeps = risen_score(best) / max(score(best.plan, best.rates()), 1e-12)
    lines = [f"sustained objective: {len(cands)} candidate plan(s) over SLO margins, {len(pool)} screened"
             + (f" ({short} fell short of the best at their first point)" if short else "") + "; kept the "
             f"one planned with {how}; {name} sustains "
             + ", ".join(f"{m} {r:,.1f} req/s" for m, r in best.rates().items()) + f" under {arrivals}"
             + f"; {keeps:.0%} of it with serving's costs {COST_RISE:.0%} higher (the closed form's fall)"]
    return with_sustainable(best.plan, best.rates(), arrivals, name, table), (*best.plan.notes, *lines)


def _measured(cands: Sequence[CandidatePlan], name: str, arrivals: Arrivals, costs: Overheads, jobs: WorkerPool
              ) -> tuple[list[CandidatePlan], CandidatePlan]:
    """(the screened candidates, the kept one measured to the promise's precision). A screen is too coarse to replace
    the spec's own plan, or to choose between plans within MODEL_ERROR: those are measured at full length too
    (to_verify) and kept() weighs them again (dnl at 3x: a two-stage plan screened at 201.9 req/s beside a whole-model
    one at 201.8, which was kept; the two-stage plan sustains 212.7-215.1 at full length)."""
    # a bar on a terminal only (disable=None): the re-planner's and the tests' stderr stay clean
    with tqdm(total=0, desc=f"measuring candidate plans ({name})", unit="plan", file=sys.stderr, disable=None,
              leave=False) as bar:
        screened = to_measure(cands)
        pool = _screened(screened, name, arrivals, costs, jobs, bar)
        final, other = to_verify(pool), rival(pool)
        screened_rates = other.measured if other is not None else None
        floor = (1.0 + MODEL_ERROR) * score(final[0].plan, final[0].rates())
        _measure(final, [rival_precision(c, floor) if c is other else promise_precision(c) for c in final],
                 name, arrivals, costs, jobs, bar)
        if other is not None and score(other.plan, other.rates()) <= 0:  # not clearly better: screened rates stay
            other.measured = screened_rates
            final = [c for c in final if c is not other]
        choice = kept(final)
        if choice is other:  # it won: its rates to the promise's precision
            _measure([choice], [promise_precision(choice)], name, arrivals, costs, jobs, bar)
    return screened, choice


def _screened(pool: Sequence[CandidatePlan], name: str, arrivals: Arrivals, costs: Overheads, jobs: WorkerPool,
              bar: tqdm) -> list[CandidatePlan]:
    """The candidates worth keeping, screened: the best-predicted first, then the others from its rate less
    MODEL_ERROR (screening_precision's floor), those that fail there marked fell_short and left out."""
    _measure(pool[:1], [screening_precision(pool[0])], name, arrivals, costs, jobs, bar)
    floor = (1.0 - MODEL_ERROR) * score(pool[0].plan, pool[0].rates())
    _measure(pool[1:], [screening_precision(c, floor) for c in pool[1:]], name, arrivals, costs, jobs, bar)
    for c in pool[1:]:
        if floor > 0 and c.measured is not None and score(c.plan, c.measured) <= 0:
            c.measured, c.fell_short = None, True
    return [c for c in pool if c.measured is not None]


def fill_margins(margin: float | None) -> tuple[float, ...]:
    """The margins a candidate's idle GPUs are planned at: none (their pools are small, so this is the most
    they add) and the grid's margin halfway down to it (slack for those small pools), each merged plan being one
    more simulation. The spec's own plan (None) idles only the GPUs of pipelines with no slack: none."""
    if margin is None:
        return (0.0,)
    half = max((m for m in MARGIN_FRACTIONS if m <= margin / 2), default=0.0)
    return tuple(sorted({0.0, half})) if margin > 0 else ()


def filled(spec: PlanningSpec, cands: Sequence[CandidatePlan], planners: Sequence[Planner], options: SolverOptions,
           arrivals: Arrivals, costs: Overheads, pool: WorkerPool | None = None) -> list[CandidatePlan]:
    """Each planner's best-predicted candidates that leave whole GPUs idle, those GPUs planned at smaller margins
    (:func:`fill_margins`, planner.sustained.fill); plans equal to a candidate's dropped."""
    seen = {_signature(c.plan) for c in cands}
    best = sorted((c for c in cands if idle_gpus(c.plan, spec.cluster.gpus)), key=lambda c: -score(c.plan, c.predicted))
    # a plan more than one planner made is filled once
    bases = unique(c for group in by_origin(best) for c in group[:FILLED_CANDIDATES])
    asked = [fill_specs(spec, idle_gpus(base.plan, spec.cluster.gpus), fill_margins(base.margin), planners,
                        lambda s, m: with_serving_costs(s, m, costs)) for base in bases]
    solved = iter(solve_each(pool or WorkerPool(1), screening(options))(
        [(planner, s) for asks in asked for _, planner, s in asks]))  # every base's MILPs side by side
    out = []
    for base, asks in zip(bases, asked, strict=True):
        for fill_margin, plan in merged_fills(base.plan, [m for m, _, _ in asks], [next(solved) for _ in asks]):
            if _signature(plan) in seen:
                continue
            seen.add(_signature(plan))
            out.append(candidate(base.margin, plan, arrivals, costs, fill_margin, base.origins))
    return out


def _mix_fraction(c: CandidatePlan, rates: dict[str, float]) -> dict[str, float]:
    """Each model's rate in ``rates`` as a fraction of its rate in the plan's mix (scheduler.sim.sustain.mix_rates)."""
    mix = mix_rates(c.plan)
    return {m: got / mix[m] for m, got in sorted(rates.items()) if mix.get(m)}


def screening_precision(c: CandidatePlan, floor: float = 0.0) -> Precision:
    """The mix as one (what the max-min ranking needs), on quarter-length points to MODEL_ERROR, from the closed form's
    fraction of the mix (within GUESS_BAND). With a ``floor`` (a score: the best measured so far less MODEL_ERROR), the
    first point is the fraction of the mix that scores it, and a candidate that fails there is measured no further
    (its rates 0): it could not be kept, as robust_best weighs only those within MODEL_ERROR of the best."""
    guess = min(_mix_fraction(c, c.predicted).values(), default=0.0)
    if floor > 0:
        lo = floor / max(score(c.plan, mix_rates(c.plan)), 1e-12)
        return Precision(MODEL_ERROR, SCREEN_FIDELITY, (("*", lo, max(guess * (1 + GUESS_BAND), lo * 1.1)),),
                         joint=True, floor=True)
    start = (("*", guess * (1 - GUESS_BAND), guess * (1 + GUESS_BAND)),) if guess > 0 else ()
    return Precision(MODEL_ERROR, SCREEN_FIDELITY, start, joint=True)


def rival_precision(c: CandidatePlan, floor: float) -> Precision:
    """A rival of the kept plan (to_verify) on full-length points, the mix as one, from the fraction of the mix that
    scores ``floor`` (the kept one's screened score plus MODEL_ERROR: what it must sustain to be kept instead); one
    that fails there is measured no further (its rates 0)."""
    lo = floor / max(score(c.plan, mix_rates(c.plan)), 1e-12)
    return Precision(PROMISE_RESOLUTION, start=(("*", lo, lo * (1 + GUESS_BAND)),), joint=True, floor=True)


def promise_precision(c: CandidatePlan) -> Precision:
    """The promise's precision: full-length points to PROMISE_RESOLUTION, each model's search starting from the
    screened fraction of the mix (held by all) to MODEL_ERROR above it (the screen's resolution) for the model the
    closed form names the bottleneck, and up to its closed form's rate for the others."""
    held = min(_mix_fraction(c, c.rates()).values(), default=0.0)
    if held <= 0:
        return Precision()
    guess = _mix_fraction(c, c.predicted)
    neck = min(guess, key=guess.__getitem__, default=None)
    top = {m: held + MODEL_ERROR if m == neck else max(held + MODEL_ERROR, g * (1 + GUESS_BAND))
           for m, g in guess.items()}
    return Precision(PROMISE_RESOLUTION, start=tuple((m, held, hi) for m, hi in top.items()))


def _measure(cands: Sequence[CandidatePlan], precisions: Sequence[Precision], name: str, arrivals: Arrivals,
             costs: Overheads, jobs: WorkerPool, bar: tqdm) -> None:
    """Each candidate's rates measured by the evaluator ``name`` (planner.sustained.measure_pool), ``bar`` counting."""
    bar.total += len(cands)
    bar.refresh()
    plans = [c.plan for c in cands]
    for c, rates in zip(cands, measure_all(name, plans, arrivals, costs, jobs, bar.update, precisions), strict=True):
        c.measured = rates


def annotate(plan: Plan, arrivals: Arrivals, costs: Overheads, evaluator_name: str | None = None,
             jobs: int | None = None) -> Plan:
    """Any plan with its sustainable rates measured (for the objectives that do not plan for them), its search's
    points in up to ``jobs`` processes."""
    name, evaluate = evaluator(evaluator_name)
    with WorkerPool(1 if name == "analytic" else jobs) as workers:
        return with_sustainable(plan, evaluate(plan, arrivals, costs, None, points=workers.judge), arrivals, name)
