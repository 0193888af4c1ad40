"""Static plan vs re-planning when the model mix shifts (simulated, the shared driver and the real MILP).

Two of PPipe's measured models (data/ppipe) share a small L4+T4 cluster; the first plan is solved for an
even mix. Arrivals run at ``--load`` of that plan's throughput, then the ratio between the two models steps
(``--ratio-after``) at the same total rate. The static run keeps the first plan; the re-planning run
watches the smoothed rates (scheduler.core.replan_trigger), solves for the new mix, and migrates with
ingest paused for about one SLO while the old plan's in-flight batches flush. Prints SLO attainment per
window and overall for both, the re-planning events, and draws ``--out``/replan.png. Then, live (emulated
devices): the same open-loop load through a sidecar without reloads and with a reload between two deployments
every ``--reload-every-s``; prints attainment of both and the measured dispatch pause per reload. Then the servers
themselves migrate under the same load (``runtime.migration.begin_migration``: grow to two GPUs per class and back
twice), each step timed.

    python -P benchmarks/replan.py                 # ~1-2 min on 2 cores (--no-live: the simulation only)
    python -P benchmarks/replan.py --duration-s 40 --step-s 15
"""

from __future__ import annotations

import argparse
import json
import time
import urllib.request
from pathlib import Path

from planner.entry import plan, spec_planner
from planner.request import PlanRequest
from plans.spec.planning_spec import ClusterSpec, ModelSpec, PlanningSpec
from profiling.reference import import_ppipe_profile
from runtime.testbed import REFERENCE_DIR
from scheduler.core.replan_trigger import ReplanConfig
from scheduler.sim.mix_shift import shifting_arrivals, step_change
from scheduler.sim.replan import Migration, ShiftResult, simulate_shifting
from workloads.arrivals import parse_trace

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
    for i, e in enumerate(replan.events):
        ax.axvline(e.decided_us / 1e6, color="red", ls=":", lw=1, label=None if i else "re-plan decided")
        ax.axvspan(e.paused_us / 1e6, max(e.resumed_us, e.paused_us + 1e5) / 1e6, color="red", alpha=0.3,
                   label=None if i else "ingest paused (migration)")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("SLO attainment (%)")
    ax.set_title("Simulated: static plan vs re-planning when the model mix shifts")
    ax.legend(loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _post_reload(http_url: str, manifest: Path) -> dict:
    req = urllib.request.Request(f"http://{http_url}/v2/poolpipe/reload", method="POST",
                                 data=json.dumps({"manifest": str(manifest)}).encode())
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def live(work: Path, rate: float, duration_s: float, every_s: float) -> None:
    """Two emulated deployments of PPipe's googlenet (A: the hop over gRPC, B: through shared memory) behind one
    sidecar; the same open-loop load without reloads, then with a reload A <-> B every ``every_s``."""
    import threading  # noqa: PLC0415

    import numpy as np  # noqa: PLC0415

    from loadtest.open_loop import open_loop  # noqa: PLC0415
    from runtime.launch import Deployment  # noqa: PLC0415
    from runtime.sidecar_process import SidecarProcess  # noqa: PLC0415
    from runtime.testbed import EMULATED_MODEL, build_emulated_deployment  # noqa: PLC0415

    slo_ms = 1000.0
    dir_a = build_emulated_deployment(work / "a")
    with Deployment(dir_a, check_hardware=False, log_dir=work / "logs-a"):
        dir_b = build_emulated_deployment(work / "b", addresses=("127.0.0.1", "127.0.0.1"))
        with Deployment(dir_b, check_hardware=False, log_dir=work / "logs-b"), \
                SidecarProcess(manifest=dir_a, log_path=work / "sidecar.log") as sc:
            sc.wait_ready()  # calibrated
            arrivals = np.sort(np.random.default_rng(1).uniform(0, duration_s, int(rate * duration_s)))
            base = open_loop([sc.grpc_url], EMULATED_MODEL, arrivals, slo_ms)
            reports: list[dict] = []
            done = threading.Event()

            def reloads() -> None:
                k = 0
                while not done.wait(every_s):
                    k += 1
                    reports.append(_post_reload(sc.http_url, dir_b if k % 2 else dir_a))
            t = threading.Thread(target=reloads)
            t.start()
            swapped = open_loop([sc.grpc_url], EMULATED_MODEL, arrivals, slo_ms)
            done.set()
            t.join()
    print(f"live (emulated googlenet, {rate:g} req/s open loop for {duration_s:g} s, SLO {slo_ms:.0f} ms):")
    for name, r in (("no reload", base), (f"{len(reports)} reloads", swapped)):
        why = f" (first error: {r.first_error})" if r.errors else ""
        print(f"  {name:>10}: offered {r.offered}, met {r.met}, late {r.late}, errors {r.errors}, attainment "
              f"{100 * r.attainment:.2f}%, p99 {r.latency_ms(99) or 0:.1f} ms{why}")
    if reports:
        pauses = sorted(x["pause_ms"] for x in reports)
        flushes = sorted(x["flush_ms"] for x in reports)
        print(f"  dispatch pause per reload: min {pauses[0]:.2f} ms, median {pauses[len(pauses) // 2]:.2f} ms, "
              f"max {pauses[-1]:.2f} ms; old plan flushed within max {flushes[-1]:.1f} ms; "
              f"queued rows handed over {sum(x['handed_over'] for x in reports)}; attainment with/without reloads "
              f"{swapped.attainment / base.attainment if base.attainment else float('nan'):.3f}")


def live_migration(work: Path, rate: float, duration_s: float) -> None:
    """The same load through the sidecar while ``runtime.migration.begin_migration`` grows the emulated googlenet
    deployment from one GPU per class to two (generated with ``previous``: the GPU-0 servers are kept and get the
    new partitions) and back; each migration's steps are timed (start + load, the sidecar's pause, unload + stop)."""
    import threading  # noqa: PLC0415

    import numpy as np  # noqa: PLC0415

    from loadtest.open_loop import open_loop  # noqa: PLC0415
    from runtime.launch import Deployment  # noqa: PLC0415
    from runtime.migration import begin_migration  # noqa: PLC0415
    from runtime.sidecar_process import SidecarProcess  # noqa: PLC0415
    from runtime.testbed import EMULATED_MODEL, build_emulated_deployment  # noqa: PLC0415

    slo_ms = 1000.0
    dir_a = build_emulated_deployment(work / "a")
    rows: list[str] = []
    with Deployment(dir_a, check_hardware=False, log_dir=work / "logs") as dep, \
            SidecarProcess(manifest=dir_a, log_path=work / "sidecar.log") as sc:
        sc.wait_ready()  # calibrated

        def migrate() -> None:
            prev = dir_a
            for k, gpus in enumerate((2, 1, 2, 1), start=1):
                time.sleep(duration_s / 5)
                nxt = build_emulated_deployment(work / f"gen-{k}", gpus=gpus, previous=prev)
                t0 = time.perf_counter()
                m = begin_migration(dep, nxt)
                t1 = time.perf_counter()
                report = _post_reload(sc.http_url, nxt)
                t2 = time.perf_counter()
                done = m.finish()
                t3 = time.perf_counter()
                rows.append(f"  gen {k} ({gpus} GPU(s) per class): {m.steps.summary()}; start + load "
                            f"{t1 - t0:.2f} s, reload {t2 - t1:.2f} s (dispatch pause {report['pause_ms']:.1f} ms), "
                            f"unload + stop {t3 - t2:.2f} s; {done.line()}")
                prev = nxt
        arrivals = np.sort(np.random.default_rng(2).uniform(0, duration_s, int(rate * duration_s)))
        t = threading.Thread(target=migrate)
        t.start()
        r = open_loop([sc.grpc_url], EMULATED_MODEL, arrivals, slo_ms)
        t.join()
    why = f" (first error: {r.first_error})" if r.errors else ""
    print(f"live migrations (emulated googlenet, {rate:g} req/s open loop for {duration_s:g} s, SLO {slo_ms:.0f} ms): "
          f"offered {r.offered}, met {r.met}, late {r.late}, errors {r.errors}, attainment {100 * r.attainment:.2f}%, "
          f"p99 {r.latency_ms(99) or 0:.1f} ms{why}")
    print("\n".join(rows))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration-s", type=float, default=90.0, help="simulated seconds (default 90)")
    ap.add_argument("--step-s", type=float, default=30.0, help="when the mix shifts (default 30 s)")
    ap.add_argument("--load", type=float, default=0.7, help="total rate as a fraction of the first plan's (0.7)")
    ap.add_argument("--ratio-after", default="1:3", help="rate ratio of the two models after the shift (1:3)")
    ap.add_argument("--trace", default="poisson", help="arrival process per phase (workloads.arrivals)")
    ap.add_argument("--window-s", type=float, default=5.0, help="attainment window (default 5 s)")
    ap.add_argument("--cooldown-s", type=float, default=20.0, help="no re-plan this soon after another (20 s)")
    ap.add_argument("--rate-window-s", type=float, default=2.0, help="the trigger counts arrivals per window (2 s)")
    ap.add_argument("--smoothing", type=float, default=0.5, help="the trigger's EWMA weight of the newest window")
    ap.add_argument("--slo-multiplier", type=float, default=5.0, help="SLO = this x the L4 batch-1 latency (5)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("replan-out"), help="directory for replan.png and the live run")
    ap.add_argument("--no-live", action="store_true", help="skip the live part (emulated servers and the sidecar)")
    ap.add_argument("--live-rate", type=float, default=40.0, help="live open-loop req/s (default 40)")
    ap.add_argument("--live-duration-s", type=float, default=12.0, help="live seconds per run (default 12)")
    ap.add_argument("--reload-every-s", type=float, default=2.0, help="live: reload A <-> B this often (2 s)")
    args = ap.parse_args()
    spec = build_spec(args.slo_multiplier)
    first = plan(spec, PlanRequest(time_limit_s=30)).plan
    before = {m.name: args.load * m.throughput_rps for m in first.models}
    ratio = dict(zip(MODELS, (float(x) for x in args.ratio_after.split(":"))))
    phases = step_change(before, ratio, args.step_s)
    arrivals = shifting_arrivals(parse_trace(args.trace), phases, args.duration_s, args.seed)
    print(f"first plan: {', '.join(f'{m.name}={m.throughput_rps:.0f}' for m in first.models)} req/s; arrivals "
          + "; ".join(f"from {p.start_s:g} s " + ", ".join(f"{m}={r:.0f}" for m, r in p.rates_rps.items())
                      for p in phases) + f" req/s ({args.trace}, {len(arrivals)} requests)")
    duration_us = args.duration_s * 1e6
    trigger = ReplanConfig(args.rate_window_s, args.smoothing, cooldown_s=args.cooldown_s)
    t0 = time.perf_counter()
    static = simulate_shifting(first, arrivals, duration_us, seed=args.seed)
    t1 = time.perf_counter()
    replan = simulate_shifting(first, arrivals, duration_us, seed=args.seed, plan_for=spec_planner(spec),
                               config=trigger, migration=Migration())
    t2 = time.perf_counter()
    report(static, replan, args.window_s)
    args.out.mkdir(parents=True, exist_ok=True)
    plot(static, replan, args.window_s, args.step_s, args.out / "replan.png")
    print(f"simulated in {t1 - t0:.1f} s (static) and {t2 - t1:.1f} s (re-planning) wall; "
          f"wrote {args.out / 'replan.png'}")
    if not args.no_live:
        live(args.out / "live", args.live_rate, args.live_duration_s, args.reload_every_s)
        live_migration(args.out / "migration", args.live_rate, 2 * args.live_duration_s)


if __name__ == "__main__":
    main()
