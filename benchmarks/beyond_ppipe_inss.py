"""Co-located vs dedicated placement (InSS, issue 16), in simulation on the PPipe reference profiles.

For small clusters serving three models (InSS's setting: a few GPUs, several models), three plans of the
same spec: dedicated (the default pooled-pipeline MILP: every GPU serves one (model, partition)), co-located
and interference-aware (planner.colocation.colocate), and co-located but blind to interference (gpulet/InSS-ni style).
Each is planned for the rate it sustains (the default objective) and simulated as the sidecar serves it (its
driver's margins, the default per-stage costs) with the interference model applied per batch, at the spec's
workload mix; the sustained throughput is the largest total rate with every model's SLO attainment >= 99%
(bisection on a 0.02 grid).

The reference profiles have no co-run measurements and no weights, so the memory is estimated
(profiling.reference_memory) and the interference coefficients are assumed (ASSUMED below, giving slowdowns
of the order InSS measured: up to about 19% for the heaviest co-runners). Run:
``python -P benchmarks/beyond_ppipe_inss.py`` (about a minute).
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace

from planner.colocation.colocate import plan_colocated
from planner.entry import plan as plan_spec
from planner.ppipe.pooled import solve_pooled
from planner.ppipe.reference_plans import load_reference_plans, spec_from_reference
from planner.request import PlanRequest
from planner.solvers.milp_solvers import SolverOptions
from plans.colocation_costs import plan_slots, slot_slowdowns
from plans.plan_json import Plan
from plans.spec.planning_spec import PlanningSpec
from poolpipe_common.overheads import DEFAULT_OVERHEADS
from profiling.interference import InterferenceModel
from profiling.reference_memory import with_estimated_memory
from scheduler.sim.sweep import TARGET_ATTAINMENT, PointJob, run_point
from workloads.arrivals import TraceSpec

ASSUMED = InterferenceModel(0.02, 2.0, 0.0, 0, 0.0, "assumed for the benchmark (no GPU co-run data)")
SCENARIOS = (  # (models of a maf reference entry, cluster)
    (("apcnet", "atss", "gcnet"), {"L4": 4, "T4": 8}),
    (("colorization", "googlenet", "repvgg"), {"V100": 3, "T4": 6}),
    (("centernet", "convnext", "dnl"), {"L4": 3, "T4": 6}),
)
GRID, LF_MAX, DURATION_S, SEED = 0.02, 2.0, 20.0, 1


def scenario_spec(prefixes: tuple[str, ...], gpus: dict[str, int], opts: SolverOptions) -> PlanningSpec:
    """The reference entry's models, SLOs and mix on a small cluster. The reference batch-forming waits were
    derived from a 100-GPU cluster's rates; here they come from the small cluster's dedicated plan (one
    request's gap at its rate), so no plan counts on batches filling faster than they would."""
    entry = next(e for e in load_reference_plans()
                 if e["planner"] == "ppipe" and set(e["cluster"]["gpu_name_arr"]) == set(gpus)
                 and [m["model"].split("_")[0].split("-")[0] for m in e["models"]] == list(prefixes))
    spec = spec_from_reference(entry)
    models = tuple(replace(m, profile=replace(with_estimated_memory(m.profile),
                                              interference={t: ASSUMED for t in m.profile.timings}))
                   for m in spec.models)
    spec = replace(spec, models=models, cluster=replace(spec.cluster, gpus=dict(gpus)))
    ms, _ = solve_pooled(spec, spec.cluster, spec.max_partitions, opts)
    waits = {mp.model.name: 1e6 / mp.throughput_rps for mp in ms}
    return replace(spec, models=tuple(replace(m, batch_wait_us_per_request=waits[m.name]) for m in spec.models))


def attainment(s: dict) -> tuple[float, float]:
    """(smallest per-model attainment, overall violation rate) of one simulated point."""
    ms = s["models"].values()
    offered = sum(p["offered_rps"] for p in ms)
    met = sum(p["offered_rps"] * p["slo_attainment"] for p in ms)
    return min(p["slo_attainment"] for p in ms), 1.0 - met / offered


def point(plan: Plan, rates: dict[str, float], lf: float) -> dict:
    """One load factor, served as the sidecar serves it (its driver's margins, the default per-stage costs)."""
    return run_point(PointJob(plan, rates, "ppipe", TraceSpec("poisson"), lf, DURATION_S, SEED, driver="live",
                              overheads=DEFAULT_OVERHEADS))[0]


def sustained(plan: Plan, rates: dict[str, float]) -> tuple[float, float]:
    """(largest load factor with every model >= 99%, its violation rate)."""
    lo, hi, viol_lo = 0.0, LF_MAX, 0.0
    while hi - lo > GRID + 1e-9:
        lf = round(round((lo + hi) / 2 / GRID) * GRID, 4)
        lf = lf if lo < lf < hi else round(lo + GRID, 4)
        worst, viol = attainment(point(plan, rates, lf))
        if worst >= TARGET_ATTAINMENT:
            lo, viol_lo = lf, viol
        else:
            hi = lf
    return lo, viol_lo


def main() -> int:
    opts = SolverOptions("highs", 20.0, 1e-3)
    print("InSS-style co-location vs dedicated placement (simulated; PPipe reference profiles, estimated memory, "
          f"assumed interference {ASSUMED.per_corunner}/corunner + {ASSUMED.per_pressure} x pressure)")
    ratios = []
    for prefixes, gpus in SCENARIOS:
        t0 = time.perf_counter()
        spec = scenario_spec(prefixes, gpus, opts)
        request = PlanRequest("ppipe", solver=opts.solver, time_limit_s=opts.time_limit_s, gap=opts.rel_gap)
        plans = {"dedicated": plan_spec(spec, request).plan,
                 "co-located": plan_spec(spec, replace(request, colocate=True)).plan,
                 "co-located, interference-blind": plan_colocated(spec, opts, aware=False)}  # a variant: internals
        base = plans["dedicated"].objective
        rates = {m.name: m.weight * base for m in spec.models}  # the mix at the dedicated plan's throughput
        total = sum(rates.values())
        cluster = " + ".join(f"{n} {t}" for t, n in gpus.items())
        print(f"\n{'/'.join(prefixes)} on {cluster} (SLO attainment target {TARGET_ATTAINMENT:.0%}, "
              f"poisson, {DURATION_S:.0f} s simulated per point)")
        got = {}
        for name, plan in plans.items():
            lf, viol = sustained(plan, rates)
            slow = max(slot_slowdowns(plan_slots(plan)), default=1.0)
            got[name] = lf
            print(f"  {name:31s} planned {plan.objective * sum(m.weight for m in spec.models):7.1f} rps, "
                  f"worst co-run slowdown {slow:.3f}; simulated: sustains {lf * total:7.1f} rps with every model "
                  f">= 99% (violations {viol:.2%})")
        _, blind = attainment(point(plans["co-located, interference-blind"], rates, got["co-located"]))
        print(f"  interference-blind plan at the co-located plan's sustained rate (simulated): violations {blind:.2%}")
        ratio = got["co-located"] / got["dedicated"] if got["dedicated"] else float("nan")
        ratios.append(ratio)
        print(f"  co-located / dedicated sustained throughput (simulated): {ratio:.3f}x  "
              f"[{time.perf_counter() - t0:.0f} s]")
    print(f"\nmean co-located / dedicated (simulated): {sum(ratios) / len(ratios):.3f}x over {len(ratios)} clusters "
          "(InSS reports +28% over gpulet on real GPUs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
