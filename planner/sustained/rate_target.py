"""The cheapest plan that sustains given rates at >= 99 % SLO attainment: the cost MILP asked for rates raised by
how far its last plan fell short, until the evaluator says they hold (or the cluster has no more GPUs)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from planner.sustained.evaluators import Evaluator
from plans.arrivals import Arrivals
from plans.plan_json import Plan
from poolpipe_common.errors import InputError
from poolpipe_common.overheads import Overheads

MAX_ROUNDS = 8
MIN_RAISE = 1.05  # each round asks at least this much more of a model that fell short


def cheapest_sustaining(solve_for: Callable[[dict[str, float]], Plan], target_rps: Mapping[str, float],
                        arrivals: Arrivals, costs: Overheads, evaluate: Evaluator
                        ) -> tuple[Plan, dict[str, float], int]:
    """(the plan, its sustainable rates, the rounds it took). ``solve_for(rates)`` plans the least cost that
    serves ``rates`` nominally; an InputError from it (the cluster cannot serve that much) ends the search."""
    asked = dict(target_rps)
    held: dict[str, float] = {}
    for rounds in range(1, MAX_ROUNDS + 1):
        try:
            plan = solve_for(asked)
        except InputError:
            if rounds == 1:  # the cluster cannot even serve the rates nominally: the cost MILP's own words
                raise
            break  # asked for more than the cluster has: what it sustained at most is below the target
        held = evaluate(plan, arrivals, costs)
        short = {m: r / max(held.get(m, 0.0), 1e-9) for m, r in target_rps.items() if held.get(m, 0.0) < r}
        if not short:
            return plan, held, rounds
        asked = {m: asked[m] * max(MIN_RAISE, short[m]) if m in short else asked[m] for m in asked}
    raise InputError("no plan within the cluster's GPUs sustains "
                     + ", ".join(f"{m}={r:g} req/s" for m, r in target_rps.items())
                     + f" at 99 % SLO attainment under {arrivals} (the most a plan sustained: "
                     + ", ".join(f"{m}={held.get(m, 0.0):.1f}" for m in target_rps) + "); lower --rate or add GPUs")
