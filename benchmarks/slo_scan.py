"""Where pooled pipelines pay: the planner's own promises (plan.json's sustainable_rps, simulated at >= 99 % SLO
attainment) across SLOs, for the systems of ``benchmarks/live_paper.py`` that the planner makes.

Per model and SLO factor (SLO = factor x the model's batch-1 latency on a whole L4), on the emulated cluster of
live_paper (4 L4 + 12 T4 by default): (a0) PPipe's nominal objective with 30 % of the SLO kept free (the old
default), (a) the sustained objective (the default), (b) np planned the same way; their promises and the ratios
a/a0 and a/b. Planned with this project's default per-stage costs (live_paper plans (a) and (b) with the costs the
sidecar measured, so its figures differ a little). Nothing is served: this says, in a few minutes, at which SLOs
each of live_paper's targets (a/a0 >= 1.15, a/b >= 1.4) can hold at all on this cluster.

    python -P benchmarks/slo_scan.py                            # centernet, convnext_large; 2.6x to 3.0x
    python -P benchmarks/slo_scan.py --models convnext_large --factors 2.4,3,3.6 --trace replay:azure-conv
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from poolpipe.paper_experiment import PaperExperiment, PaperRun, paper_spec

MODELS = "centernet-update_r50-caffe_fpn_ms-1x_coco,convnext_large"
FACTORS = "2.6,2.7,2.8,2.9,3.0"


def promises(run: PaperRun) -> dict[str, tuple[float, float]]:
    """(sustainable, nominal) req/s of each plan live_paper makes for ``run`` (its own planning steps, with the
    default costs): a0, a and b."""
    with tempfile.TemporaryDirectory(prefix="slo_scan_") as tmp:
        ex = PaperExperiment(run, Path(tmp), log=lambda _: None)
        ex.plans()
    return {name: (p.models[0].sustainable_rps or 0.0, p.models[0].throughput_rps)
            for name, p in (("a0", ex.fixed), ("a", ex.ppipe), ("b", ex.np_plan))}


def _ratio(x: float, y: float) -> str:
    return f"{x / y:.2f}x" if y > 0 else "inf"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=MODELS, help="comma list of data/ppipe models (default: %(default)s)")
    ap.add_argument("--factors", default=FACTORS, help="comma list of SLO factors (default: %(default)s)")
    ap.add_argument("--trace", default="poisson", help="the arrivals the plans must sustain: poisson, bursty:CV or "
                                                       "replay:NAME (default: %(default)s)")
    ap.add_argument("--l4", type=int, default=4)
    ap.add_argument("--t4", type=int, default=12)
    args = ap.parse_args()
    try:
        factors = [float(f) for f in args.factors.split(",")]
    except ValueError:
        ap.error(f"--factors: expected numbers separated by commas, got {args.factors!r}")
    console = Console(width=160)
    table = Table(title=f"req/s promised at >= 99 % SLO attainment (simulated by the planner), {args.trace}, "
                        f"emulated {args.l4} L4 + {args.t4} T4")
    for col in ("model", "SLO", "(a0) margin 0.3", "nominal", "(a) sustained", "nominal", "(b) np", "a/a0", "a/b"):
        table.add_column(col, justify="left" if col == "model" else "right")
    t0 = time.time()
    for model in args.models.split(","):
        for factor in factors:
            run = PaperRun(model, factor, args.l4, args.t4, trace=args.trace)
            p = promises(run)
            slo_ms = paper_spec(run).models[0].slo_us / 1e3
            console.print(f"{model} at {factor:g}x ({slo_ms:.1f} ms): a0 {p['a0'][0]:.1f}, a {p['a'][0]:.1f}, "
                          f"b {p['b'][0]:.1f} req/s", highlight=False)
            table.add_row(model, f"{factor:g}x {slo_ms:.1f} ms", f"{p['a0'][0]:.1f}", f"{p['a0'][1]:.1f}",
                          f"{p['a'][0]:.1f}", f"{p['a'][1]:.1f}", f"{p['b'][0]:.1f}", _ratio(p["a"][0], p["a0"][0]),
                          _ratio(p["a"][0], p["b"][0]))
    console.print(table)
    console.print(f"targets of live_paper: a/a0 >= 1.15, a/b >= 1.4 (simulated promises; {time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
