"""Variable-latency serving in the simulator: Orloj's synthetic two-mode setup (its Table 3, two-modal rows).

One model on one worker (a vGPU), each request short or (half of them) four times longer, each mode normal
with 10 % spread; a batch is padded to its longest request and costs (1 + 0.15 (k - 1)) times it. SLO at 1.5x,
3x and 5x the P99 of a request's solo latency; Azure-like bursty arrivals (the Azure LLM conversation trace
replayed at a mean rate that loads the worker as the paper's scaled Azure trace does). Policies:

- ``orloj``: distribution-aware batching (scheduler/core/policies/orloj.py);
- ``ppipe``: reservations on the profile's median (the project's default);
- ``clockwork-like``: the same reservations on a fixed estimate, the P99 of each batch size's latency;
- ``nexus-like``: the same on the mean of each batch size's latency;
- ``fifs``: first idle worker, the largest batch at hand, no deadlines (Clipper-like);
- ``elsa``: slack-aware dispatch on the median (alpha = beta = 1).

Prints the finish rate (requests that finish within their SLO / all requests) per policy and SLO beside the
paper's Table 3 (two-modal), the ordering at each SLO, and Orloj's margin at 3x P99. Then the cost of a
decision as the queue grows (insertion per request, one batch decision), orloj beside fifs.

    python -P benchmarks/variable_latency.py            # 120 simulated s per point (about 1 min)
    python -P benchmarks/variable_latency.py --quick    # 30 s per point
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from profiling.latency_quantiles import two_mode_multipliers
from scheduler.core import make_scheduler
from scheduler.core.api import RequestRow
from scheduler.core.driver import DriverConfig
from scheduler.core.latency_dist import QuantileDist
from scheduler.core.topology import Pipeline, Stage, Topology, VGpu
from scheduler.sim.engine import simulate
from workloads.arrivals import mixed_arrivals

MODEL = "bart"
P99_US = 100_000.0  # P99 of a request's solo latency (the distribution is scale-free)
BATCHES = (1, 2, 4, 8, 16)
GAMMA = 0.15  # a batch of k costs (1 + GAMMA (k - 1)) x its longest request
LOADS = (0.7, 0.85, 1.0)  # offered rate / the worker's peak throughput (its best batch size at its mean latency)
SLOS = (1.5, 3.0, 5.0)
POLICIES = ("orloj", "clockwork-like", "nexus-like", "ppipe", "elsa", "fifs")
# Orloj's Table 3, two-modal: finish rate at 1.5x, 3x, 5x P99
PAPER = {"Orloj": (0.60, 0.97, 1.00), "Clockwork": (0.45, 0.51, 0.55), "Nexus": (0.03, 0.14, 0.44),
         "Clipper": (0.01, 0.13, 0.37)}
LEVELS = tuple(float(x) for x in np.concatenate((np.linspace(0, 0.98, 50), [0.99, 0.995, 0.999, 1.0])))


def batch_dists() -> dict[int, QuantileDist]:
    """Latency of a batch of k alike requests, per batch size (the profiled distribution)."""
    mult = two_mode_multipliers(LEVELS, long_share=0.5, ratio=4.0, cv=0.1)
    solo = mult * P99_US / float(np.interp(0.99, LEVELS, mult))
    return {b: QuantileDist.from_arrays(np.asarray(LEVELS), solo * (1 + GAMMA * (b - 1))) for b in BATCHES}


def topology(slo_x: float, estimate: str = "median") -> Topology:
    """One worker; the stage's latency table is the estimate a policy plans with, its distribution the truth."""
    dists = batch_dists()
    est = {"median": lambda b, d: float(d.quantile(0.5)),
           "p99": lambda b, d: float(d.order_statistic(b).quantile(0.99)),
           "mean": lambda b, d: d.order_statistic(b).mean}[estimate]
    stage = Stage((0, 1), ("gpu0:0",), {b: est(b, d) for b, d in dists.items()}, 0, dists)
    pipe = Pipeline(f"{MODEL}/0", MODEL, BATCHES[-1], (stage,), 0.0)
    return Topology({"gpu0:0": VGpu("gpu0:0", "V100", 1, "srv0")}, {MODEL: (pipe,)}, {MODEL: slo_x * P99_US}, 10.0)


def peak_rps() -> float:
    """Requests per second the worker serves at its best batch size (mixed batches, mean latency)."""
    return max(b / (d.order_statistic(b).mean / 1e6) for b, d in batch_dists().items())


def finish_rate(policy: str, slo_x: float, duration_s: float, seed: int, load: float, **opts: float) -> float:
    estimate = {"clockwork-like": "p99", "nexus-like": "mean"}.get(policy, "median")
    topo = topology(slo_x, estimate)
    name = {"clockwork-like": "ppipe", "nexus-like": "ppipe"}.get(policy, policy)
    arrivals = mixed_arrivals("replay:azure-conv", {MODEL: load * peak_rps()}, duration_s, seed)
    res = simulate(topo, make_scheduler(name, topo, **opts), arrivals, duration_s * 1e6, seed=seed,
                   driver=DriverConfig.ideal())
    return res.models[MODEL].attainment


