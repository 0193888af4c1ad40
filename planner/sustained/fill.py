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

from planner.plan_json import Plan
from planner.spec.planning_spec import PlanningSpec
from poolpipe_common.errors import InputError

Solve = Callable[[PlanningSpec], tuple[Plan, tuple[str, ...]]]


def idle_gpus(plan: Plan, gpus: dict[str, int]) -> dict[str, int]:
    """Whole GPUs of each type (of ``gpus``, the cluster's counts) that none of the plan's vGPUs sit on."""
    used = plan.physical_gpus_used()
    return {t: n - math.ceil(used.get(t, 0.0) - 1e-9) for t, n in gpus.items()
            if n - math.ceil(used.get(t, 0.0) - 1e-9) > 0}


def can_fill(plan: Plan) -> bool:
    """Plans whose GPUs are named or split unequally (co-location, unequal vGPU sizes) are not filled: a
    leftover plan's GPU names would collide with theirs."""
    return plan.colocation is None and plan.gpu_splits is None and not any(
        p.placement for m in plan.models for pl in m.pipelines for p in pl.partitions)


def merged(base: Plan, extra: Plan) -> Plan:
    """``base`` with ``extra``'s pipelines added to the same models (rates summed; the objective recomputed, and
    no bound: the two solves' bounds do not add up to one)."""
    more = {m.name: m for m in extra.models}
    models = tuple(m if m.name not in more else
                   replace(m, pipelines=m.pipelines + more[m.name].pipelines,
                           throughput_rps=m.throughput_rps + more[m.name].throughput_rps)
                   for m in base.models)
    objective = (models[0].throughput_rps if len(models) == 1
                 else min(m.throughput_rps / (m.weight or 1.0) for m in models))
    return replace(base, models=models, objective=objective, bound=None, gap=None,
                   solve_seconds=base.solve_seconds + extra.solve_seconds)


def fills(spec: PlanningSpec, plan: Plan, margins: Sequence[float], solves: Sequence[Solve],
          costed: Callable[[PlanningSpec, float], PlanningSpec]) -> list[tuple[float, Plan, tuple[str, ...]]]:
    """``plan`` with its idle GPUs planned at each of ``margins`` by each solve: (fill margin, merged plan, the
    fill's lines); none where nothing is idle or no model fits on the idle GPUs within a margin."""
    idle = idle_gpus(plan, spec.cluster.gpus) if can_fill(plan) else {}
    if not idle:
        return []
    rest = replace(spec, cluster=replace(spec.cluster, gpus=idle))
    out = []
    for margin in margins:
        for solve in solves:
            try:
                extra, lines = solve(costed(rest, margin))
            except InputError:  # no model fits on these GPUs within this margin
                continue
            out.append((margin, merged(plan, extra), lines))
    return out
