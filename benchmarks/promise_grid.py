"""Does the plan's promise hold on models, clusters and SLOs nobody tuned for? Simulated, over a grid: every model of
data/ppipe x the four cluster pairs (L4/V100 high-class, T4/P4 low-class) x three SLO factors (x the whole model's
batch-1 latency on the high-class GPU) x two cluster sizes (1:3 high:low). Each case is planned with the default
objective (`poolpipe plan`'s defaults: sustained, simulated, default per-stage costs), and its promise
(plan.json's sustainable_rps) is compared with the rate a long simulation on a seed the planner never saw holds at
>= 99 % SLO attainment (bisection to 1 % around the promise, each point 3x the planner's length). Printed: per case
the promise, the long simulation's rate, their ratio and the planning time; then the share of cases within 5 % and
10 %, and the worst.

    python -P benchmarks/promise_grid.py --quick        # L4+T4, 4+12 GPUs, SLO 3x: every model (12 cases)
    python -P benchmarks/promise_grid.py                # the whole grid (288 cases; hours on 2 cores)
    python -P benchmarks/promise_grid.py --factors 3 --sizes 4+12   # every model on every pair (48 cases)
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ProcessPoolExecutor

from rich.console import Console
from rich.table import Table

from planner.entry import plan as plan_spec
from planner.request import PlanRequest
from plans.arrivals import parse_arrivals
from poolpipe.experiment_cases import Case, case_spec, grid_arguments, grid_cases
from poolpipe_common.overheads import DEFAULT_OVERHEADS
from scheduler.sim.sustain import Precision, mix_rates, simulated_rps

UNSEEN_SEED = 101  # the planner measures on seed 0
LONG = 3.0  # the long simulation's points are this many times the planner's
POISSON = parse_arrivals("poisson")


def long_rate(plan, promise_lf: float) -> float:
    """The fraction of the mix a long run on the unseen seed holds, searched from the promise (within 25 %)."""
    model = plan.models[0].name
    start = ((model, promise_lf * 0.8, min(1.05, promise_lf * 1.25)),) if promise_lf > 0 else ()
    held = simulated_rps(plan, POISSON, DEFAULT_OVERHEADS, Precision(fidelity=LONG, start=start), seed=UNSEEN_SEED)
    return held[model] / mix_rates(plan)[model]


def one(case: Case) -> dict:
    model, pair, size, factor = case
    t0 = time.perf_counter()
    try:
        plan = plan_spec(case_spec(model, pair, size, factor), PlanRequest(jobs=1)).plan
    except Exception as e:  # noqa: BLE001 - a case the planner refuses is reported, not fatal
        return {"case": case, "error": str(e).splitlines()[0][:80]}
    planned_s = time.perf_counter() - t0
    m = plan.models[0]
    mix = mix_rates(plan)[m.name] or 1.0
    promise = m.sustainable_rps or 0.0
    held = long_rate(plan, promise / mix) * mix if promise > 0 else 0.0
    return {"case": case, "promise": promise, "held": held, "planned_s": planned_s,
            "ratio": held / promise if promise > 0 else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    grid_arguments(ap)
    args = ap.parse_args()
    cases = grid_cases(args)
    t0 = time.time()
    with ProcessPoolExecutor(args.jobs) as ex:
        rows = list(ex.map(one, cases))
    table = Table(title="promise (plan.json sustainable_rps, simulated on seed 0) vs a 3x longer simulation on "
                        "seed 101, default costs, Poisson")
    for col in ("model", "cluster", "SLO", "promise req/s", "long sim req/s", "long/promise", "plan s"):
        table.add_column(col, justify="left" if col in ("model", "cluster") else "right")
    ratios, times = [], []
    for r in rows:
        model, pair, size, factor = r["case"]
        where = f"{size[0]} {pair[0]} + {size[1]} {pair[1]}"
        if "error" in r:
            table.add_row(model[:28], where, f"{factor:g}x", "-", "-", r["error"], "-")
            continue
        times.append(r["planned_s"])
        if r["ratio"] is not None:
            ratios.append(r["ratio"])
        table.add_row(model[:28], where, f"{factor:g}x", f"{r['promise']:.1f}", f"{r['held']:.1f}",
                      "-" if r["ratio"] is None else f"{r['ratio']:.3f}", f"{r['planned_s']:.1f}")
    Console(width=160).print(table)
    if ratios:
        within5 = sum(abs(x - 1) <= 0.05 for x in ratios) / len(ratios)
        within10 = sum(abs(x - 1) <= 0.10 for x in ratios) / len(ratios)
        worst = max(ratios, key=lambda x: abs(x - 1))
        print(f"{len(ratios)} cases with a promise: {within5:.1%} within 5 %, {within10:.1%} within 10 %, worst "
              f"long/promise {worst:.3f}; planning {min(times):.1f}-{max(times):.1f} s "
              f"(median {sorted(times)[len(times) // 2]:.1f} s); targets: >= 95 % within 5 %, none beyond 10 %")
    print(f"total {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
