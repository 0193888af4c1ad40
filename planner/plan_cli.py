"""``poolpipe plan``: solve a planning spec (file or quick flags) and write plan.json with a readable summary."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

QUICK_FLAGS = ("profile", "gpus", "gpus_per_server", "bandwidth_gbps", "vgpu_levels", "max_partitions",
               "slo_us", "slo_multiplier", "slo_margin_us", "slo_margin", "batch_wait_us", "weight",
               "no_batch_unification")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan", help="plan pooled pipelines (MILP) for a cluster and SLOs",
        description="Plan where each model is cut, which pool of (virtual) GPUs serves each partition, with "
                    "which batch and how many vGPUs. Give a spec file (--spec) or build one with quick flags "
                    "(--profile, --gpus, ...).")
    p.add_argument("--spec", type=Path, help="planning spec (YAML or JSON)")
    p.add_argument("--planner", default="ppipe", choices=("ppipe", "np", "dart-r"),
                   help="ppipe: pooled pipelines (default); np: whole models; dart-r: GPU pairs cut once")
    p.add_argument("--solver", default="highs", choices=("highs", "cbc", "gurobi"), help="MILP solver (default highs)")
    p.add_argument("--time-limit", type=float, metavar="S", help="solver time limit in seconds")
    p.add_argument("--out", required=True, type=Path, help="plan.json to write")
    p.add_argument("--progress", action="store_true", help="show the solver's log")
    q = p.add_argument_group("quick spec (instead of --spec)")
    q.add_argument("--profile", action="append", type=Path, metavar="FILE",
                   help="profile JSON of a model (repeat for several models sharing the cluster)")
    q.add_argument("--gpus", metavar="T=N,...", help="GPU counts, e.g. L4=25,T4=75")
    q.add_argument("--gpus-per-server", metavar="T=N,...", help="GPUs sharing one NIC, e.g. L4=4,T4=2 (default 1)")
    q.add_argument("--bandwidth-gbps", type=float, help="effective NIC bandwidth per server (default 10)")
    q.add_argument("--vgpu-levels", metavar="V|T=V,...", help="max vGPU level V per type, e.g. 4 or L4=4,T4=2 (default 1)")
    q.add_argument("--max-partitions", type=int, help="max partitions per pipeline (default 3)")
    q.add_argument("--no-batch-unification", action="store_true", help="let partitions of a pipeline use different batches")
    q.add_argument("--slo-us", type=float, action="append", help="latency SLO in µs (one, or one per --profile)")
    q.add_argument("--slo-multiplier", type=float, action="append",
                   help="SLO as a multiple of the fastest batch-1 latency (instead of --slo-us)")
    q.add_argument("--slo-margin-us", type=float, action="append", help="subtracted from the SLO when planning")
    q.add_argument("--slo-margin", type=float, action="append", help="margin as a fraction of the SLO")
    q.add_argument("--batch-wait-us", type=float, action="append",
                   help="expected wait per extra request of a batch (batch_wait_us_per_request)")
    q.add_argument("--weight", type=float, action="append", help="workload share per --profile (default 1)")
    p.set_defaults(func=_plan)


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


def _plan(args: argparse.Namespace) -> int:
    from planner.solve import solve_spec
    from planner.spec import load_spec, spec_from_dict
    from poolpipe_common.errors import InputError

    quick = [f for f in QUICK_FLAGS if getattr(args, f) not in (None, False)]
    if args.spec is not None:
        if quick:
            raise InputError(f"--spec cannot be combined with quick flags ({', '.join('--' + f.replace('_', '-') for f in quick)})")
        spec = load_spec(args.spec)
    else:
        spec = spec_from_dict(quick_spec_dict(args), Path.cwd(), "command line")
    if args.out.is_dir():
        raise InputError(f"--out {args.out} is a directory; give a file name such as plan.json")
    plan = solve_spec(spec, args.planner, args.solver, args.time_limit, args.progress)
    try:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        plan.save(args.out)
    except OSError as e:
        raise InputError(f"cannot write {args.out}: {e.strerror or e}") from None
    print_plan(plan, spec)
    print(f"wrote {args.out} ({plan.planner}, {plan.solver}, {plan.status}, {plan.solve_seconds:.2f} s)")
    return 0


def print_plan(plan, spec) -> None:
    """Per model and pipeline: each partition's blocks, GPU, vGPU, batch, count, latency, transfer, throughput."""
    from rich.console import Console
    from rich.table import Table

    from planner.candidates import partition_rate_rps

    console = Console(width=130)
    specs = {m.name: m for m in spec.models}
    for m in plan.models:
        ms = specs[m.name]
        t = Table(title=f"{m.name}: {m.throughput_rps:,.1f} req/s  (SLO {m.slo_us:,.0f} us, margin "
                        f"{m.slo_margin_us:,.0f} us, weight {m.weight:g})", title_justify="left")
        for col in ("pipe", "blocks", "GPU", "vGPU", "batch", "vGPUs", "latency us", "transfer us", "req/s"):
            t.add_column(col, justify="left" if col in ("blocks", "GPU") else "right")
        for i, pl in enumerate(m.pipelines):
            for k, p in enumerate(pl.partitions):
                rate = p.num_vgpus * partition_rate_rps(ms, spec.cluster, p.gpu, p.v, p.batch, *p.blocks)
                t.add_row(str(i) if k == 0 else "", f"[{p.blocks[0]}, {p.blocks[1]})", p.gpu, p.vgpu_fraction,
                          str(p.batch), str(p.num_vgpus), f"{p.latency_us:,.0f}", f"{p.transfer_us:,.0f}",
                          f"{rate:,.1f}")
            t.add_row("", "", "", "", "", "", f"[b]{pl.latency_us:,.0f}[/b]", "", f"[b]{pl.throughput_rps:,.1f}[/b]",
                      end_section=True)
        console.print(t)
    used = plan.physical_gpus_used()
    g = Table(title="physical GPUs", title_justify="left")
    for col in ("GPU", "used", "cluster"):
        g.add_column(col, justify="left" if col == "GPU" else "right")
    for gpu, count in plan.cluster.gpus.items():
        g.add_row(gpu, f"{used.get(gpu, 0.0):g}", str(count))
    console.print(g)
    if plan.status != "optimal":
        console.print(f"[yellow]solver stopped at the time limit: the plan is feasible but not proven optimal "
                      f"({plan.status})[/yellow]")
    if len(plan.models) > 1:
        console.print(f"smallest throughput/weight: {plan.objective:,.1f}")
