"""How long `poolpipe plan` takes with the default objective, and whether the same request gives the same plan: the
issue's two timing specs, each planned as a user would (`poolpipe plan --spec SPEC --out plan.json`, a fresh process,
wall time), twice with the default workers and once with `--jobs 1`; the plans compared field by field (all but
the seconds each solve took). Simulated (the planner's own simulator; no devices).

- one model: atss_r101_fpn_1x_coco at 3x its batch-1 L4 latency on 4 L4 + 12 T4 (as `live_paper` plans it, margin 0);
- three models: the maf19 L4+T4 ppipe entry of data/ppipe (apcnet, atss, gcnet) on 25 L4 + 75 T4, margins 0.

    python -P benchmarks/plan_time.py            # both specs (about a minute and a half on 2 cores)
    python -P benchmarks/plan_time.py --quick    # the one-model spec only
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from planner.ppipe.reference_plans import load_reference_plans, spec_from_reference
from plans.spec.planning_spec import PlanningSpec
from poolpipe.paper_experiment import PaperRun, paper_spec

TARGETS = {"one model": 3.0, "three models": 15.0}  # seconds of wall time, the targets on 2 cores


def one_model() -> PlanningSpec:
    return paper_spec(PaperRun("atss_r101_fpn_1x_coco", 3.0, l4=4, t4=12), slo_margin=0.0)


def three_models() -> PlanningSpec:
    entry = next(e for e in load_reference_plans() if e["suite"] == "maf19" and e.get("planner", "ppipe") == "ppipe"
                 and tuple(e["cluster"]["gpu_name_arr"]) == ("L4", "T4"))
    spec = spec_from_reference(entry)
    return dataclasses.replace(spec, models=tuple(dataclasses.replace(m, slo_margin_us=0.0) for m in spec.models))


def write_spec(spec: PlanningSpec, path: Path) -> Path:
    """The spec as `poolpipe plan --spec` reads it, each profile inline."""
    doc = spec.to_dict()
    for m, ms in zip(doc["models"], spec.models, strict=True):
        m["profile"] = ms.profile.to_dict()
    path.write_text(json.dumps(doc))
    return path


def timed_plan(spec: Path, out: Path, jobs: int | None) -> float:
    """Wall seconds of one `poolpipe plan` process (it fails loudly)."""
    cmd = [sys.executable, "-P", "-m", "poolpipe", "plan", "--spec", str(spec), "--out", str(out)]
    t0 = time.perf_counter()
    subprocess.run(cmd + (["--jobs", str(jobs)] if jobs else []), check=True, capture_output=True, text=True)
    return time.perf_counter() - t0


def without_seconds(x):
    """A plan document without the solve times (the only fields that differ between equal plans)."""
    if isinstance(x, dict):
        return {k: without_seconds(v) for k, v in x.items() if not k.endswith("seconds")}
    if isinstance(x, list):
        return [without_seconds(v) for v in x]
    return x


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="the one-model spec only")
    args = ap.parse_args()
    cases = {"one model": one_model} if args.quick else {"one model": one_model, "three models": three_models}
    table = Table(title="poolpipe plan, default objective (wall time, simulated promises)")
    for col in ("spec", "run 1", "run 2", "--jobs 1", "target", "same plan", "promise (req/s)"):
        table.add_column(col, justify="left" if col == "spec" else "right")
    lines = []
    with tempfile.TemporaryDirectory(prefix="plan_time_") as tmp:
        for name, build in cases.items():
            spec = write_spec(build(), Path(tmp) / f"{name.replace(' ', '_')}.json")
            outs = [Path(tmp) / f"{spec.stem}-{i}.json" for i in range(3)]
            secs = [timed_plan(spec, out, jobs) for out, jobs in zip(outs, (None, None, 1), strict=True)]
            plans = [json.loads(p.read_text()) for p in outs]
            same = all(without_seconds(p) == without_seconds(plans[0]) for p in plans[1:])
            promise = ", ".join(f"{m['sustainable_rps']:.1f}" for m in plans[0]["models"])
            table.add_row(name, *(f"{s:.2f} s" for s in secs), f"<= {TARGETS[name]:g} s", "yes" if same else "NO",
                          promise)
            lines.append(f"{name}: {min(secs[:2]):.2f}-{max(secs[:2]):.2f} s (target <= {TARGETS[name]:g} s), "
                         f"--jobs 1 {secs[2]:.2f} s, {'the same plan' if same else 'DIFFERENT plans'}")
    console = Console(width=160)
    console.print(table)
    console.print("; ".join(lines))


if __name__ == "__main__":
    main()
