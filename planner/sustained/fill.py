"""Fill what a candidate plan leaves idle: whole GPUs that no pipeline of a wide-margin plan could use serve
pipelines planned for them alone at a smaller margin.

Why: one margin per model is a blunt knob. A margin wide enough for the pooled pipelines' queues can rule out
every pipeline on a slow GPU type (a T4 serving the whole model at batch 1 needs most of the SLO), so those GPUs
sit idle; a margin narrow enough to use them makes the MILP spend the rest of the cluster on pipelines with no
slack. Planning the idle GPUs on their own, at a smaller margin, keeps the slack where the large pools need it
and adds what the leftover GPUs hold (the simulator then measures the merged plan like any candidate).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace

from planner.planners import Planner
from plans.plan_json import Plan, nominal_objective
from plans.spec.planning_spec import PlanningSpec
from poolpipe_common.errors import InputError


def idle_gpus(plan: Plan, gpus: dict[str, int]) -> dict[str, int]:
    """Whole GPUs of each type (of ``gpus``, the cluster's counts) that none of the plan's vGPUs sit on; none for
    plans whose GPUs are named or split unequally (co-location, unequal vGPU sizes), whose names a leftover plan's
    would collide with."""
    if plan.colocation is not None or plan.gpu_splits is not None:
        return {}
    used = plan.physical_gpus_used()
    idle = {t: n - math.ceil(used.get(t, 0.0) - 1e-9) for t, n in gpus.items()}
    return {t: n for t, n in idle.items() if n > 0}


def merged(base: Plan, extra: Plan) -> Plan:
    """``base`` with ``extra``'s pipelines added to the same models (rates summed; the objective recomputed, and
    no bound: the two solves' bounds do not add up to one)."""
    more = {m.name: m for m in extra.models}
    models = tuple(m if m.name not in more else
                   replace(m, pipelines=m.pipelines + more[m.name].pipelines,
                           throughput_rps=m.throughput_rps + more[m.name].throughput_rps)
                   for m in base.models)
    return replace(base, models=models, objective=nominal_objective(models), bound=None, gap=None,
                   solve_seconds=base.solve_seconds + extra.solve_seconds)


# Solves (planner, spec) pairs under the request's options: each one's plan, or the InputError it raised (no
# pipeline fits); side by side where the caller has workers (planner.sustained.search.solve_each).
SolveEach = Callable[[Sequence[tuple[Planner, PlanningSpec]]], list[Plan | InputError]]


def fill_specs(spec: PlanningSpec, idle: dict[str, int], margins: Sequence[float], planners: Sequence[Planner],
               with_costs: Callable[[PlanningSpec, float], PlanningSpec]) -> list[tuple[float, Planner, PlanningSpec]]:
    """What planning a plan's ``idle`` GPUs asks: (fill margin, planner, the spec of those GPUs at that margin)."""
    rest = replace(spec, cluster=replace(spec.cluster, gpus=idle))
    return [(margin, planner, with_costs(rest, margin)) for margin in margins for planner in planners]


def fills(spec: PlanningSpec, plan: Plan, idle: dict[str, int], margins: Sequence[float],
          planners: Sequence[Planner], solve_each: SolveEach,
          with_costs: Callable[[PlanningSpec, float], PlanningSpec]) -> list[tuple[float, Plan]]:
    """``plan`` with its ``idle`` GPUs (:func:`idle_gpus`) planned at each of ``margins`` by each planner: (fill
    margin, merged plan); none where no model fits on them within a margin."""
    asked = fill_specs(spec, idle, margins, planners, with_costs)
    solved = solve_each([(planner, s) for _, planner, s in asked])
    return merged_fills(plan, [margin for margin, _, _ in asked], solved)


def merged_fills(plan: Plan, margins: Sequence[float], solved: Sequence[Plan | InputError]) -> list[tuple[float, Plan]]:
    """(fill margin, ``plan`` merged with the plan of its idle GPUs) for each solve that found one (an InputError:
    no model fits on these GPUs within this margin)."""
    return [(margin, merged(plan, extra)) for margin, extra in zip(margins, solved, strict=True)
            if not isinstance(extra, InputError)]
