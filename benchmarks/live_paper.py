"""The PPipe comparison served live on an emulated L4 + T4 cluster (PPipe's measured profiles, data/ppipe).

Per model and arrival trace: the ppipe plan through the sidecar (a), the np plan through the sidecar (b),
Triton-native (c: the np plan's whole-model servers with Triton's dynamic batcher, round-robin), and the
simulator's prediction of (a) and (b) (d). Printed: each system's max load factor at >= 99 % SLO
attainment (steps of 0.05; 1.0 = the ppipe plan's throughput) and the ratios a/c, a/b, a/d. All devices
are emulated (real tritonservers that hold each batch for its profiled latency) on 4 L4 + 12 T4, in slow
motion (latencies and SLO x the time scale, rates / it; load factors unchanged) so that the per-request CPU
costs of this 2-core machine weigh on the emulated cluster as little as on a real one; plans keep 30 % of
the SLO free for queueing.

    python -P benchmarks/live_paper.py --duration-s 15     # 2 models x (poisson, replay:azure-conv), ~25 min
    python -P benchmarks/live_paper.py --quick             # one model, poisson, 3 s points
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from poolpipe.paper_experiment import PaperRun, run_all

# Two families: a one-stage detector and a classification CNN, at SLOs where the T4 cannot serve the
# whole model alone (so np idles the T4s and ppipe pools them).
MODELS = {"centernet-update_r50-caffe_fpn_ms-1x_coco": 3.0, "convnext_large": 3.0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="one model, poisson only, 3 s per point")
    ap.add_argument("--models", default=",".join(MODELS), help="comma list of data/ppipe models")
    ap.add_argument("--traces", default="poisson,replay:azure-conv", help="comma list of --trace values")
    ap.add_argument("--duration-s", type=float, default=6.0, help="seconds of load per point")
    ap.add_argument("--slo-factor", type=float, help="SLO = this x the batch-1 latency on L4 (default per model)")
    ap.add_argument("--slo-margin", type=float, default=PaperRun.slo_margin,
                    help="share of the SLO the plans keep free for queueing (default: %(default)s)")
    ap.add_argument("--l4", type=int, default=4)
    ap.add_argument("--t4", type=int, default=12)
    ap.add_argument("--time-scale", type=float, default=0.0,
                    help="slow motion: latencies and SLO x this, request rates / this (load factors unchanged); "
                         "0 = auto: >= 8 and the ppipe plan at <= 50 req/s (default)")
    ap.add_argument("--work", type=Path, help="keep deployments and logs here (default: a temporary directory)")
    args = ap.parse_args()
    models = args.models.split(",")[:1] if args.quick else args.models.split(",")
    traces = ["poisson"] if args.quick else args.traces.split(",")
    duration = 3.0 if args.quick else args.duration_s
    console = Console(width=200)
    rows = []
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="live_paper_") as tmp:
        work = args.work or Path(tmp)
        for model in models:
            for trace in traces:
                factor = args.slo_factor or MODELS.get(model, 3.0)
                run = PaperRun(model, factor, args.l4, args.t4, trace=trace, duration_s=duration,
                               time_scale=args.time_scale, slo_margin=args.slo_margin)
                console.print(f"[bold]{model}[/bold], {trace} (emulated {args.l4} L4 + {args.t4} T4)")
                res = run_all(run, work / f"{model}-{trace.replace(':', '_')}", console.print)
                rows.append((model, trace, res))
    table = Table(title="max load factor at >= 99 % SLO attainment (emulated devices; 1.0 = ppipe plan)")
    for col in ("model", "trace", "(a) ppipe", "(b) np", "(c) triton", "(d) sim ppipe", "sim np", "a/c", "a/b",
                "a/d"):
        table.add_column(col, justify="right" if col[0] in "(asd" else "left")
    for model, trace, r in rows:
        a, b, c, d = r["ppipe"].max_lf, r["np"].max_lf, r["triton-native"].max_lf, r["sim-ppipe"].max_lf
        table.add_row(model, trace, f"{a:.2f}", f"{b:.2f}", f"{c:.2f}", f"{d:.2f}", f"{r['sim-np'].max_lf:.2f}",
                      _ratio(a, c), _ratio(a, b), _ratio(a, d))
    console.print(table)
    console.print(f"targets: a/c >= 1.4, a/b >= 1.3, a/d >= 0.95; total {time.time() - t0:.0f} s")


def _ratio(x: float, y: float) -> str:
    return f"{x / y:.2f}x" if y > 0 else "inf"


if __name__ == "__main__":
    main()
