"""Static plan vs re-planning when the model mix shifts (simulated, the shared driver and the real MILP).

Two of PPipe's measured models (data/ppipe) share a small L4+T4 cluster; the first plan is solved for an
even mix. Arrivals run at ``--load`` of that plan's throughput, then the ratio between the two models steps
(``--ratio-after``) at the same total rate. The static run keeps the first plan; the re-planning run
watches the smoothed rates (scheduler.core.replan_trigger), solves for the new mix, and migrates with
ingest paused for about one SLO while the old plan's in-flight batches flush. Prints SLO attainment per
window and overall for both, the re-planning events, and draws ``--out``/replan.png.

    python -P benchmarks/replan.py                 # ~1-2 min on 2 cores
    python -P benchmarks/replan.py --duration-s 40 --step-s 15
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from planner.solve import solve_spec
from planner.spec import ClusterSpec, ModelSpec, PlanningSpec
from profiling.reference import import_ppipe_profile
from runtime.testbed import REFERENCE_DIR
from scheduler.core.replan_trigger import ReplanConfig
from scheduler.sim.mix_shift import shifting_arrivals, step_change
from scheduler.sim.replan import Migration, ShiftResult, simulate_shifting, spec_planner
from scheduler.sim.workloads import parse_trace

MODELS = ("googlenet-v3-pytorch", "repvgg-b3")


def build_spec(slo_multiplier: float) -> PlanningSpec:
    models = []
    for name in MODELS:
        p = import_ppipe_profile(REFERENCE_DIR, name)
        slo = slo_multiplier * p.latency_us("L4", 1, 1, 0, p.num_blocks)
        models.append(ModelSpec(p, slo, 0.1 * slo))
    cluster = ClusterSpec({"L4": 4, "T4": 12}, {"L4": 4, "T4": 2}, 10.0, {"L4": 2, "T4": 2})
    return PlanningSpec(cluster, tuple(models), max_partitions=2)


def _pct(x: float | None) -> str:
    return "   -  " if x is None else f"{100 * x:6.2f}"


def report(static: ShiftResult, replan: ShiftResult, window_s: float) -> None:
    print(f"SLO attainment per {window_s:g} s window (simulated; % of the requests arriving in the window met)")
    print("window s   static  replan")
    for (t, a), (_, b) in zip(static.windows(window_s), replan.windows(window_s)):
        print(f"{t:8.0f}  {_pct(a)}  {_pct(b)}")
    for name in MODELS:
        print(f"{name}: static {_pct(static.attainment(model=name))}%  replan {_pct(replan.attainment(model=name))}%")
    a, b = static.attainment() or 0.0, replan.attainment() or 0.0
    print(f"overall: static {100 * a:.2f}%  replan {100 * b:.2f}%  (replan/static {b / a if a else float('nan'):.3f})")
    for e in replan.events:
        pause_ms = (e.resumed_us - e.paused_us) / 1e3
        print(f"re-plan decided at {e.decided_us / 1e6:.1f} s ({e.reason}); planner {e.solve_s:.2f} s wall; ingest "
              f"paused {e.paused_us / 1e6:.2f}-{e.resumed_us / 1e6:.2f} s ({pause_ms:.0f} ms); "
              "new throughputs " + ", ".join(f"{m}={r:.0f}" for m, r in e.capacity_rps.items()) + " req/s")


def plot(static: ShiftResult, replan: ShiftResult, window_s: float, step_s: float, path: Path) -> None:
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(8, 3.6))
    for res, label, style in ((static, "static plan", "-"), (replan, "re-planning", "-")):
        pts = [(t + window_s / 2, 100 * a) for t, a in res.windows(window_s) if a is not None]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker="o", ms=3, label=label)
    ax.axvline(step_s, color="grey", ls="--", lw=1, label="mix shifts")
    for e in replan.events:
        ax.axvspan(e.paused_us / 1e6, max(e.resumed_us, e.paused_us + 1) / 1e6, color="red", alpha=0.3)
        ax.axvline(e.decided_us / 1e6, color="red", ls=":", lw=1)
    ax.set_xlabel("time (s)")
    ax.set_ylabel("SLO attainment (%)")
    ax.set_title("Simulated: static plan vs re-planning when the model mix shifts")
    ax.legend(loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration-s", type=float, default=90.0, help="simulated seconds (default 90)")
    ap.add_argument("--step-s", type=float, default=30.0, help="when the mix shifts (default 30 s)")
    ap.add_argument("--load", type=float, default=0.7, help="total rate as a fraction of the first plan's (0.7)")
    ap.add_argument("--ratio-after", default="1:3", help="rate ratio of the two models after the shift (1:3)")
    ap.add_argument("--trace", default="poisson", help="arrival process per phase (scheduler.sim.workloads)")
    ap.add_argument("--window-s", type=float, default=5.0, help="attainment window (default 5 s)")
    ap.add_argument("--cooldown-s", type=float, default=20.0, help="no re-plan this soon after another (20 s)")
    ap.add_argument("--slo-multiplier", type=float, default=5.0, help="SLO = this x the L4 batch-1 latency (5)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("replan-out"), help="directory for replan.png")
    args = ap.parse_args()
    spec = build_spec(args.slo_multiplier)
    first = solve_spec(spec, time_limit_s=30)
    before = {m.name: args.load * m.throughput_rps for m in first.models}
    ratio = dict(zip(MODELS, (float(x) for x in args.ratio_after.split(":"))))
    phases = step_change(before, ratio, args.step_s)
    arrivals = shifting_arrivals(parse_trace(args.trace), phases, args.duration_s, args.seed)
    print(f"first plan: {', '.join(f'{m.name}={m.throughput_rps:.0f}' for m in first.models)} req/s; arrivals "
          + "; ".join(f"from {p.start_s:g} s " + ", ".join(f"{m}={r:.0f}" for m, r in p.rates_rps.items())
                      for p in phases) + f" req/s ({args.trace}, {len(arrivals)} requests)")
    duration_us = args.duration_s * 1e6
    t0 = time.perf_counter()
    static = simulate_shifting(first, arrivals, duration_us, seed=args.seed)
    t1 = time.perf_counter()
    replan = simulate_shifting(first, arrivals, duration_us, seed=args.seed, plan_for=spec_planner(spec),
                               config=ReplanConfig(cooldown_s=args.cooldown_s), migration=Migration())
    t2 = time.perf_counter()
    report(static, replan, args.window_s)
    args.out.mkdir(parents=True, exist_ok=True)
    plot(static, replan, args.window_s, args.step_s, args.out / "replan.png")
    print(f"simulated in {t1 - t0:.1f} s (static) and {t2 - t1:.1f} s (re-planning) wall; "
          f"wrote {args.out / 'replan.png'}")


if __name__ == "__main__":
    main()
