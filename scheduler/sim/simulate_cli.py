"""``poolpipe simulate``: sweep the load factor of a plan in the discrete-event simulator.

Writes result.json (policy, max_load_factor, models[name, max_load_factor, points[...]],
dispatch_us_p50, probes_per_dispatch) and, with --plot DIR, attainment.png and gantt.png.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from scheduler.core.policies import POLICIES

# the --overheads file, as `poolpipe serve --overheads-out` writes it


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "simulate", help="simulate a plan under a workload and find the load it sustains at 99%% SLO",
        description="Sweep the load factor (1.0 = each model's throughput in the reference plan) and find "
                    "per model the largest load factor with SLO attainment >= 99%.")
    p.add_argument("--plan", required=True, help="plan.json to simulate")
    p.add_argument("--reference-plan", help="plan.json whose throughputs define load factor 1.0 (default: --plan)")
    p.add_argument("--policy", default="ppipe", choices=tuple(POLICIES), help="data-plane policy (default ppipe)")
    p.add_argument("--trace", default="poisson",
                   help="poisson | bursty:CV | maf19:FILE | maf21:FILE | replay:FILE (default poisson). bursty:CV: "
                   "gamma inter-arrival times with that coefficient of variation (synthetic stress test). The "
                   "PPipe paper's 'bursty' workload is maf21: the Azure Functions 2021 invocation trace, "
                   "folded to the target rate as the paper's simulator does. replay:FILE: real arrivals (a CSV "
                   "with a TIMESTAMP column of dates, or one time in seconds per line) with their inter-arrival "
                   "times scaled so the run offers the target rate, the stretch replayed keeping its burstiness; "
                   "cyclic; the seed picks the start, "
                   "each model starts elsewhere in the trace. replay:azure-code (bursty, inter-arrival CV 13) and "
                   "replay:azure-conv (CV 1.1) are the shipped Azure LLM inference traces of 2023 "
                   "(data/traces/azure-llm-2023)")
    p.add_argument("--load-factors", default="0.05:1.0:0.05", help="START:STOP:STEP or a comma list")
    p.add_argument("--duration-s", type=float, default=30.0, help="simulated seconds per point (default 30)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--noise-cv", type=float, default=0.0, help="coefficient of variation of stage latency noise")
    p.add_argument("--jobs", type=int, default=0, help="parallel processes (default: all cores)")
    p.add_argument("--driver", choices=("ideal", "live"), default=None,
                   help="the loop around the policy: ideal (the policy alone, as the paper's simulator) or live "
                        "(the sidecar's deadline margins, lateness learning and retries); default: live with "
                        "--overheads, else ideal")
    p.add_argument("--overheads", metavar="FILE",
                   help="what the live executor adds per stage (lead, tail, wake lateness, slowdown), as written "
                        "by 'poolpipe serve --overheads-out FILE': the simulation then predicts the sidecar")
    p.add_argument("--shards", type=int, default=1, metavar="N",
                   help="also simulate N sidecar shards ('poolpipe serve --shard I/N'), each with its share of every "
                        "pool and 1/N of the load, and print the max load factor they sustain against one sidecar "
                        "(what sharding costs); default 1 (no comparison)")
    p.add_argument("--dynamic-batching", action="append", default=[], metavar="[MODEL=]SPEC",
                   help="Triton's batcher controls (priority levels, queue policy) as 'poolpipe generate' takes them "
                        "(protobuf text or @config.pbtxt; every model without MODEL=); policies ppipe, fifs, elsa")
    p.add_argument("--priorities", metavar="PRIORITY=SHARE,...",
                   help="send requests with Triton's priority parameter in these shares (e.g. 1=0.2,2=0.8); "
                        "result.json then has each point's attainment per priority (by_priority)")
    p.add_argument("--out", required=True, help="result.json to write")
    p.add_argument("--plot", metavar="DIR", help="write attainment.png and gantt.png here")
    p.set_defaults(func=run)


def load_overheads(path: str):
    """An overheads file (poolpipe serve --overheads-out), validated; bad ones are one-line InputErrors."""
    from poolpipe_common.overheads import read_overheads

    return read_overheads(path)


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from plans.plan_json import load_plan
    from poolpipe_common.errors import InputError
    from scheduler.sim.sweep import (
        PointJob,
        parse_load_factors,
        reference_rates,
        run_point,
        sweep,
    )
    from workloads.arrivals import parse_trace

    plan = load_plan(args.plan)
    reference = load_plan(args.reference_plan) if args.reference_plan else plan
    trace = parse_trace(args.trace)
    lfs = parse_load_factors(args.load_factors)
    if not args.duration_s > 0:
        raise InputError(f"--duration-s must be > 0, got {args.duration_s}")
    if args.noise_cv < 0:
        raise InputError(f"--noise-cv must be >= 0, got {args.noise_cv}")
    out = Path(args.out)
    if not out.parent.exists():
        raise InputError(f"--out {out}: directory {out.parent} does not exist")
    reference_rates(plan, reference)  # fail early on a model missing from the reference
    overheads = load_overheads(args.overheads) if args.overheads else None
    controls = _controls(args, plan)
    driver = args.driver or ("live" if overheads else "ideal")
    if args.shards != 1:
        from scheduler.sim.shard_cost import check_shards
        if args.shards < 1:
            raise InputError(f"--shards {args.shards}: expected N >= 1")
        check_shards(plan, args.shards)

    with tqdm(total=len(lfs), desc=f"simulate {args.policy}", unit="point", file=sys.stderr) as bar:
        def tick(s: dict) -> None:
            att = min(p["slo_attainment"] for p in s["models"].values())
            bar.set_postfix_str(f"lf={s['load_factor']:.2f} min attainment={100 * att:.1f}%")
            bar.update(1)
        result = sweep(plan, reference, args.policy, trace, lfs, args.duration_s, args.seed,
                       jobs=args.jobs or None, noise_cv=args.noise_cv, on_point=tick, driver=driver,
                       overheads=overheads, controls=controls)
    shard_lines = _shards(args, plan, reference, trace, lfs, driver, overheads, result)
    out.write_text(json.dumps(result, indent=1) + "\n")

    if args.plot:
        from scheduler.sim.plots import plot_attainment, plot_gantt

        d = Path(args.plot)
        d.mkdir(parents=True, exist_ok=True)
        plot_attainment(result, d / "attainment.png")
        lf = result["max_load_factor"] or lfs[0]
        lf = max((x for x in lfs if x <= lf), default=lfs[0])
        job = PointJob(plan, reference_rates(plan, reference), args.policy, trace, lf,
                       min(args.duration_s, 4.0), args.seed, args.noise_cv, driver, overheads)
        _, sim = run_point(job, record_timeline=True)
        plot_gantt(sim, d / "gantt.png", title=f"{plan.planner} plan, {args.policy}, load factor {lf:.2f}: "
                                                "batches per vGPU")
    for m in result["models"]:
        curve = ", ".join(f"{p['load_factor']:.2f}: {100 * p['slo_attainment']:.1f}%" for p in m["points"])
        print(f"{m['name']}: SLO attainment at load factor {curve}")
        if m["max_load_factor"] > 0:
            print(f"{m['name']}: max load factor {m['max_load_factor']:.2f} (the largest with >= 99% attainment)")
        else:
            print(f"{m['name']}: no load factor tried reached 99% attainment; try lower --load-factors")
    print(f"mean max load factor {result['max_load_factor']:.3f}; dispatch decision p50 "
          f"{result['dispatch_us_p50'] or 0:.1f} us; {result['probes_per_dispatch']:.2f} probes per dispatch; "
          f"wrote {out}")
    for line in shard_lines:
        print(line)
    for p in result["points"]:
        if p.get("by_priority"):
            print(f"load factor {p['load_factor']:.2f}: SLO attainment by priority " + ", ".join(
                f"{k}: {100 * v['slo_attainment']:.1f}%" for k, v in p["by_priority"].items()))
    return 0


def _controls(args: argparse.Namespace, plan):  # -> SimControls | None
    """--dynamic-batching and --priorities, checked against the plan and the policy before anything runs."""
    if not args.dynamic_batching and not args.priorities:
        return None
    from model_repository_gen.batcher_flags import controls_for, parse_dynamic_batching_args
    from scheduler.core import make_scheduler
    from scheduler.sim.placement import topology_from_plan
    from scheduler.sim.priorities import SimControls, parse_priority_mix

    given, _ = parse_dynamic_batching_args(args.dynamic_batching)
    controls = SimControls(controls_for([m.name for m in plan.models], given),
                           parse_priority_mix(args.priorities) if args.priorities else ())
    try:
        make_scheduler(args.policy, controls.topology(topology_from_plan(plan)))
    except ValueError as e:
        from poolpipe_common.errors import InputError
        raise InputError(f"--dynamic-batching: {e}") from None
    return controls


def _shards(args: argparse.Namespace, plan, reference, trace, lfs: list[float], driver: str, overheads,
            result: dict) -> list[str]:
    """With --shards N > 1: sweep every shard, add result["shards"], return the comparison lines."""
    if args.shards == 1:
        return []
    from tqdm import tqdm

    from scheduler.sim.shard_cost import report, shard_sweeps

    bars = []

    def on_shard(i: int):
        bars.append(tqdm(total=len(lfs), desc=f"shard {i}/{args.shards}", unit="point", file=sys.stderr))
        return lambda _s: bars[-1].update(1)

    try:
        result["shards"] = shard_sweeps(plan, reference, args.shards, on_shard, policy=args.policy, trace=trace,
                                        load_factors=lfs, duration_s=args.duration_s, seed=args.seed,
                                        jobs=args.jobs or None, noise_cv=args.noise_cv, driver=driver,
                                        overheads=overheads)
    finally:
        for b in bars:
            b.close()
    return report(result, result["shards"])
