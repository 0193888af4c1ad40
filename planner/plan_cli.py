"""``poolpipe plan``: solve a planning spec (file or quick flags) and write plan.json with a readable summary."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

QUICK_FLAGS = ("profile", "gpus", "gpus_per_server", "bandwidth_gbps", "vgpu_levels", "max_partitions",
               "slo_us", "slo_multiplier", "slo_margin_us", "slo_margin", "batch_wait_us", "weight",
               "no_batch_unification")


DESCRIPTION = (
    "Plan where each model is cut, which pool of (virtual) GPUs serves each partition, with which batch and how "
    "many vGPUs. Give a spec file (--spec) or build one with quick flags (--profile, --gpus, ...). By default the "
    "plan maximises throughput on the whole cluster; --objective cost instead finds the cheapest GPUs (the "
    "cluster's counts become upper bounds) that serve --rate under the SLOs at --price. Every solve stops at "
    "--time-limit or once proven within --gap; the plan is then the solver's incumbent, and the output and "
    "plan.json say the status, incumbent, bound and gap. 'poolpipe plan sweep --help' compares planners over "
    "one axis (SLO multipliers, GPU ratios or SLO margins).")


def add_solver_flags(p: argparse.ArgumentParser) -> None:
    """--solver, --time-limit and --gap (shared by plan and plan sweep)."""
    p.add_argument("--solver", default="highs", choices=("highs", "cbc", "gurobi"), help="MILP solver (default highs)")
    p.add_argument("--time-limit", type=float, metavar="S", default=60.0,
                   help="stop each solve after S seconds and keep its best plan so far (default 60; 0: no limit)")
    p.add_argument("--gap", type=float, metavar="G", default=1e-4,
                   help="relative MIP gap at which a plan counts as optimal: stop once the incumbent is proven "
                        "within G of the best possible (default 1e-4 = 0.01%%)")


def add_spec_flags(p: argparse.ArgumentParser) -> None:
    """--spec or the quick flags that build a spec (shared by plan and plan sweep)."""
    p.add_argument("--spec", type=Path, help="planning spec (YAML or JSON)")
    q = p.add_argument_group("quick spec (instead of --spec)")
    q.add_argument("--profile", action="append", type=Path, metavar="FILE",
                   help="profile JSON of a model (repeat for several models sharing the cluster)")
    q.add_argument("--gpus", metavar="T=N,...", help="GPU counts, e.g. L4=25,T4=75")
    q.add_argument("--gpus-per-server", metavar="T=N,...", help="GPUs sharing one NIC, e.g. L4=4,T4=2 (default 1)")
    q.add_argument("--bandwidth-gbps", type=float, help="effective NIC bandwidth per server (default 10)")
    q.add_argument("--vgpu-levels", metavar="V|T=V,...",
                   help="max vGPU level V per type, e.g. 4 or L4=4,T4=2 (default 1)")
    q.add_argument("--max-partitions", type=int, help="max partitions per pipeline (default 3)")
    q.add_argument("--no-batch-unification", action="store_true",
                   help="let partitions of a pipeline use different batches")
    q.add_argument("--slo-us", type=float, action="append", help="latency SLO in µs (one, or one per --profile)")
    q.add_argument("--slo-multiplier", type=float, action="append",
                   help="SLO as a multiple of the fastest batch-1 latency (instead of --slo-us)")
    q.add_argument("--slo-margin-us", type=float, action="append", help="subtracted from the SLO when planning")
    q.add_argument("--slo-margin", type=float, action="append", help="margin as a fraction of the SLO")
    q.add_argument("--batch-wait-us", type=float, action="append",
                   help="expected wait per extra request of a batch (batch_wait_us_per_request)")
    q.add_argument("--weight", type=float, action="append", help="workload share per --profile (default 1)")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="plan pooled pipelines (MILP) for a cluster and SLOs, or the cheapest GPUs "
                                    "for given rates", description=DESCRIPTION)
    add_spec_flags(p)
    p.add_argument("--planner", default="ppipe", choices=("ppipe", "np", "dart-r"),
                   help="ppipe: pooled pipelines (default); np: whole models; dart-r: GPU pairs cut once")
    add_solver_flags(p)
    p.add_argument("--out", type=Path, help="plan.json to write (required)")
    p.add_argument("--progress", action="store_true", help="show the solver's log")
    c = p.add_argument_group("capacity and cost planning")
    c.add_argument("--objective", default="throughput", choices=("throughput", "cost"),
                   help="throughput: serve as much as the cluster can (default); cost: the least cost per hour "
                        "that serves --rate, using at most the cluster's GPUs")
    c.add_argument("--rate", metavar="NAME=R,...",
                   help="with --objective cost: requests/s each model must sustain, by model name, e.g. "
                        "convnext_large=2000")
    c.add_argument("--price", metavar="TYPE=P,...",
                   help="with --objective cost: price of one GPU-hour per GPU type, e.g. L4=0.8,T4=0.35")
    p.set_defaults(func=_plan)
    plan_sub = p.add_subparsers(dest="plan_command", title="subcommand", metavar="sweep")
    from planner.sweep_cli import register_sweep

    register_sweep(plan_sub)


def _type_map(text: str, flag: str, *, allow_scalar: bool = False) -> Any:
    """'L4=25,T4=75' -> {'L4': 25, 'T4': 75}; with allow_scalar, '4' stays 4."""
    from poolpipe_common.errors import InputError

    if allow_scalar and text.strip().isdigit():
        return int(text)
    out: dict[str, float] = {}
    for item in text.split(","):
        name, sep, val = item.partition("=")
        try:
            num = float(val)
        except ValueError:
            num = None
        if not sep or not name.strip() or num is None:
            raise InputError(f"{flag}: expected TYPE=NUMBER[,TYPE=NUMBER...], e.g. L4=25,T4=75; got {text!r}")
        out[name.strip()] = int(num) if num == int(num) else num
    return out


def _per_model(values: list[float] | None, n: int, flag: str) -> list[float | None]:
    from poolpipe_common.errors import InputError

    if not values:
        return [None] * n
    if len(values) == 1:
        return values * n
    if len(values) != n:
        raise InputError(f"{flag}: give it once or once per --profile ({n}), got {len(values)}")
    return values


def quick_spec_dict(args: argparse.Namespace) -> dict[str, Any]:
    """The spec document that the quick flags describe (validated later by the spec loader)."""
    from poolpipe_common.errors import InputError

    if not args.profile:
        raise InputError("give --spec FILE, or --profile FILE with --gpus and --slo-us/--slo-multiplier")
    if not args.gpus:
        raise InputError("--gpus is needed with --profile, e.g. --gpus L4=25,T4=75")
    cluster: dict[str, Any] = {"gpus": _type_map(args.gpus, "--gpus"),
                               "bandwidth_gbps": 10.0 if args.bandwidth_gbps is None else args.bandwidth_gbps}
    if args.gpus_per_server:
        cluster["gpus_per_server"] = _type_map(args.gpus_per_server, "--gpus-per-server")
    if args.vgpu_levels:
        lv = _type_map(args.vgpu_levels, "--vgpu-levels", allow_scalar=True)
        cluster["vgpu_levels"] = {t: lv for t in cluster["gpus"]} if isinstance(lv, int) else lv
    n = len(args.profile)
    cols = {"slo_us": _per_model(args.slo_us, n, "--slo-us"),
            "slo_multiplier": _per_model(args.slo_multiplier, n, "--slo-multiplier"),
            "slo_margin_us": _per_model(args.slo_margin_us, n, "--slo-margin-us"),
            "slo_margin": _per_model(args.slo_margin, n, "--slo-margin"),
            "batch_wait_us_per_request": _per_model(args.batch_wait_us, n, "--batch-wait-us"),
            "weight": _per_model(args.weight, n, "--weight")}
    if not args.slo_us and not args.slo_multiplier:
        raise InputError("--slo-us or --slo-multiplier is needed with --profile")
    models = []
    for i, prof in enumerate(args.profile):
        m = {"profile": str(prof)}
        m.update({k: v[i] for k, v in cols.items() if v[i] is not None})
        models.append(m)
    d: dict[str, Any] = {"cluster": cluster, "models": models,
                         "batch_unification": not args.no_batch_unification}
    if args.max_partitions is not None:
        d["max_partitions"] = args.max_partitions
    return d


def load_cli_spec(args: argparse.Namespace):
    """The spec from --spec, or from the quick flags (never both)."""
    from planner.spec import load_spec, spec_from_dict
    from poolpipe_common.errors import InputError

    quick = [f for f in QUICK_FLAGS if getattr(args, f) not in (None, False)]
    if args.spec is not None:
        if quick:
            flags = ", ".join("--" + f.replace("_", "-") for f in quick)
            raise InputError(f"--spec cannot be combined with quick flags ({flags})")
        return load_spec(args.spec)
    return spec_from_dict(quick_spec_dict(args), Path.cwd(), "command line")


def time_limit(args: argparse.Namespace) -> float | None:
    """--time-limit in seconds; 0 means no limit (negative values are left for the solver's check)."""
    return None if args.time_limit == 0 else args.time_limit


def _cost_request(args: argparse.Namespace):
    from planner.cost import CostRequest
    from poolpipe_common.errors import InputError

    if args.objective != "cost":
        if args.rate or args.price:
            raise InputError("--rate and --price go with --objective cost")
        return None
    if not args.rate or not args.price:
        raise InputError("--objective cost needs --rate NAME=REQ_PER_S,... and --price TYPE=PER_GPU_HOUR,...")
    return CostRequest({k: float(v) for k, v in _type_map(args.rate, "--rate").items()},
                       {k: float(v) for k, v in _type_map(args.price, "--price").items()})


def _plan(args: argparse.Namespace) -> int:
    from planner.cost import solve_cost
    from planner.plan_report import print_plan
    from planner.solve import check_limits, solve_spec
    from poolpipe_common.errors import InputError

    if args.out is None:
        raise InputError("--out FILE is needed: the plan.json to write")
    if args.out.is_dir():
        raise InputError(f"--out {args.out} is a directory; give a file name such as plan.json")
    req = _cost_request(args)
    spec = load_cli_spec(args)
    if req is not None:
        opts = check_limits(args.solver, time_limit(args), args.gap)
        plan = solve_cost(spec, req, args.planner, type(opts)(opts.solver, opts.time_limit_s, opts.rel_gap,
                                                                args.progress))
    else:
        plan = solve_spec(spec, args.planner, args.solver, time_limit(args), args.progress, args.gap)
    try:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        plan.save(args.out)
    except OSError as e:
        raise InputError(f"cannot write {args.out}: {e.strerror or e}") from None
    print_plan(plan, spec)
    print(f"wrote {args.out} ({plan.planner}, {plan.solver}, {plan.status}, {plan.solve_seconds:.2f} s)")
    return 0


def print_plan(plan, spec) -> None:
    """See planner.plan_report.print_plan (kept here for callers of the CLI module)."""
    from planner.plan_report import print_plan as _print

    _print(plan, spec)
