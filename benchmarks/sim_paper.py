"""Reproduce the PPipe paper's simulation results with our scheduler core and simulator.

The four `maf19` groups of the reference data on the four 100-GPU clusters (25 high-class + 75
low-class: L4+P4, L4+T4, V100+P4, V100+T4), Poisson and bursty (gamma, CV 4) arrivals, plans from
the ppipe, np and dart-r planners (each solved on the terms of its own reference entry; our
planner's ``planner.plan``, or with --reference the published reference plans),
each served by the reservation policy at load factors relative to the ppipe plan's throughputs;
and on L4+T4 the ppipe plan under `reactive`, `fifs` and `elsa` as well. For every combination we
search, per model, the largest load factor (0.025 grid) that keeps >= 99% attainment, and
average over the models. Printed beside the paper's published numbers (its own simulator, averaged
over six groups that include these four).

    .venv/bin/python benchmarks/sim_paper.py            # full (about 10-20 min on 2 cores)
    .venv/bin/python benchmarks/sim_paper.py --quick    # one group, 5 s per point
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np

from planner.entry import plan as plan_spec
from planner.ppipe.reference_plans import (
    load_reference_plans,
    plan_from_reference,
    spec_from_reference,
)
from planner.request import PlanRequest
from plans.plan_json import Plan
from scheduler.sim.sweep import TARGET_ATTAINMENT, PointJob, run_point
from workloads.arrivals import parse_trace

CLUSTERS = [("L4", "P4"), ("L4", "T4"), ("V100", "P4"), ("V100", "T4")]
PLANNERS = ["ppipe", "np", "dart-r"]
TRACES = ["poisson", "bursty:4"]
PAPER = {"ppipe_poisson": 0.965, "ppipe_bursty": 0.903, "vs_np_poisson": 48.0, "vs_dartr_poisson": 32.2,
         "vs_np_bursty": 75.1, "vs_dartr_bursty": 35.8, "low_util_ppipe": 73.6, "low_util_np": 8.1,
         "l4t4_reservation": 0.92, "l4t4_reactive": 0.71, "probes": 3.58, "dispatch_us": 9.0}
GRID = 0.025
LF_MAX = 1.3


def get_plans(use_reference: bool, objective: str = "throughput") -> tuple[dict, str]:
    """(group, cluster, planner) -> Plan, and a note of which planner produced them."""
    entries = [e for e in load_reference_plans() if e["suite"] == "maf19"]
    groups = sorted({tuple(m["model"] for m in e["models"]) for e in entries})
    plans: dict = {}
    failures = []
    for e in entries:
        g = groups.index(tuple(m["model"] for m in e["models"]))
        c = tuple(e["cluster"]["gpu_name_arr"])
        spec = spec_from_reference(e)
        plan: Plan | None = None
        if not use_reference:
            try:
                plan = plan_spec(spec, PlanRequest(e["planner"], objective=objective, evaluator="none",
                                                        solver="highs", time_limit_s=None)).plan
            except Exception as ex:  # report and fall back: the benchmark must still run
                failures.append(f"{e['planner']} g{g} {'+'.join(c)}: {type(ex).__name__}: {ex}")
        plans[(g, c, e["planner"])] = plan or plan_from_reference(e, spec)
    if use_reference:
        note = "plans: published reference plans (--reference)"
    else:
        note = "plans: our planner (planner.plan, HiGHS)"
        if failures:
            note += f"; fell back to reference plans for {len(failures)}: " + "; ".join(failures[:4])
    return plans, note


@dataclass(frozen=True)
class Combo:
    group: int
    cluster: tuple[str, str]
    trace: str
    planner: str
    policy: str
    plan: Plan
    rates: dict
    duration_s: float
    seed: int


def search(c: Combo) -> dict:
    """Per model, the largest load factor on the grid with attainment >= 99% (assuming monotone),
    sharing simulations between models: bisect the model whose bracket is widest."""
    lo = {m: 0.0 for m in c.rates}
    hi = {m: LF_MAX + GRID for m in c.rates}
    seen: dict[float, dict] = {}
    probes = dispatches = 0
    disp_us: list[float] = []
    while True:
        open_ = [m for m in c.rates if hi[m] - lo[m] > GRID + 1e-9]
        if not open_:
            break
        m = max(open_, key=lambda x: hi[x] - lo[x])
        lf = round(round((lo[m] + hi[m]) / 2 / GRID) * GRID, 4)
        if lf <= lo[m] or lf >= hi[m]:
            lf = round(lo[m] + GRID, 4)
        s, _ = run_point(PointJob(c.plan, c.rates, c.policy, parse_trace(c.trace), lf, c.duration_s, c.seed))
        seen[lf] = s
        probes += s["probe_calls"]
        dispatches += s["dispatches"]
        disp_us.extend(s["dispatch_us"][:: max(1, len(s["dispatch_us"]) // 2000)])
        for name, p in s["models"].items():
            if p["slo_attainment"] >= TARGET_ATTAINMENT:
                lo[name] = max(lo[name], lf)
            else:
                hi[name] = min(hi[name], lf)
    best = {m: lo[m] for m in c.rates}
    mean_lf = float(np.mean(list(best.values())))
    bound = None
    if c.policy == "ppipe":  # what no policy could sustain on these arrivals (fluid relaxation of the plan)
        from scheduler.sim.bound import max_load_factor_bound
        from scheduler.sim.placement import topology_from_plan
        b = max_load_factor_bound(topology_from_plan(c.plan), parse_trace(c.trace), c.rates, c.duration_s, c.seed,
                                  GRID, LF_MAX, TARGET_ATTAINMENT)
        bound = float(np.mean(list(b.values())))
    low = c.cluster[1]
    passing = [lf for lf, s in seen.items()
               if all(p["slo_attainment"] >= TARGET_ATTAINMENT for p in s["models"].values())]
    util = seen[max(passing)]["utilization"].get(low, 0.0) if passing else 0.0
    return {"group": c.group, "cluster": c.cluster, "trace": c.trace, "planner": c.planner, "policy": c.policy,
            "max_lf": mean_lf, "bound_lf": bound, "per_model": best, "low_util": util, "points": len(seen),
            "probes": probes, "dispatches": dispatches, "dispatch_us": disp_us}


def sweep_timing(plans: dict, duration_s: float) -> float:
    """Wall time of a 14-point, 30 s sweep of one group on one cluster (the issue's speed criterion)."""
    from scheduler.sim.sweep import reference_rates, sweep

    plan = plans[(0, ("L4", "T4"), "ppipe")]
    t0 = time.perf_counter()
    lfs = [round(0.35 + 0.05 * i, 2) for i in range(14)]
    sweep(plan, plan, "ppipe", parse_trace("poisson"), lfs, duration_s, 0, jobs=os.cpu_count())
    reference_rates(plan, plan)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one group, 5 s per point, no sweep timing")
    ap.add_argument("--groups", default=None, help="comma list of group indices (default all 4)")
    ap.add_argument("--duration-s", type=float, default=None, help="simulated seconds per point (default 10, quick 5)")
    ap.add_argument("--reference", action="store_true", help="use the published plans instead of planning them")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--objective", default="throughput", choices=("throughput", "sustained"),
                    help="how our planner plans: throughput, PPipe's nominal objective, as the paper (default); "
                         "sustained: the rate held at 99%% (load factors stay relative to each plan's throughput)")
    args = ap.parse_args()
    duration = args.duration_s or (5.0 if args.quick else 10.0)
    groups = [int(x) for x in args.groups.split(",")] if args.groups else ([0] if args.quick else [0, 1, 2, 3])

    t_start = time.perf_counter()
    plans, note = get_plans(args.reference, args.objective)
    print(note)
    if not args.quick:
        t = sweep_timing(plans, 30.0)
        print(f"14-point sweep (30 s simulated per point, group 0, L4+T4, ppipe, poisson): {t:.1f} s wall "
              f"(criterion: < 300 s)")
    combos = []
    for g in groups:
        for c in CLUSTERS:
            ref = plans[(g, c, "ppipe")]
            rates = {m.name: m.throughput_rps for m in ref.models}
            for tr in TRACES:
                for pl in PLANNERS:
                    combos.append(Combo(g, c, tr, pl, "ppipe", plans[(g, c, pl)], rates, duration, args.seed))
                if c == ("L4", "T4"):
                    for pol in ("reactive", "fifs", "elsa"):
                        combos.append(Combo(g, c, tr, "ppipe", pol, ref, rates, duration, args.seed))
    print(f"{len(combos)} searches ({len(groups)} group(s) x 4 clusters x 2 traces x 3 planners + policies on L4+T4), "
          f"{duration:g} s simulated per point, {args.jobs} processes")
    with ProcessPoolExecutor(args.jobs) as ex:
        results = list(ex.map(search, combos))

    def res(**kw) -> list[dict]:
        return [r for r in results if all(r[k] == v for k, v in kw.items())]

    print("\nmax load factor (mean over the group's models; 1.0 = ppipe plan's throughput) at 99% SLO")
    print(f"{'group':>5} {'cluster':>8} {'trace':>9} | {'ppipe':>6} {'np':>6} {'dart-r':>6} | "
          f"{'ppipe/np':>8} {'ppipe/dart-r':>12} | {'low util ppipe':>14} {'np':>6}")
    for g in groups:
        for c in CLUSTERS:
            for tr in TRACES:
                row = {pl: res(group=g, cluster=c, trace=tr, planner=pl, policy="ppipe")[0] for pl in PLANNERS}
                a, b, d = row["ppipe"]["max_lf"], row["np"]["max_lf"], row["dart-r"]["max_lf"]
                print(f"{g:>5} {'+'.join(c):>8} {tr:>9} | {a:6.3f} {b:6.3f} {d:6.3f} | "
                      f"{a / b if b else float('inf'):8.2f} {a / d if d else float('inf'):12.2f} | "
                      f"{100 * row['ppipe']['low_util']:13.1f}% {100 * row['np']['low_util']:5.1f}%")

    def mean(xs: list[float]) -> float:
        return float(np.mean(xs)) if xs else float("nan")

    print("\nsummary (ours | paper). Note: the paper's 'bursty' is the MAF21 invocation trace (its artifact "
          "labels MAF21 'Bursty'); bursty:4 here is gamma CV 4 per request, a harsher synthetic stand-in "
          "(the MAF21 file is not in this repository): compare it with the fluid bound, not with 0.903")
    for tr, key in (("poisson", "poisson"), ("bursty:4", "bursty")):
        pp = [r["max_lf"] for r in res(trace=tr, planner="ppipe", policy="ppipe")]
        npl = [r["max_lf"] for r in res(trace=tr, planner="np", policy="ppipe")]
        dr = [r["max_lf"] for r in res(trace=tr, planner="dart-r", policy="ppipe")]
        gain_np = 100 * (mean(pp) / mean(npl) - 1)
        gain_dr = 100 * (mean(pp) / mean(dr) - 1)
        print(f"  {key:8} ppipe sustains {mean(pp):.3f} of planned load | {PAPER['ppipe_' + key]:.3f}")
        print(f"  {key:8} ppipe vs np      {gain_np:+6.1f}%              | {PAPER['vs_np_' + key]:+6.1f}%")
        print(f"  {key:8} ppipe vs dart-r  {gain_dr:+6.1f}%              | {PAPER['vs_dartr_' + key]:+6.1f}%")
        bnd = [r["bound_lf"] for r in res(trace=tr, planner="ppipe", policy="ppipe")]
        print(f"  {key:8} fluid upper bound on the ppipe plan (no policy can exceed): {mean(bnd):.3f} of planned load")
    lu_pp = mean([r["low_util"] for r in res(trace="poisson", planner="ppipe", policy="ppipe")])
    lu_np = mean([r["low_util"] for r in res(trace="poisson", planner="np", policy="ppipe")])
    print(f"  low-class GPU busy (Poisson, at max load): ppipe {100 * lu_pp:.1f}%, np {100 * lu_np:.1f}% | "
          f"{PAPER['low_util_ppipe']:.1f}%, {PAPER['low_util_np']:.1f}%")
    for tr in TRACES:
        line = ", ".join(
            f"{pol} {mean([r['max_lf'] for r in res(cluster=('L4', 'T4'), trace=tr, planner='ppipe', policy=pol)]):.3f}"
            for pol in ("ppipe", "reactive", "fifs", "elsa"))
        print(f"  L4+T4 ppipe plan, {tr}: {line} | "
              f"reservation {PAPER['l4t4_reservation']}, reactive {PAPER['l4t4_reactive']}")
    rp = res(policy="ppipe")
    probes = sum(r["probes"] for r in rp) / max(1, sum(r["dispatches"] for r in rp))
    us = float(np.percentile([x for r in rp for x in r["dispatch_us"]], 50))
    big = [x for r in rp if r["planner"] == "ppipe" for x in r["dispatch_us"]]
    print(f"  probe() calls per dispatch {probes:.2f} | {PAPER['probes']}")
    print(f"  dispatch decision p50 {us:.1f} us (ppipe plans: {float(np.percentile(big, 50)):.1f} us; "
          f"~100 vGPUs, CPython) | < {PAPER['dispatch_us']:.0f} us (paper's implementation)")
    print(f"\ntotal wall time {time.perf_counter() - t_start:.0f} s; "
          f"{sum(r['points'] for r in results)} simulated points")
    return 0


if __name__ == "__main__":
    sys.exit(main())
