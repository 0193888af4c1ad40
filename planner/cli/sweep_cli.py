"""``poolpipe plan sweep``: plan one spec over one axis with several planners; a table, a PNG plot, a JSON."""

from __future__ import annotations

import argparse
from pathlib import Path

DESCRIPTION = (
    "Plan the same spec at every value of ONE axis with several planners (default ppipe, np and dart-r), as in "
    "PPipe's sensitivity study, and print a table of the planned throughput (several models: the smallest "
    "throughput/weight) with ppipe's gain over each baseline; draw it as a PNG (--plot) and save the numbers "
    "as JSON (--out). An entry marked * stopped at its time limit (its incumbent is shown).")


def register_sweep(plan_sub: argparse._SubParsersAction) -> None:
    from planner.cli.flags import add_solver_flags, add_spec_flags

    p = plan_sub.add_parser("sweep", help="compare planners over SLO multipliers, GPU ratios or SLO margins",
                            description=DESCRIPTION)
    add_spec_flags(p)
    axis = p.add_argument_group("the axis (exactly one)").add_mutually_exclusive_group(required=True)
    axis.add_argument("--slo-multipliers", metavar="M,...",
                      help="every model's SLO = M x its fastest batch-1 latency, e.g. 2,3,5,10 (margins keep their "
                           "fraction of the SLO)")
    axis.add_argument("--gpu-ratios", metavar="H:L,...",
                      help="GPU counts high:low of the cluster's two types, e.g. 2:14,4:12,8:8 (high: the type the "
                           "first model runs fastest on)")
    axis.add_argument("--slo-margins", metavar="F,...",
                      help="every model's SLO margin as a fraction of its SLO, e.g. 0.2,0.4,0.6")
    p.add_argument("--planners", default="ppipe,np,dart-r", metavar="P,...",
                   help="planners to compare (default ppipe,np,dart-r)")
    add_solver_flags(p)
    p.add_argument("--plot", type=Path, default=Path("sweep.png"), metavar="PNG",
                   help="plot to write (default sweep.png)")
    p.add_argument("--out", type=Path, metavar="JSON", help="also write the numbers as JSON")
    p.set_defaults(func=_sweep)


def _axis(args: argparse.Namespace) -> tuple[str, str]:
    for axis in ("slo-multiplier", "gpu-ratio", "slo-margin"):
        text = getattr(args, axis.replace("-", "_") + "s")
        if text is not None:
            return axis, text
    raise AssertionError("argparse requires one axis")


def _planners(text: str) -> list[str]:
    from planner.planners import PLANNERS
    from poolpipe_common.errors import InputError

    out = [p.strip() for p in text.split(",") if p.strip()]
    bad = [p for p in out if p not in PLANNERS]
    if bad or not out:
        raise InputError(f"--planners: unknown planner(s) {', '.join(bad) or '(none)'}; "
                         f"choose from {', '.join(PLANNERS)}")
    return out


def _sweep(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import Progress

    from planner.cli.flags import load_cli_spec, time_limit
    from planner.compare import (
        default_solve,
        parse_values,
        plot_sweep,
        run_sweep,
        save_result,
        sweep_points,
        sweep_table,
    )
    from planner.planners import check_limits

    axis, text = _axis(args)
    planners = _planners(args.planners)
    opts = check_limits(args.solver, time_limit(args), args.gap)
    spec = load_cli_spec(args)
    points = sweep_points(spec, axis, parse_values(axis, text))
    with Progress(console=Console(stderr=True)) as bar:
        task = bar.add_task(f"sweep {axis}", total=len(points) * len(planners))
        res = run_sweep(spec, axis, points, planners, default_solve(opts.solver, opts.time_limit_s, opts.rel_gap),
                        lambda what: bar.update(task, advance=1, description=f"sweep {axis}: {what}"))
    Console(width=130).print(sweep_table(res))
    plot_sweep(res, args.plot)
    print(f"wrote {args.plot}" + (f" and {args.out}" if args.out else ""))
    if args.out:
        save_result(res, args.out)
    return 0
