"""What the serving costs take from each row of a `live_paper` run, against Triton's dynamic batcher: the row's kept
ppipe plan simulated with the costs its last calibration measured (those its promise was planned with), without the
sidecar's stage-call costs (lead and tail: what a native data path would cut), and with no costs at all (nor the way
outside the sidecar's clock, which Triton's clients pay too; the better of no deadline reserve and the calibrated one),
beside what (a) and (c) held live. Issue 49 asks a/c >= 1.1 on every row; this says, row by row, whether costs or
the layout stand between. Each row's arrivals are those its trace was planned for. Simulated only, no devices.

    python -P benchmarks/cost_headroom.py --work DIR                # every finished row of live_paper --work DIR
    python -P benchmarks/cost_headroom.py --work DIR --rows repvgg  # rows whose directory starts so
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from rich.console import Console
from rich.table import Table

from plans.arrivals import parse_arrivals
from plans.plan_json import Plan, plan_from_dict
from poolpipe.paper_experiment import planner_arrivals
from poolpipe.paper_rows import ROW_FILE, held, result_of
from poolpipe_common.overheads import Overheads, read_overheads
from scheduler.sim.sustain import Precision, simulated_rps

GOAL = 1.1  # issue 49: the default plan >= 1.1x Triton's dynamic batcher on every row
VARIANTS = ("calibrated", "no stage-call costs", "no costs")


def without(costs: Overheads) -> dict[str, tuple[Overheads, ...]]:
    """Per variant, the costs to simulate (the variant's figure is the best of them): the calibrated costs; without
    the sidecar's per-call lead and tail; with nothing at all, both with no deadline reserve and with the calibrated
    one (front_us, the way outside the sidecar's clock then taking no time): a policy may hold more with its
    deadlines earlier than they need be (the reserve `poolpipe calibrate` chooses), so neither alone bounds it."""
    calls = replace(costs, lead_us=0.0, tail_us=0.0, lead_shape=(), tail_shape=(), lead_per_mb_us=0.0,
                    tail_per_mb_us=0.0, lead_per_krps_us=0.0, tail_per_krps_us=0.0)
    reserve_only = Overheads(front_us=costs.front_us, front_quantiles_us=(0.0, 0.0))
    return dict(zip(VARIANTS, ((costs,), (calls,), (Overheads(), reserve_only)), strict=True))


def last_costs(row: Path) -> Path | None:
    """The costs file of the row's last calibration round (calibration-steps-N/costs.json, N largest)."""
    found = [p for p in row.glob("calibration-steps-*/costs.json") if p.parent.name.rsplit("-", 1)[1].isdigit()]
    return max(found, key=lambda p: int(p.parent.name.rsplit("-", 1)[1]), default=None)


def read_row(row: Path) -> tuple[dict, Plan, Overheads, str] | str:
    """(the row as run_all's result, the plan (a) served, its calibrated costs, the arrivals its trace was planned
    for), or why the row cannot be read."""
    costs = last_costs(row)
    need = [row / ROW_FILE, row / "ppipe" / "manifest.json"]
    missing = [str(p.relative_to(row)) for p in need if not p.is_file()] + ([] if costs else ["calibration costs"])
    if missing:
        return f"no {', '.join(missing)}"
    try:
        doc = json.loads(need[0].read_text())
        plan = plan_from_dict(json.loads(need[1].read_text())["plan"], str(need[1]))
        return result_of(doc), plan, read_overheads(costs), planner_arrivals(doc["run"]["trace"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        return f"unreadable: {e}"


def measure(row: dict, plan: Plan, costs: Overheads, arrivals: str, fidelity: float) -> dict:
    """One row's live figures and its plan's simulated rate under each variant of its costs (req/s), with the
    arrivals its trace was planned for."""
    def rate(c: Overheads) -> float:
        return sum(simulated_rps(plan, parse_arrivals(arrivals), c, Precision(fidelity=fidelity)).values())

    sims = {name: max(rate(c) for c in each) for name, each in without(costs).items()}
    return {"a": held(row, "ppipe"), "c": held(row, "triton-native"), **sims}


def ratio(x: float, c: float) -> str:
    return f"{x:,.0f} ({x / c:.2f}x)" if c > 0 else f"{x:,.0f}"


def table(results: dict[str, dict]) -> Table:
    t = Table(title="(a)'s plan simulated with its costs and without them, against (c) Triton's batcher live (req/s)")
    for col in ("row", "(a) live", "(c) live", "a/c", *(f"sim, {v}" for v in VARIANTS)):
        t.add_column(col, justify="left" if col == "row" else "right")
    for name, r in results.items():
        t.add_row(name, f"{r['a']:,.0f}", f"{r['c']:,.0f}", f"{r['a'] / r['c']:.2f}x" if r["c"] > 0 else "-",
                  *(ratio(r[v], r["c"]) for v in VARIANTS))
    return t


def summary(results: dict[str, dict]) -> str:
    """How many rows reach GOAL x (c): live, and simulated under each variant of the costs."""
    rows = [r for r in results.values() if r["c"] > 0]
    counts = [sum(r["a"] >= GOAL * r["c"] for r in rows)] + [sum(r[v] >= GOAL * r["c"] for r in rows) for v in VARIANTS]
    sims = "; ".join(f"simulated, {v}: {n}" for v, n in zip(VARIANTS, counts[1:], strict=True))
    return f"a/c >= {GOAL}: live {counts[0]} of {len(rows)} rows; {sims}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--work", required=True, type=Path, help="a live_paper --work directory (one folder per row)")
    ap.add_argument("--rows", default="", help="only rows whose folder name starts with one of these (comma list)")
    ap.add_argument("--fidelity", type=float, default=0.5,
                    help="simulated points this fraction of the planner's full length (default 0.5)")
    args = ap.parse_args(argv)
    if not 0 < args.fidelity <= 1:
        ap.error("--fidelity: give a fraction in (0, 1]")
    prefixes = tuple(p for p in args.rows.split(",") if p) or ("",)
    dirs = sorted(d for d in args.work.glob("*") if d.is_dir() and d.name.startswith(prefixes))
    console = Console(width=max(Console().width, 160))
    results: dict[str, dict] = {}
    for d in dirs:
        read = read_row(d)
        if isinstance(read, str):
            console.print(f"{d.name}: skipped ({read})")
            continue
        with console.status(f"simulating {d.name}"):
            results[d.name] = measure(*read, args.fidelity)
    if not results:
        ap.error(f"--work {args.work}: no finished live_paper row there (each row's folder holds {ROW_FILE}, "
                 "ppipe/manifest.json and calibration-steps-N/costs.json)")
    console.print(table(results))
    console.print(summary(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
