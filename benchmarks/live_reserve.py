"""Does the deadline's reserve for the way outside the sidecar's clock (`serve --front-us`) move what a plan holds live?
One model's sustained ppipe plan (default costs) served on emulated 4 L4 + 12 T4 in real time, one load point measured
again and again with a fresh sidecar each time, as live_paper measures, the reserve alternating between two values
point by point, so that the host's speed, which moves over minutes, weighs on both alike.

Printed: each point's SLO attainment, sheds (explicit errors), late answers and how many of the host's CPUs were busy;
per reserve the mean and range of attainment; and in how many pairs the first reserve held more than the second.

    python -P benchmarks/live_reserve.py                     # googlenet-v3 at 2.5x, 1000 vs 2000 us, ~2 min
    python -P benchmarks/live_reserve.py --model convnext_large@3 --at 0.95 --pairs 4
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from poolpipe.experiment_cases import model_entry, native_front_built
from poolpipe.paper_experiment import FixedPoints, PaperRun


class AlternatingReserve(FixedPoints):
    """FixedPoints whose sidecars keep ``reserves`` in turn, point by point."""

    reserves: tuple[float, ...] = (1000.0, 2000.0)

    def reserve_of(self, k: int) -> float:
        return self.reserves[k % len(self.reserves)]

    def sidecar_args(self) -> tuple[str, ...]:
        return ("--front-us", f"{self.reserve_of(len(self.records)):g}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="googlenet-v3-pytorch@2.5", help="MODEL@SLO_FACTOR (default: %(default)s)")
    ap.add_argument("--reserves", default="1000,2000", help="two reserves in us, alternated (default: %(default)s)")
    ap.add_argument("--pairs", type=int, default=5, help="points per reserve (default: %(default)s)")
    ap.add_argument("--at", type=float, default=0.95, help="the point, as a share of the plan's promise")
    ap.add_argument("--duration-s", type=float, default=6.0, help="seconds of load per point (live_paper's)")
    args = ap.parse_args()
    try:
        reserves = tuple(float(x) for x in args.reserves.split(","))
    except ValueError:
        ap.error(f"--reserves {args.reserves}: expected two numbers of microseconds, such as 1000,2000")
    if len(reserves) != 2 or min(reserves) < 0 or args.pairs < 1 or not 0 < args.at <= 2:
        ap.error("--reserves takes two reserves >= 0, --pairs >= 1 and --at a share of the promise in (0, 2]")
    model, factor = model_entry(ap, args.model, "--model")
    console = Console(width=160)
    with tempfile.TemporaryDirectory(prefix="live_reserve_") as tmp:
        exp = AlternatingReserve(PaperRun(model, factor, 4, 12, duration_s=args.duration_s,
                                          native_front=native_front_built("live_reserve")), Path(tmp), console.print)
        exp.reserves = reserves
        exp.plan_fixed()
        exp.plan_sustained()
        exp.sequence = (round(args.at * exp.promise_lf(exp.ppipe), 4),) * (2 * args.pairs)
        exp.measure_sidecar("ppipe", exp.ppipe)
    console.print(_table(exp))
    console.print(_summary(exp))


def _table(exp: AlternatingReserve) -> Table:
    t = Table(title="one load point, the deadline's reserve alternating, live (emulated 4 L4 + 12 T4)")
    for col in ("#", "reserve (us)", "req/s", "attainment", "shed", "late", "host busy (cores)"):
        t.add_column(col, justify="right")
    for k, r in enumerate(exp.records):
        busy = r["host_busy_cores"]
        t.add_row(str(k), f"{exp.reserve_of(k):g}", f"{r['offered_rps']:.1f}", f"{100 * r['attainment']:.2f} %",
                  str(r["errors"]), str(r["late"]), "-" if busy is None else f"{busy:.2f}")
    return t


def _summary(exp: AlternatingReserve) -> str:
    att = np.array([r["attainment"] for r in exp.records])
    first, second = att[0::2], att[1::2]  # as many of each: the point is measured twice per pair
    per = "; ".join(f"reserve {exp.reserve_of(k):g} us: mean {100 * a.mean():.2f} % ({100 * a.min():.2f}-"
                    f"{100 * a.max():.2f})" for k, a in ((0, first), (1, second)))
    return (f"at {exp.records[0]['offered_rps']:.1f} req/s, {len(first)} pairs: {per}; {exp.reserve_of(0):g} us held "
            f"more in {int((first > second).sum())} of {len(first)} pairs")


if __name__ == "__main__":
    main()
