"""Plan quality and solve time against the published (Gurobi) reference plans, on identical terms.

Plans every ``ablation`` and ``maf19`` entry of data/ppipe/reference-plans.json with the entry's own
planner (ppipe, np or dart-r) on the spec built from the entry (profiling.reference.spec_from_reference:
GPU counts, NIC sharing, bandwidth, vGPU levels, max partitions, SLO, SLO margin, batch-forming wait,
workload weights), and prints per entry our objective / the reference's (one model: throughput;
several: the smallest throughput/weight) and the solve seconds; then the minimum ratio and the
median solve time.

    .venv/bin/python benchmarks/planner.py [--solver highs] [--suite ablation,maf19] [--planner ppipe]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table
from tqdm import tqdm

from planner.reference_plans import load_reference_plans, spec_from_reference
from planner.solve import solve_spec
from profiling.reference import import_ppipe_profile

SHORT = {"apcnet_r101-d8_4xb2-40k_cityscapes-512x1024": "apcnet", "atss_r101_fpn_1x_coco": "atss",
         "centernet-update_r50-caffe_fpn_ms-1x_coco": "centernet", "colorization-v2": "colorization",
         "convnext_large": "convnext", "dnl_r101-d8_4xb2-40k_cityscapes-512x1024": "dnl",
         "fsaf_r101_fpn_1x_coco": "fsaf", "gcnet_r101-d8_4xb2-40k_cityscapes-512x1024": "gcnet",
         "googlenet-v3-pytorch": "googlenet", "nonlocal_r101-d8_4xb2-40k_cityscapes-512x1024": "nonlocal",
         "repvgg-b3": "repvgg", "tf_efficientdet_d1": "effdet"}


def reference_objective(entry: dict, weights: list[float]) -> float:
    return min(m["throughput_rps"] / w for m, w in zip(entry["models"], weights))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--solver", default="highs", choices=("highs", "cbc", "gurobi"))
    ap.add_argument("--suite", default="ablation,maf19", help="comma-separated suites")
    ap.add_argument("--planner", default="ppipe,np,dart-r", help="comma-separated planners")
    ap.add_argument("--time-limit", type=float, default=None, help="per-entry solver time limit (s)")
    args = ap.parse_args(argv)
    suites, planners = args.suite.split(","), args.planner.split(",")
    entries = [(i, e) for i, e in enumerate(load_reference_plans())
               if e["suite"] in suites and e["planner"] in planners]
    profiles: dict = {}
    rows = []
    for i, e in tqdm(entries, desc="planning reference entries", unit="entry", file=sys.stderr):
        for m in e["models"]:
            profiles.setdefault(m["model"], None) or profiles.__setitem__(
                m["model"], import_ppipe_profile(Path(__file__).resolve().parent.parent / "data" / "ppipe", m["model"]))
        spec = spec_from_reference(e, profiles)
        t = time.perf_counter()
        plan = solve_spec(spec, e["planner"], args.solver, args.time_limit)
        secs = time.perf_counter() - t
        ref = reference_objective(e, [m.weight for m in spec.models])
        rows.append((i, e, plan, ref, secs))

    con = Console(width=140)
    tab = Table(title=f"planner vs published reference plans ({args.solver})", title_justify="left")
    for col in ("#", "suite", "planner", "models", "cluster", "ours", "reference", "ratio", "solve s", "status"):
        tab.add_column(col, justify="right" if col in ("#", "ours", "reference", "ratio", "solve s") else "left")
    for i, e, plan, ref, secs in rows:
        c = e["cluster"]
        cluster = "+".join(f"{n}x{g}" for g, n in zip(c["gpu_name_arr"], c["gpu_counts"]))
        models = ",".join(SHORT.get(m["model"], m["model"]) for m in e["models"])
        ratio = plan.objective / ref
        style = "" if ratio >= 0.999 else "red"
        tab.add_row(str(i), e["suite"], e["planner"], models, cluster, f"{plan.objective:,.2f}", f"{ref:,.2f}",
                    f"[{style}]{ratio:.5f}[/{style}]" if style else f"{ratio:.5f}", f"{secs:.2f}", plan.status)
    con.print(tab)

    def summary(name: str, sel: list) -> None:
        if not sel:
            return
        ratios = [p.objective / r for _, _, p, r, _ in sel]
        secs = [s for *_, s in sel]
        worst = min(sel, key=lambda x: x[2].objective / x[3])
        print(f"{name:>8}: {len(sel):3d} entries  min ratio {min(ratios):.5f} (entry {worst[0]})  "
              f"median solve {statistics.median(secs):.3f} s  max solve {max(secs):.2f} s  "
              f"over 60 s: {sum(s > 60 for s in secs)}")

    print("\nsummary (ratio = ours / reference; several models: smallest throughput/weight)")
    for p in ("ppipe", "np", "dart-r"):
        summary(p, [r for r in rows if r[1]["planner"] == p])
    summary("all", rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
