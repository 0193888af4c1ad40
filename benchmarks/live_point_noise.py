"""Does a live point's result depend on the points measured before it, or on the host? One model's sustained ppipe
plan (planned with the default costs) served live on emulated 4 L4 + 12 T4 in real time, one load point measured
again and again with a fresh sidecar each time, as live_paper measures, after an easy point (half the promise) and
after an overloaded one (1.2x the promise) in turn. Every point offers the same arrivals to the same deployment.

Printed: each point's SLO attainment and how many of the host's CPUs were busy meanwhile (loadtest.host_cpu: all
processes, the system under test and its client included); the mean attainment after each kind of point; and the
rank correlation of attainment with host CPU. The same work taking more CPU means a slower host, so a strong negative
correlation with no gap between the two kinds of point says the host, not the order, moves the result.

    python -P benchmarks/live_point_noise.py                           # tf_efficientdet_d1 at 2.5x, 8 pairs, ~3 min
    python -P benchmarks/live_point_noise.py --model convnext_large@3 --pairs 4 --at 0.9
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

BEFORE = {"easy": 0.5, "overloaded": 1.2}  # of the promise: the points measured before each repeat of the point


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tf_efficientdet_d1@2.5", help="MODEL@SLO_FACTOR (default: %(default)s)")
    ap.add_argument("--pairs", type=int, default=8, help="(easy or overloaded point, the point) pairs")
    ap.add_argument("--at", type=float, default=0.85, help="the point, as a share of the plan's promise")
    ap.add_argument("--duration-s", type=float, default=6.0, help="seconds of load per point (live_paper's)")
    args = ap.parse_args()
    lo, hi = BEFORE["easy"], BEFORE["overloaded"]
    if args.pairs < 2 or not lo < args.at < hi:
        ap.error(f"--pairs must be >= 2 and --at between {lo:g} and {hi:g} (the easy and overloaded points)")
    model, factor = model_entry(ap, args.model, "--model")
    console = Console(width=160)
    with tempfile.TemporaryDirectory(prefix="live_point_noise_") as tmp:
        exp = FixedPoints(PaperRun(model, factor, 4, 12, duration_s=args.duration_s,
                                   native_front=native_front_built("live_point_noise")), Path(tmp), console.print)
        exp.plan_fixed()
        exp.plan_sustained()
        promise = exp.promise_lf(exp.ppipe)
        point = round(args.at * promise, 4)
        after = ["easy" if i % 2 == 0 else "overloaded" for i in range(args.pairs)]  # what comes before each repeat
        exp.sequence = tuple(x for kind in after for x in (round(BEFORE[kind] * promise, 4), point))
        exp.measure_sidecar("ppipe", exp.ppipe)
    records = exp.records  # in the order measured: (before, point) pairs
    console.print(_table(records, after))
    for line in _summary(records[1::2], after, promise * exp.rate):
        console.print(line)


def _table(records: list[dict], after: list[str]) -> Table:
    t = Table(title="one load point, again and again, live (emulated 4 L4 + 12 T4)")
    for col in ("#", "after", "req/s", "attainment", "host busy (cores)", "p99 ms"):
        t.add_column(col, justify="right")
    for i, r in enumerate(records):
        t.add_row(str(i), after[i // 2] if i % 2 else "", f"{r['offered_rps']:.1f}", f"{100 * r['attainment']:.2f} %",
                  _cores(r["host_busy_cores"]), f"{r['p99_ms'] or 0:.1f}")
    return t


def _summary(points: list[dict], after: list[str], promise_rps: float) -> list[str]:
    att = np.array([p["attainment"] for p in points])
    after_easy = att[[k == "easy" for k in after]]
    after_over = att[[k == "overloaded" for k in after]]
    lines = [f"at {points[0]['offered_rps']:.1f} req/s (promise {promise_rps:.1f}), {len(att)} points: attainment "
             f"{100 * att.min():.2f}-{100 * att.max():.2f} %; mean {100 * after_easy.mean():.2f} % after an easy "
             f"point, {100 * after_over.mean():.2f} % after an overloaded one"]
    busy = [p["host_busy_cores"] for p in points]
    if None not in busy:
        lines.append(f"host busy {min(busy):.2f}-{max(busy):.2f} cores for the same work; rank correlation of "
                     f"attainment with it {_spearman(att, np.array(busy)):+.2f}")
    return lines


def _spearman(x: np.ndarray, y: np.ndarray) -> float:
    rx, ry = np.argsort(np.argsort(x)), np.argsort(np.argsort(y))
    return float(np.corrcoef(rx, ry)[0, 1])


def _cores(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


if __name__ == "__main__":
    main()
