"""PARIS heterogeneous vGPU sizing vs the best single size (and the whole GPU), in simulation on our profiles.

PARIS/ELSA's setting (Sec. V) on the PPipe reference profiles: one model on L4 GPUs that MPS may split as
[25, 25, 25, 25], [50, 50], [25, 25, 50] or [100] percent (timings of each share derived from the measured
MPS levels, planner.sizing.size_profiles). Queries arrive as a Poisson process, each with a log-normal number of
inputs (1..8, the largest batch profiled), every input a request of its own arriving with its query; the
SLO is 1.5x the latency of the largest batch on the whole GPU, as the paper's default. "PARIS" sizes from that
query-size distribution as the batch-size PDF (as in the paper); "PARIS-log" from the simulator's batch log
of the whole-GPU plan at its best rate (the batches the scheduler actually formed). Every configuration is served by the
same simulator and ELSA policy (scheduler.core); for each, the highest query rate that keeps >= 99 % of
requests within the SLO is found by bisection. "PARIS mix" is the paper's sizing as it is; "PARIS" is what
``plan --paris`` plans: the mix, or one size alone where PARIS's own capacity model rates that higher.

    python -P benchmarks/beyond_ppipe_paris.py [--quick]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from planner.sizing.paris import paris_plan, single_size_plan
from planner.solvers.milp_solvers import SolverOptions
from plans.plan_json import Plan
from plans.spec.planning_spec import spec_from_dict
from profiling.reference import REFERENCE_DIR, import_ppipe_profile
from scheduler.core import make_scheduler
from scheduler.core.driver import DriverConfig
from scheduler.sim.engine import simulate
from scheduler.sim.placement import topology_from_plan

MODELS = ("googlenet-v3-pytorch", "repvgg-b3")
GPUS = 4
SPLITS = [[25, 25, 25, 25], [50, 50], [25, 25, 50], [100]]
MAX_BATCH = 8
SIZE_MU, SIZE_SIGMA = 0.8, 0.8  # log-normal query size before rounding and clipping to 1..MAX_BATCH
TARGET = 0.99
POLICY = "elsa"


def query_pdf(n: int = 200_000) -> dict[int, float]:
    sizes = np.clip(np.round(np.random.default_rng(1).lognormal(SIZE_MU, SIZE_SIGMA, n)), 1, MAX_BATCH).astype(int)
    return {int(b): float(np.mean(sizes == b)) for b in range(1, MAX_BATCH + 1) if np.any(sizes == b)}


def spec_for(model: str):
    prof = import_ppipe_profile(REFERENCE_DIR, model)
    slo = 1.5 * prof.latency_us("L4", 1, MAX_BATCH)
    return spec_from_dict({"cluster": {"gpus": {"L4": GPUS}, "bandwidth_gbps": 10,
                                       "vgpu_sizes": {"L4": {"mps_percent": SPLITS}}},
                           "models": [{"profile": prof.to_dict(), "slo_us": slo}]})


def arrivals(model: str, pdf: dict[int, float], query_rate: float, duration_s: float, seed: int):
    rng = np.random.default_rng(seed)
    n = rng.poisson(query_rate * duration_s)
    times = np.sort(rng.uniform(0, duration_s * 1e6, n))
    sizes = rng.choice(list(pdf), size=n, p=list(pdf.values()))
    return [(float(t), model) for t, k in zip(times, sizes) for _ in range(int(k))]


def run(plan: Plan, pdf: dict[int, float], query_rate: float, duration_s: float, seed: int):
    topo = topology_from_plan(plan)
    model = plan.models[0].name
    return simulate(topo, make_scheduler(POLICY, topo), arrivals(model, pdf, query_rate, duration_s, seed),
                    duration_s * 1e6, seed=seed, driver=DriverConfig.ideal())


def attainment(plan: Plan, pdf: dict[int, float], query_rate: float, duration_s: float, seed: int) -> float:
    return run(plan, pdf, query_rate, duration_s, seed).models[plan.models[0].name].attainment


def max_rate(plan: Plan, pdf: dict[int, float], hi: float, duration_s: float, seed: int, steps: int) -> float:
    """Highest query rate (bisection in [0, hi]) with attainment >= TARGET."""
    lo = 0.0
    while attainment(plan, pdf, hi, duration_s, seed) >= TARGET:
        lo, hi = hi, hi * 2
    for _ in range(steps):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if attainment(plan, pdf, mid, duration_s, seed) >= TARGET else (lo, mid)
    return lo


def describe(plan: Plan) -> str:
    return " + ".join(f"{p.partitions[0].num_vgpus} x {p.partitions[0].size} (batch <= {p.batch})"
                      for p in plan.models[0].pipelines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="5 simulated seconds per point instead of 15")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    duration, steps = (5.0, 5) if args.quick else (15.0, 6)
    pdf = query_pdf()
    mean = sum(b * p for b, p in pdf.items())
    print(f"PARIS vs single vGPU sizes: {GPUS} x L4, MPS splits {SPLITS}, query size log-normal 1..{MAX_BATCH} "
          f"(mean {mean:.2f}), SLO 1.5x batch-{MAX_BATCH} latency on a whole L4, policy {POLICY}, "
          f"{duration:.0f} s simulated per point, >= {TARGET:.0%} of requests within the SLO")
    for model in MODELS:
        t0 = time.perf_counter()
        spec = spec_for(model)
        paris, sizing = paris_plan(spec, pdf, SolverOptions("highs", 30.0))
        mix, _ = paris_plan(spec, pdf, SolverOptions("highs", 30.0), mix_only=True)
        configs = {"PARIS": paris, "PARIS mix": mix}
        configs.update({f"all {c.label}": single_size_plan(spec, c.label) for c in sizing.curves})
        # PARIS from the batch log: the batches the scheduler formed on whole GPUs at their best rate
        rate = max_rate(configs["all 100%"], pdf, sizing.batch_rate * 0.5, duration, args.seed, steps)
        log = run(configs["all 100%"], pdf, rate, duration, args.seed).batch_sizes
        configs["PARIS-log"], _ = paris_plan(spec, {int(b): float(n) for b, n in log.items()},
                                             SolverOptions("highs", 30.0))
        print(f"\n{model} (SLO {spec.models[0].slo_us / 1e3:.1f} ms; per-size timings "
              f"{', '.join(sorted(set(paris.models[0].profile.provenance['vgpu_sizes'].values())))})")
        for line in sizing.lines():
            print("  " + line)
        guess = sizing.batch_rate * 0.5
        best = {name: max_rate(plan, pdf, guess, duration, args.seed, steps) for name, plan in configs.items()}
        for name, plan in configs.items():
            print(f"  {name:>10}: {best[name]:8.1f} queries/s  ({describe(plan)})  [simulated]")
        singles = {k: v for k, v in best.items() if not k.startswith("PARIS")}
        top = max(singles, key=singles.get)
        whole = best.get("all 100%", 0.0)
        r_best = f"{best['PARIS'] / singles[top]:.2f}x" if singles[top] else "n/a"
        r_whole = f"{best['PARIS'] / whole:.2f}x" if whole else "n/a"
        r_log = f"{best['PARIS-log'] / singles[top]:.2f}x" if singles[top] else "n/a"
        r_mix = f"{best['PARIS mix'] / singles[top]:.2f}x" if singles[top] else "n/a"
        print(f"  PARIS (plan --paris) / best single size ({top}): {r_best}; PARIS / whole GPU: {r_whole}; "
              f"PARIS mix (the paper's sizing as it is) / best single size: {r_mix}; "
              f"PARIS-log / best single size: {r_log} (simulated, {time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
