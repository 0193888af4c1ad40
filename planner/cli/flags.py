"""The flags `poolpipe plan` and `poolpipe plan sweep` share: solver settings and the planning problem, given as
a spec file or as quick flags, turned into a PlanningSpec with one-line errors."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

QUICK_FLAGS = ("profile", "gpus", "gpus_per_server", "bandwidth_gbps", "vgpu_levels", "max_partitions",
               "slo_us", "slo_multiplier", "slo_margin_us", "slo_margin", "batch_wait_us", "weight",
               "no_batch_unification")



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


def type_map(text: str, flag: str, *, allow_scalar: bool = False) -> Any:
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
    cluster: dict[str, Any] = {"gpus": type_map(args.gpus, "--gpus"),
                               "bandwidth_gbps": 10.0 if args.bandwidth_gbps is None else args.bandwidth_gbps}
    if args.gpus_per_server:
        cluster["gpus_per_server"] = type_map(args.gpus_per_server, "--gpus-per-server")
    if args.vgpu_levels:
        lv = type_map(args.vgpu_levels, "--vgpu-levels", allow_scalar=True)
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
    from plans.spec.planning_spec import load_spec, spec_from_dict
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
