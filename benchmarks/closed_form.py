"""Is the queueing closed form (planner/sustained/queueing.py) close enough to the simulator to rank plans? Over a grid
of cases (promise_grid's: one model alone on HIGH+LOW GPUs at an SLO factor, default costs), every candidate plan
the sustained search weighs (one per SLO margin and planner, and the fills: pool sizes 1-16, batches 1-8, one to
three partitions, slack from none to most of the SLO) is rated by the closed form and by the simulator (the mix as
one, half-length points, to 2 %, on the planner's seed) under the same arrivals. Printed: per case the candidates,
their ratio range and whether the closed form's top pick sustains within 3 % of the best; then over every
candidate, the median ratio, the share within 10 %, and the top picks.

    python -P benchmarks/closed_form.py --quick                      # every model on 4 L4 + 12 T4 at 3x, Poisson
    python -P benchmarks/closed_form.py --pairs V100+P4 --factors 2 --arrivals bursty:2
"""

from __future__ import annotations

import argparse
import statistics
import time
from concurrent.futures import ProcessPoolExecutor

from planner.objectives import sustained_planners
from planner.request import PlanRequest
from planner.sustained.measure_pool import measure_all
from planner.sustained.search import all_candidates
from plans.arrivals import parse_arrivals
from poolpipe.experiment_cases import case_spec, grid_arguments, grid_cases
from poolpipe_common.overheads import DEFAULT_OVERHEADS
from scheduler.sim.sustain import Precision

SIMULATED = Precision(0.02, 0.5, joint=True)  # finer and longer than the screen's quarter-length 3 %
NEAR_BEST = 0.97


def one(case: tuple[str, tuple[str, str], tuple[int, int], float, str]) -> dict:
    """Every candidate plan of one case: (closed form, simulated) req/s, both summed over the plan's models."""
    model, pair, size, factor, arrivals_text = case
    spec = case_spec(model, pair, size, factor)
    request = PlanRequest(arrivals=arrivals_text, jobs=1)
    arrivals, options = parse_arrivals(arrivals_text), request.solver_options()
    planners = sustained_planners(spec, request)
    try:
        cands = all_candidates(spec, planners, options, arrivals, DEFAULT_OVERHEADS)
    except Exception as e:  # noqa: BLE001 - a case no plan fits is reported, not fatal
        return {"case": case, "error": str(e).splitlines()[0][:80]}
    sims = measure_all("simulated", [c.plan for c in cands], arrivals, DEFAULT_OVERHEADS, 1, None,
                       [SIMULATED] * len(cands))
    return {"case": case, "rates": [(sum(c.predicted.values()), sum(s.values())) for c, s in zip(cands, sims)]}


def figures(rates: list[tuple[float, float]]) -> tuple[list[float], float, float]:
    """(closed form / simulated of the plans that hold at least 5 % of the best, what the closed form's top pick
    sustains, the best) of one case's (closed form, simulated) rates."""
    best = max((s for _, s in rates), default=0.0)
    pick = max(rates, key=lambda ps: ps[0])[1] if rates else 0.0
    return [p / s for p, s in rates if s >= 0.05 * best > 0], pick, best  # a plan that holds almost nothing says little


def summary(rows: list[dict]) -> str:
    ratios, picks = [], []
    for r in rows:
        case_ratios, pick, best = figures(r.get("rates") or [])
        if best > 0:
            ratios += case_ratios
            picks.append(pick / best)
    if not ratios:
        return "no case had a candidate that sustains anything"
    return (f"{len(ratios)} candidate plans of {len(picks)} cases: closed form / simulated median "
            f"{statistics.median(ratios):.3f}, {min(ratios):.3f}-{max(ratios):.3f}, within 10 % "
            f"{sum(abs(x - 1) <= 0.1 for x in ratios) / len(ratios):.0%}; the closed form's top pick sustains "
            f"{min(picks):.3f}-{max(picks):.3f} of the best (within 3 % in {sum(x >= NEAR_BEST for x in picks)} of "
            f"{len(picks)} cases)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    grid_arguments(ap)
    ap.add_argument("--arrivals", default="poisson", help="poisson (default) or bursty:CV")
    args = ap.parse_args()
    cases = [(*case, args.arrivals) for case in grid_cases(args)]
    t0 = time.time()
    with ProcessPoolExecutor(args.jobs) as ex:
        rows = list(ex.map(one, cases))
    for r in rows:
        model, pair, size, factor, _ = r["case"]
        where = f"{model[:28]:28s} {size[0]} {pair[0]} + {size[1]} {pair[1]} at {factor:g}x"
        if "error" in r:
            print(f"{where}: {r['error']}")
            continue
        ratios, pick, best = figures(r["rates"])
        ratios = ratios or [0.0]
        print(f"{where}: {len(r['rates'])} candidates, closed form / simulated {min(ratios):.2f}-{max(ratios):.2f}, "
              f"top pick sustains {pick:.1f} of the best {best:.1f} req/s")
    print(f"under {args.arrivals}: {summary(rows)}")
    print(f"total {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
