"""Planner quality and solve time: the published (Gurobi) reference plans, and a stress suite.

Suites (each case planned as a user would, with the CLI's default time limit and gap):

- ``ablation``, ``maf19``, ``maf21``: every reference entry of data/ppipe/reference-plans.json with
  the entry's own planner (ppipe, np or dart-r) on the spec built from the entry
  (planner.ppipe.reference_plans.spec_from_reference); best known = the published plan.
- ``stress``: every model of data/ppipe on every high+low pair of its GPU types (L4 or V100 with T4
  or P4: 25 high + 75 low, 3 partitions, vGPU levels up to 4 (P4: 1), batch unification on; NICs as
  in the reference entries of that pair, SLO, margin and batch-forming wait as in the model's
  ablation entry), with ppipe; plus the multi-model groups at 2 partitions (the ppipe entries of
  maf19 and maf21). Best known = the reference where the same problem has one (L4+T4 and the
  groups), else an unlimited solve: a run proven within the gap is that solve's result; a run
  stopped by the time limit is solved again without one.

Printed per case: our objective / best known (one model: throughput; several: the smallest
throughput/weight), solve seconds and status; per suite: min ratio, median and max solve time.

    python -m benchmarks.planner_bench [--suite ablation,maf19,maf21,stress] [--planner ppipe,np,dart-r]
                                 [--time-limit 60] [--gap 1e-4] [--solver highs] [--only fsaf,25xL4]

(``python -m`` or ``python -P``: run as a plain script, this file's own name would shadow the planner package.)
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from dataclasses import dataclass, replace

from rich.console import Console
from rich.table import Table
from tqdm import tqdm

from planner.entry import plan as plan_spec
from planner.ppipe.reference_plans import load_reference_plans, spec_from_reference
from planner.request import PlanRequest
from plans.plan_json import Plan
from plans.spec.planning_spec import PlanningSpec
from profiling.reference import REFERENCE_DIR, import_ppipe_profile

SHORT = {"apcnet_r101-d8_4xb2-40k_cityscapes-512x1024": "apcnet", "atss_r101_fpn_1x_coco": "atss",
         "centernet-update_r50-caffe_fpn_ms-1x_coco": "centernet", "colorization-v2": "colorization",
         "convnext_large": "convnext", "dnl_r101-d8_4xb2-40k_cityscapes-512x1024": "dnl",
         "fsaf_r101_fpn_1x_coco": "fsaf", "gcnet_r101-d8_4xb2-40k_cityscapes-512x1024": "gcnet",
         "googlenet-v3-pytorch": "googlenet", "nonlocal_r101-d8_4xb2-40k_cityscapes-512x1024": "nonlocal",
         "repvgg-b3": "repvgg", "tf_efficientdet_d1": "effdet"}
HIGH, LOW = ("L4", "V100"), ("T4", "P4")


@dataclass(frozen=True)
class Case:
    """One planning problem with the best objective known for it (None: find it by an unlimited solve)."""

    suite: str
    planner: str
    label: str
    cluster: str
    spec: PlanningSpec
    reference: float | None


@dataclass(frozen=True)
class Row:
    case: Case
    plan: Plan
    seconds: float
    best: float

    @property
    def ratio(self) -> float:
        return self.plan.objective / self.best


def reference_objective(entry: dict, spec: PlanningSpec) -> float:
    return min(m["throughput_rps"] / ms.weight for m, ms in zip(entry["models"], spec.models))


def _label(entry: dict) -> tuple[str, str]:
    c = entry["cluster"]
    return (",".join(SHORT.get(m["model"], m["model"]) for m in entry["models"]),
            "+".join(f"{n}x{g}" for g, n in zip(c["gpu_name_arr"], c["gpu_counts"])))


def reference_cases(entries: list[dict], suites: list[str], planners: list[str], profiles: dict) -> list[Case]:
    out = []
    for e in entries:
        if e["suite"] in suites and e["planner"] in planners:
            spec = spec_from_reference(e, profiles)
            out.append(Case(e["suite"], e["planner"], *_label(e), spec, reference_objective(e, spec)))
    return out


def _on_pair(entry: dict, names: tuple[str, str], cluster: dict) -> dict:
    """The model's ablation entry moved to another GPU pair: 3 partitions, vGPU levels 4 (P4: 1)."""
    e = copy.deepcopy(entry)
    e["cluster"] = {**cluster, "max_num_parts": 3, "bs_same": True,
                    "num_mps_levels": [1 if g == "P4" else 4 for g in names]}
    return e


