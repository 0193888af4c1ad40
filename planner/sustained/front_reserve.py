"""How long before the SLO each deadline falls: the reserve a sidecar keeps for a request's way outside its clock
(the costs' ``front_us``; ``serve --front-us`` defaults to the plan's). Chosen by simulating a plan with the way its
clients measured (``front_quantiles_us``): too small a reserve turns answers late at the client, too large sheds
requests that would have made it. On googlenet-v3 at 2.5x (13 ms SLO) calibrate printed `700 us 491.6, 900 us 491.6,
..., 2000 us 430.2` (simulated req/s with each reserve; docs/benchmarks.md, the deadline's reserve)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from planner.sustained.choice import MODEL_ERROR, score
from plans.arrivals import Arrivals, parse_arrivals
from plans.plan_json import Plan
from poolpipe_common.overheads import Overheads
from scheduler.sim.sustain import simulated_rps

# The candidates: these quantiles of the measured way outside the sidecar's clock, rounded to RESERVE_STEP_US, and
# the reserve the costs already keep
RESERVE_QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9, 0.99)
RESERVE_STEP_US = 100.0


@dataclass(frozen=True)
class ReserveChoice:
    """The reserve kept (µs) and what the simulator sustained (req/s, the plan's max-min) with each candidate."""

    reserve_us: float
    sustained_rps: dict[float, float]

    def to_dict(self) -> dict:
        return {"chosen_us": self.reserve_us,
                "simulated_rps": {f"{r:g}": round(v, 1) for r, v in sorted(self.sustained_rps.items())}}


def reserve_candidates(costs: Overheads) -> tuple[float, ...]:
    """The reserves worth simulating for ``costs``: its front's RESERVE_QUANTILES (rounded) and its own reserve."""
    rounded = {RESERVE_STEP_US * max(1, round(float(costs.front_at(q)) / RESERVE_STEP_US)) for q in RESERVE_QUANTILES}
    return tuple(sorted(rounded | {costs.front_us}))


def plan_arrivals(plan: Plan) -> Arrivals:
    """The arrivals the plan's promise assumed (its first model's; Poisson where it records none)."""
    return parse_arrivals(next((m.arrivals for m in plan.models if m.arrivals), "poisson"))


def best_reserve(plan: Plan, costs: Overheads) -> ReserveChoice | None:
    """The reserve under which the simulator sustains most of ``plan`` with ``costs`` (:func:`kept_reserve`); None
    where no client measured that way (the costs' front_us is then the way itself, not a reserve to choose) or
    where the plan sustains nothing."""
    if not costs.front_quantiles_us:
        return None
    arrivals = plan_arrivals(plan)
    rates = {r: score(plan, simulated_rps(plan, arrivals, replace(costs, front_us=r)))
             for r in reserve_candidates(costs)}
    return ReserveChoice(kept_reserve(rates), rates) if max(rates.values()) > 0 else None


def kept_reserve(rates: dict[float, float]) -> float:
    """The largest reserve (µs) of ``rates`` (reserve -> rate sustained) within MODEL_ERROR of the highest rate: the
    simulator cannot tell those apart, and the largest turns fewest answers late when the way outside grows
    (googlenet-v3 at 3x, 1.4 ms chosen on a 1.4 % simulated gain over 2 ms: benchmarks/live_reserve.py printed
    `1400 us held more in 1 of 5 pairs`, its points 5-308 answers late against 11-53)."""
    top = max(rates.values())
    return max(r for r, v in rates.items() if v >= (1.0 - MODEL_ERROR) * top)
