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
import os
import statistics
import time
from concurrent.futures import ProcessPoolExecutor

from benchmarks.promise_grid import PAIRS, case_spec
from planner.objectives import sustained_planners
from planner.request import PlanRequest
from planner.sustained.measure_pool import measure_all
from planner.sustained.search import candidate_plans, filled
from plans.arrivals import parse_arrivals
from poolpipe_common.overheads import DEFAULT_OVERHEADS
from scheduler.sim.sustain import Precision

SIMULATED = Precision(0.02, 0.5, joint=True)  # finer and longer than the screen's quarter-length 3 %
NEAR_BEST = 0.97


def one(case: tuple[str, tuple[str, str], tuple[int, int], float, str]) -> dict:
    """Every candidate plan of one case: (closed form, simulated) req/s, both summed over the plan's models."""
    model, pair, size, factor, arrivals_text = case
    spec = case_spec(model, pair, size, factor)
    request = PlanRequest(arrivals=arrivals_text, jobs=1)
    arrivals = parse_arrivals(arrivals_text)
    try:
        cands = candidate_plans(spec, sustained_planners(spec, request), request.solver_options(), arrivals,
                                DEFAULT_OVERHEADS)
    except Exception as e:  # noqa: BLE001 - a case no plan fits is reported, not fatal
        return {"case": case, "error": str(e).splitlines()[0][:80]}
    cands += filled(spec, cands, sustained_planners(spec, request), request.solver_options(), arrivals,
                    DEFAULT_OVERHEADS)
    sims = measure_all("simulated", [c.plan for c in cands], arrivals, DEFAULT_OVERHEADS, 1, None,
                       [SIMULATED] * len(cands))
    return {"case": case, "rates": [(sum(c.predicted.values()), sum(s.values())) for c, s in zip(cands, sims)]}


def summary(rows: list[dict]) -> str:
    ratios, picks = [], []
    for r in rows:
        rates = r.get("rates") or []
        best = max((s for _, s in rates), default=0.0)
        if best <= 0:
            continue
        ratios += [p / s for p, s in rates if s >= 0.05 * best]  # a plan that holds almost nothing says little
        picks.append(max(rates, key=lambda ps: ps[0])[1] / best)
    if not ratios:
        return "no case had a candidate that sustains anything"
    return (f"{len(ratios)} candidate plans of {len(picks)} cases: closed form / simulated median "
            f"{statistics.median(ratios):.3f}, {min(ratios):.3f}-{max(ratios):.3f}, within 10 % "
            f"{sum(abs(x - 1) <= 0.1 for x in ratios) / len(ratios):.0%}; the closed form's top pick sustains "
            f"{min(picks):.3f}-{max(picks):.3f} of the best (within 3 % in {sum(x >= NEAR_BEST for x in picks)} of "
            f"{len(picks)} cases)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="L4+T4, 4+12 GPUs, SLO 3x, every model")
    ap.add_argument("--models", help="comma list of data/ppipe models (default: all twelve)")
    ap.add_argument("--pairs", help="comma list of HIGH+LOW pairs (default: all four)")
    ap.add_argument("--factors", help="comma list of SLO factors (default: 2,3,4)")
    ap.add_argument("--sizes", help="comma list of HIGH+LOW GPU counts (default: 4+12,8+24)")
    ap.add_argument("--arrivals", default="poisson", help="poisson (default) or bursty:CV")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    from planner.ppipe.reference_plans import load_reference_plans
    models = args.models.split(",") if args.models else sorted({
        m["model"] for e in load_reference_plans() for m in e["models"]})
    pairs = PAIRS[:1] if args.quick else PAIRS
    pairs = tuple(tuple(p.split("+")) for p in args.pairs.split(",")) if args.pairs else pairs
    factors = (3.0,) if args.quick else (2.0, 3.0, 4.0)
    factors = tuple(float(x) for x in args.factors.split(",")) if args.factors else factors
    sizes = ((4, 12),) if args.quick else ((4, 12), (8, 24))
    sizes = tuple(tuple(int(n) for n in s.split("+")) for s in args.sizes.split(",")) if args.sizes else sizes
    cases = [(m, p, s, f, args.arrivals) for m in models for p in pairs for s in sizes for f in factors]
    t0 = time.time()
    with ProcessPoolExecutor(args.jobs) as ex:
        rows = list(ex.map(one, cases))
    for r in rows:
        model, pair, size, factor, _ = r["case"]
        where = f"{model[:28]:28s} {size[0]} {pair[0]} + {size[1]} {pair[1]} at {factor:g}x"
        if "error" in r:
            print(f"{where}: {r['error']}")
            continue
        best = max(s for _, s in r["rates"])
        pick = max(r["rates"], key=lambda ps: ps[0])[1]
        ratios = [p / s for p, s in r["rates"] if s >= 0.05 * best] or [0.0]
        print(f"{where}: {len(r['rates'])} candidates, closed form / simulated {min(ratios):.2f}-{max(ratios):.2f}, "
              f"top pick sustains {pick:.1f} of the best {best:.1f} req/s")
    print(f"under {args.arrivals}: {summary(rows)}")
    print(f"total {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