def stress_cases(entries: list[dict], profiles: dict) -> list[Case]:
    """Every model on every high+low pair (3 partitions), then the multi-model groups at 2 partitions."""
    ablation = {e["models"][0]["model"]: e for e in entries if e["suite"] == "ablation" and e["planner"] == "ppipe"}
    pairs: dict[tuple[str, str], dict] = {}
    for e in entries:
        names = tuple(e["cluster"]["gpu_name_arr"])
        if e["suite"] == "maf19" and e["planner"] == "ppipe" and names[0] in HIGH and names[1] in LOW:
            pairs.setdefault(names, e["cluster"])
    out = []
    for names, cluster in sorted(pairs.items()):
        for _model, e in sorted(ablation.items()):
            spec = spec_from_reference(_on_pair(e, names, cluster), profiles)
            own = spec_from_reference(e, profiles)  # a reference exists if this is the ablation problem itself
            same = (spec.cluster, spec.max_partitions, spec.batch_unification) == (
                own.cluster, own.max_partitions, own.batch_unification)
            out.append(Case("stress", "ppipe", *_label(_on_pair(e, names, cluster)), spec,
                            reference_objective(e, spec) if same else None))
    for e in entries:
        if e["suite"] in ("maf19", "maf21") and e["planner"] == "ppipe":
            spec = spec_from_reference(e, profiles)
            out.append(Case("stress", "ppipe", *_label(e), spec, reference_objective(e, spec)))
    return out


def run_case(case: Case, args: argparse.Namespace) -> Row:
    t = time.perf_counter()
    request = PlanRequest(case.planner, objective="throughput", evaluator="none", solver=args.solver,
                          time_limit_s=args.time_limit or None, gap=args.gap)  # the paper's nominal objective
    plan = plan_spec(case.spec, request).plan
    secs = time.perf_counter() - t
    best = case.reference
    if best is None:  # what an unlimited solve finds: this run if it was proven, else a run without a limit
        best = plan.objective if plan.status == "optimal" else plan_spec(
            case.spec, replace(request, time_limit_s=None)).plan.objective
    return Row(case, plan, secs, best)


def table(rows: list[Row], solver: str) -> Table:
    tab = Table(title=f"planner vs best known plans ({solver})", title_justify="left")
    for col in ("suite", "planner", "models", "cluster", "ours", "best known", "ratio", "solve s", "status"):
        tab.add_column(col, justify="right" if col in ("ours", "best known", "ratio", "solve s") else "left")
    for r in rows:
        ratio = f"{r.ratio:.5f}" if r.ratio >= 0.999 else f"[red]{r.ratio:.5f}[/red]"
        tab.add_row(r.case.suite, r.case.planner, r.case.label, r.case.cluster, f"{r.plan.objective:,.2f}",
                    f"{r.best:,.2f}" + ("" if r.case.reference is not None else " *"), ratio, f"{r.seconds:.2f}",
                    r.plan.status)
    return tab


def summary(name: str, rows: list[Row]) -> str:
    secs = [r.seconds for r in rows]
    worst = min(rows, key=lambda r: r.ratio)
    return (f"{name:>16}: {len(rows):3d} cases  min ratio {worst.ratio:.5f} ({worst.case.label} on "
            f"{worst.case.cluster})  median solve {statistics.median(secs):.3f} s  max solve {max(secs):.2f} s  "
            f"stopped by the limit: {sum(r.plan.status != 'optimal' for r in rows)}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--solver", default="highs", choices=("highs", "cbc", "gurobi"))
    ap.add_argument("--suite", default="ablation,maf19,maf21,stress", help="comma-separated suites")
    ap.add_argument("--planner", default="ppipe,np,dart-r", help="planners of the reference suites")
    ap.add_argument("--time-limit", type=float, default=60.0, help="per-case time limit, s (0: none; default 60)")
    ap.add_argument("--gap", type=float, default=1e-4, help="relative MIP gap (default 1e-4)")
    ap.add_argument("--only", default="", help="comma-separated substrings; keep cases whose models+cluster match one")
    args = ap.parse_args(argv)
    suites, planners = args.suite.split(","), args.planner.split(",")
    entries = load_reference_plans()
    models = sorted({m["model"] for e in entries for m in e["models"]})
    profiles = {m: import_ppipe_profile(REFERENCE_DIR, m) for m in models}
    cases = reference_cases(entries, [s for s in suites if s != "stress"], planners, profiles)
    cases += stress_cases(entries, profiles) if "stress" in suites else []
    if args.only:
        cases = [c for c in cases if any(w in f"{c.label} on {c.cluster}" for w in args.only.split(","))]
    rows = [run_case(c, args) for c in tqdm(cases, desc="planning", unit="case", file=sys.stderr)]
    Console(width=150).print(table(rows, args.solver))
    print("\n* best known from an unlimited solve (no reference plan for that problem)")
    print(f"summary (ratio = ours / best known; time limit {args.time_limit:g} s, gap {args.gap:g})")
    for name in sorted({(r.case.suite, r.case.planner) for r in rows}):
        print(summary(f"{name[0]} {name[1]}", [r for r in rows if (r.case.suite, r.case.planner) == name]))
    for suite in sorted({r.case.suite for r in rows}):
        print(summary(suite, [r for r in rows if r.case.suite == suite]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
