"""``poolpipe plan``: solve a planning spec (file or quick flags) and write plan.json with a readable summary."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from planner.cli.flags import add_solver_flags, add_spec_flags, load_cli_spec, time_limit, type_map

DESCRIPTION = (
    "Plan where each model is cut, which pool of (virtual) GPUs serves each partition, with which batch and how "
    "many vGPUs. Give a spec file (--spec) or build one with quick flags (--profile, --gpus, ...). By default the "
    "plan maximises the request rate the whole cluster sustains at >= 99%% SLO attainment (plan.json's "
    "sustainable_rps, printed beside the nominal throughput of its pools); --objective cost instead finds the "
    "cheapest GPUs (the cluster's counts become upper bounds) that sustain --rate at --price. Every solve stops at "
    "--time-limit or once proven within --gap; the plan is then the solver's incumbent, and the output and "
    "plan.json say the status, incumbent, bound and gap. 'poolpipe plan sweep --help' compares planners over "
    "one axis (SLO multipliers, GPU ratios or SLO margins).")

def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="plan pooled pipelines (MILP) for a cluster and SLOs, or the cheapest GPUs "
                                    "for given rates", description=DESCRIPTION)
    add_spec_flags(p)
    p.add_argument("--planner", default="ppipe", choices=("ppipe", "np", "dart-r"),
                   help="ppipe: pooled pipelines (default); np: whole models; dart-r: GPU pairs cut once")
    add_solver_flags(p)
    p.add_argument("--colocate", action="store_true",
                   help="let vGPUs of different (model, partition) pairs share a physical GPU (InSS-style), with "
                        "latencies inflated by the profiles' interference models and GPU memory as a hard limit "
                        "(the spec's colocate: true); default: dedicated GPUs")
    p.add_argument("--out", type=Path, help="plan.json to write (required)")
    p.add_argument("--progress", action="store_true", help="show the solver's log")
    c = p.add_argument_group("capacity and cost planning")
    c.add_argument("--objective", default="sustained", choices=("sustained", "throughput", "cost"),
                   help="sustained: the most requests/s the cluster holds at >= 99%% SLO attainment under "
                        "--arrivals, queueing and serving's per-stage costs (--overheads) counted: plans over SLO "
                        "margins, each measured by the simulator, the best kept (default); throughput: PPipe's "
                        "nominal objective, every pool always busy, under the spec's fixed margin (to reproduce "
                        "the paper; its rate is not held at 99%%, and what it holds is measured only with --verify); "
                        "cost: the least cost per hour whose plan "
                        "sustains --rate at >= 99%%, using at most the cluster's GPUs")
    c.add_argument("--rate", metavar="NAME=R,...",
                   help="with --objective cost: requests/s each model must sustain at >= 99%% SLO attainment, by "
                        "model name, e.g. convnext_large=2000")
    c.add_argument("--arrivals", default="poisson", metavar="poisson|bursty:CV|replay:FILE",
                   help="the arrivals a plan must sustain: poisson (default), bursty:CV (gamma gaps with that "
                        "coefficient of variation, e.g. bursty:2) or replay:NAME_OR_FILE (a recorded trace, e.g. "
                        "replay:azure-conv, scaled to each rate and held in each stretch of it simulated, the first "
                        "at its start)")
    c.add_argument("--overheads", metavar="FILE",
                   help="the cost model: what serving adds per stage call beyond compute, by the call's bytes and "
                        "the rate served, as 'poolpipe calibrate' (or 'poolpipe serve --overheads-out FILE') "
                        "measured it on your servers; plans count it in every partition's latency and measure with "
                        "it. Default: ./poolpipe-costs.json where calibrate wrote one, else this project's "
                        "calibration on emulated servers (0.45 ms lead + 0.35 ms tail per stage), said uncalibrated")
    c.add_argument("--jobs", type=int, metavar="N",
                   help="processes that measure candidate plans at once with the sustained objective (default: one "
                        "per core of this machine; 1: all in this process). The plan is the same for any N")
    c.add_argument("--verify", action="store_true",
                   help="with --objective throughput: simulate the plan and record the rate it holds at >= 99%% "
                        "SLO attainment (sustainable_rps); the sustained and cost objectives always do")
    c.add_argument("--price", metavar="TYPE=P,...",
                   help="with --objective cost: price of one GPU-hour per GPU type, e.g. L4=0.8,T4=0.35")
    a = p.add_argument_group("applications (the spec's applications: DAGs of its models with one SLO each)")
    a.add_argument("--app-split", default="harpagon", choices=("harpagon", "optimal", "uniform"),
                   help="how each application's SLO is split into its modules' budgets before the models are "
                        "planned under them: harpagon: latency-cost efficiency greedy (default); optimal: the "
                        "least-cost split by MILP (small DAGs); uniform: SLO / modules on the longest path. "
                        "Costs use --price per GPU type (default 1 per GPU)")
    pr = p.add_argument_group("PARIS instance sizing (needs cluster.vgpu_sizes for one GPU type, one model)")
    pr.add_argument("--paris", action="store_true",
                    help="size vGPU instances as PARIS does: each size's knee batch (80%% of its peak throughput), "
                         "ranges of the batch-size PDF mapped to sizes, instance counts from the throughput they "
                         "need, GPUs split into the allowed splits (planner/sizing/paris.py)")
    pr.add_argument("--batch-pdf", metavar="B=P,...|FILE",
                    help="with --paris: the batch-size distribution, e.g. 1=0.5,2=0.3,4=0.2, or a JSON file with "
                         "batch_sizes, such as a 'poolpipe simulate' result.json (its batch log)")
    p.set_defaults(func=_plan)
    plan_sub = p.add_subparsers(dest="plan_command", title="subcommand", metavar="sweep")
    from planner.cli.sweep_cli import register_sweep

    register_sweep(plan_sub)


def plan_request(args: argparse.Namespace):
    """The PlanRequest that the flags describe (one-line errors that name the flag)."""
    from planner.request import PlanRequest
    from planner.sizing.paris import batch_pdf_arg
    from poolpipe_common.errors import InputError

    if args.paris != bool(args.batch_pdf):
        raise InputError("--paris needs --batch-pdf (and goes with the default planner and objective)")

    def numbers(text: str | None, flag: str) -> dict[str, float] | None:
        return None if not text else {k: float(v) for k, v in type_map(text, flag).items()}
    return PlanRequest(planner=args.planner, objective=args.objective, rates_rps=numbers(args.rate, "--rate"),
                       prices=numbers(args.price, "--price"), colocate=args.colocate, app_split=args.app_split,
                       paris_batch_pdf=batch_pdf_arg(args.batch_pdf) if args.paris else None,
                       arrivals=args.arrivals, overheads=_costs(args.overheads),
                       solver=args.solver, time_limit_s=time_limit(args), gap=args.gap, progress=args.progress,
                       jobs=args.jobs, verify=args.verify)


def _costs(given: str | None):
    """The --overheads file, else ./poolpipe-costs.json where `poolpipe calibrate` wrote one (said in one line)."""
    from poolpipe_common.overheads import costs_file, read_overheads

    path = costs_file(given)
    if path is None:
        return None
    if not given:
        print(f"costs: measured, from {path} (poolpipe calibrate); --overheads FILE to use another")
    return read_overheads(path)


SEARCH_MODULE = "planner.sustained.search"  # what the sustained search's workers import (plan_sustained's preload)


def _prestart_workers(args: argparse.Namespace) -> None:
    """The sustained objective measures its candidates in worker processes: started before this process's own
    imports, theirs overlap them (0.2-0.3 s of a 3 s plan on 2 cores), and the first MILPs find them ready."""
    from planner.sustained.worker_process import default_jobs, prestart

    jobs = args.jobs or default_jobs()
    if args.objective == "sustained" and jobs > 1:
        prestart(jobs, (SEARCH_MODULE,))


def _plan(args: argparse.Namespace) -> int:
    from poolpipe_common.errors import InputError

    if args.out is None:
        raise InputError("--out FILE is needed: the plan.json to write")
    if args.out.is_dir():
        raise InputError(f"--out {args.out} is a directory; give a file name such as plan.json")
    _prestart_workers(args)
    from planner.cli.report import print_plan
    from planner.entry import plan
    spec = load_cli_spec(args)
    started = time.perf_counter()
    outcome = plan(spec, plan_request(args))
    planning_s = time.perf_counter() - started
    try:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        outcome.plan.save(args.out)
    except OSError as e:
        raise InputError(f"cannot write {args.out}: {e.strerror or e}") from None
    print_plan(outcome.plan, outcome.spec)
    for line in outcome.lines:
        print(line)
    p = outcome.plan
    # solve_seconds is the kept plan's MILP solve; planning also measured candidates (the sustained objective)
    print(f"wrote {args.out} ({p.planner}, {p.solver}, {p.status}; MILP {p.solve_seconds:.2f} s, planning "
          f"{planning_s:.1f} s)")
    return 0
