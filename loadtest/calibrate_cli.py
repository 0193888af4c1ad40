"""``poolpipe calibrate``: measure this deployment's serving costs at several rates and write the cost model that
``poolpipe plan`` and ``poolpipe simulate`` then use (loadtest.calibrate)."""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from poolpipe_common.errors import InputError
from poolpipe_common.overheads import COSTS_FILE


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "calibrate", help="measure what serving costs on this deployment and write the cost model plans use",
        description="Starts a sidecar on a generated deployment once per step, offers open-loop Poisson load at a "
                    "share of the plan's promise to all its models, and fits each stage call's lead and tail to its "
                    "bytes and the rate served, and the way outside the sidecar's clock to the input's bytes "
                    "(docs/configuration.md, 'Cost model'). Its Triton servers must be running ('poolpipe launch "
                    "DIR'), or pass --launch. 'poolpipe plan' uses the file it writes when no --overheads is given "
                    "(it looks for ./poolpipe-costs.json).")
    p.add_argument("deployment", type=Path, help="a directory 'poolpipe generate' wrote (manifest.json, plan.json)")
    p.add_argument("--shares", default="0.25,0.5,0.75,1.0", metavar="S,...",
                   help="the steps' loads, as shares of the plan's promise (default: %(default)s)")
    p.add_argument("--duration-s", type=float, default=20.0, help="seconds of load per step (default: %(default)s)")
    p.add_argument("--launch", action="store_true", help="start the deployment's servers (and stop them after)")
    p.add_argument("--out", type=Path, default=Path(COSTS_FILE),
                   help="the cost model to write (default: %(default)s, where 'poolpipe plan' looks)")
    p.add_argument("--work", type=Path, help="keep each step's sidecar log and costs here (default: a temp dir)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--native-front", action="store_true",
                   help="send the steps' requests through the sidecar's native front end (serve --native-grpc-port), "
                        "for deployments served that way: the way outside the sidecar's clock is shorter there")
    p.set_defaults(func=_run)


def shares_of(text: str) -> tuple[float, ...]:
    try:
        shares = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise InputError(f"--shares {text}: expected shares of the promise such as 0.25,0.5,1") from None
    if not shares or any(not 0 < s <= 3 for s in shares):
        raise InputError(f"--shares {text}: each share must be in (0, 3]")
    return shares


def _run(args: argparse.Namespace) -> int:
    from contextlib import ExitStack

    from loadtest.calibrate import Calibration, calibration_doc
    from runtime.launch import Deployment

    shares = shares_of(args.shares)
    if args.duration_s <= 0:
        raise InputError(f"--duration-s {args.duration_s}: must be > 0")
    with ExitStack() as stack:
        work = args.work or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="poolpipe-calibrate-")))
        work.mkdir(parents=True, exist_ok=True)
        if args.launch:
            stack.enter_context(Deployment(args.deployment, check_hardware=False, log_dir=work / "servers"))
        cal = Calibration(args.deployment.resolve(), work, args.duration_s, args.seed,
                          native_front=args.native_front)
        costs, steps = cal.run(shares)
    args.out.write_text(json.dumps(calibration_doc(costs, steps, args.deployment.resolve(), cal.reserve), indent=1)
                        + "\n")
    print(f"cost model (emulated where the deployment is): lead {costs.lead_us:.0f} us + "
          f"{costs.lead_per_mb_us:.0f} us/MB + {costs.lead_per_krps_us:.0f} us per 1000 req/s; tail "
          f"{costs.tail_us:.0f} us + {costs.tail_per_mb_us:.0f} us/MB + {costs.tail_per_krps_us:.0f} us per 1000 "
          f"req/s; outside the sidecar {costs.front_at(0.5) / 1e3:.2f} ms median, p99 "
          f"{costs.front_at(0.99) / 1e3:.2f} ms "
          f"at {costs.front_rate_rps:.0f} req/s, + {costs.front_per_mb_us:.0f} us/MB + {costs.front_per_krps_us:.0f} "
          "us per 1000 req/s above it")
    print(f"wrote {args.out} ('poolpipe plan' uses it when run here without --overheads)")
    return 0