def decision_cost(policy: str, n: int, decisions: int = 20) -> tuple[float, float]:
    """(µs per enqueue, median µs per batch decision) with ``n`` requests queued (deadlines spread over 5 SLOs);
    after each decision the batch is reported done, so the next step decides again."""
    topo = topology(3.0)
    rng = np.random.default_rng(n)
    s = make_scheduler(policy, topo)
    arr = np.sort(rng.uniform(0, 5 * 3 * P99_US, n + BATCHES[-1] * decisions))
    reqs = [RequestRow(i, MODEL, float(a), float(a) + 3 * P99_US) for i, a in enumerate(arr)]
    t0 = time.perf_counter()
    for r in reqs:
        s.enqueue(r)
    insert = (time.perf_counter() - t0) / len(reqs) * 1e6
    now = float(arr[0])  # every request still feasible: decisions alone, no drops
    dec = []
    for _ in range(decisions):
        t0 = time.perf_counter()
        res = s.step(now)
        dec.append((time.perf_counter() - t0) * 1e6)
        for d in res.dispatches:
            for a in d.stages:
                s.report(d.id, a.stage, now, now + 1.0)
        now += 1.0
    return insert, float(np.median(dec))


def report_load(load: float, duration: float, seed: int) -> None:
    rates = {p: [finish_rate(p, x, duration, seed, load) for x in SLOS] for p in POLICIES}
    print(f"\nload {load} ({load * peak_rps():.1f} rps): finish rate (simulated)")
    print(f"  {'policy':<22}  " + "  ".join(f"{x:>5}x" for x in SLOS))
    for p in POLICIES:
        print(f"  {p:<22}  " + "  ".join(f"{r:6.2f}" for r in rates[p]))
    print("  paper, Table 3 two-modal")
    for p, row in PAPER.items():
        print(f"  {p:<22}  " + "  ".join(f"{r:6.2f}" for r in row))
    for i, x in enumerate(SLOS):
        ours = " > ".join(sorted(POLICIES, key=lambda p: -rates[p][i]))
        paper = " > ".join(sorted(PAPER, key=lambda p: -PAPER[p][i]))
        print(f"  ordering at {x}x P99: ours {ours}; paper {paper}")
    k = SLOS.index(3.0)
    paper_margin = PAPER["Orloj"][k] - PAPER["Clockwork"][k]
    for base in ("ppipe", "fifs"):
        m = rates["orloj"][k] - rates[base][k]
        verdict = "meets" if m >= paper_margin else "falls short of"
        print(f"  orloj over {base} at 3x P99: {m:+.2f} ({rates['orloj'][k]:.2f} vs {rates[base][k]:.2f}); "
              f"{verdict} the paper's margin over its best baseline (Clockwork) {paper_margin:+.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="30 simulated seconds per point instead of 120")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--load", type=float, action="append",
                    help="offered rate as a fraction of the worker's peak throughput (repeatable; default "
                         f"{', '.join(map(str, LOADS))})")
    args = ap.parse_args()
    duration = 30.0 if args.quick else 120.0
    d1 = batch_dists()[1]
    print(f"two-mode solo latency: mean {d1.mean / 1e3:.1f} ms, median {float(d1.quantile(0.5)) / 1e3:.1f} ms, "
          f"P99 {float(d1.quantile(0.99)) / 1e3:.1f} ms; worker peak {peak_rps():.1f} rps; arrivals replay:azure-conv; "
          f"{duration:.0f} s simulated per point")
    for load in args.load or LOADS:
        report_load(load, duration, args.seed)
    sweep = [(b, finish_rate("orloj", 3.0, duration, args.seed, 0.85, b_per_ms=b)) for b in (1e-6, 1e-4, 1e-2, 1e-1)]
    print("\norloj's anticipation factor b (per ms) at load 0.85, 3x P99 (the paper: insensitive, its Fig. 11): "
          + ", ".join(f"b={b:g}: {r:.2f}" for b, r in sweep))
    print("\ncost of a decision as the queue grows (wall time on this machine)")
    print(f"  {'queued':>7}  {'orloj insert us':>15}  {'fifs insert us':>14}  {'orloj decide us':>15}  "
          f"{'fifs decide us':>14}  {'decide ratio':>12}")
    for n in (10, 100, 1000, 10000):
        oi, od = decision_cost("orloj", n)
        fi, fd = decision_cost("fifs", n)
        print(f"  {n:>7}  {oi:>15.2f}  {fi:>14.2f}  {od:>15.1f}  {fd:>14.1f}  {od / fd:>11.1f}x")


if __name__ == "__main__":
    main()
