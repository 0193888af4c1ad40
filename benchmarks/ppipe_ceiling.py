"""How much more than np any pooled pipeline could serve on `live_paper`'s cluster, and what bounds it: per model and
SLO factor of `live_paper --models all` (4 L4 + 12 T4, PPipe's profiles), the MILP's optimum of ppipe and of np for
the throughput objective with no margin and no serving costs (PPipe's nominal rate: the most either could promise), at
the reference's NIC bandwidth (10 Gbps) and at others; with `--sustained`, also both planned for the rate they sustain
(the default objective and costs, Poisson; simulated) at each. Whether a T4 can run the model whole within the SLO says
where np idles the T4s. Planned only (no devices).

    python -P benchmarks/ppipe_ceiling.py                    # nominal, 10 and 100 Gbps (about 30 s on 2 cores)
    python -P benchmarks/ppipe_ceiling.py --sustained        # and sustained at both (about 12 min)
    python -P benchmarks/ppipe_ceiling.py --models gcnet@3 --bandwidths 10,25,100
    python -P benchmarks/ppipe_ceiling.py --models repvgg@4,convnext@5 --bandwidths 10    # other SLO factors
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from rich.console import Console
from rich.table import Table

from planner.entry import plan
from planner.request import PlanRequest
from plans.spec.planning_spec import PlanningSpec
from poolpipe.experiment_cases import all_models
from poolpipe.paper_experiment import PaperRun, paper_spec

GOAL = 1.4  # issue 49: the default plan >= 1.4x np where np idles the T4s


def at_bandwidth(spec: PlanningSpec, gbps: float) -> PlanningSpec:
    return dataclasses.replace(spec, cluster=dataclasses.replace(spec.cluster, bandwidth_gbps=gbps))


def nominal_rps(spec: PlanningSpec, planner: str) -> float:
    """The MILP's optimum for the throughput objective (the spec's margin, no serving costs)."""
    return plan(spec, PlanRequest(planner, objective="throughput", time_limit_s=60)).plan.models[0].throughput_rps


def sustained_rps(spec: PlanningSpec, planner: str) -> float:
    """The default objective's promise (default costs, Poisson arrivals; the planner's simulator)."""
    return plan(spec, PlanRequest(planner, time_limit_s=60, arrivals="poisson")).plan.models[0].sustainable_rps


def t4_fits_whole(spec: PlanningSpec) -> bool:
    """A T4 runs the whole model at batch 1 within the SLO: np can use the T4s."""
    m = spec.models[0]
    return m.profile.latency_us("T4", 1, 1, 0, len(m.profile.blocks)) <= m.slo_us


def row(name: str, bandwidths: list[float], sustained: bool) -> dict:
    model, factor = name.rsplit("@", 1)
    base = paper_spec(PaperRun(model, float(factor), l4=4, t4=12), slo_margin=0.0)
    out: dict = {"row": name, "t4_whole": t4_fits_whole(base), "nominal": {}}
    for gbps in bandwidths:
        spec = at_bandwidth(base, gbps)
        out["nominal"][gbps] = (nominal_rps(spec, "ppipe"), nominal_rps(spec, "np"))
        if sustained:
            out.setdefault("sustained", {})[gbps] = (sustained_rps(spec, "ppipe"), sustained_rps(spec, "np"))
    return out


def ratio_text(pair: tuple[float, float]) -> str:
    pp, np_ = pair
    return f"{pp / np_:.2f}x ({pp:,.0f} / {np_:,.0f})" if np_ > 0 else f"- ({pp:,.0f} / 0)"


def table(rows: list[dict], bandwidths: list[float], sustained: bool) -> Table:
    t = Table(title="ppipe / np (req/s) on 4 L4 + 12 T4, planned (no devices)")
    t.add_column("model@SLO factor")
    t.add_column("T4 runs it whole")
    for gbps in bandwidths:
        t.add_column(f"nominal optimum at {gbps:g} Gbps", justify="right")
    for gbps in bandwidths if sustained else ():
        t.add_column(f"sustained at {gbps:g} Gbps", justify="right")
    for r in rows:
        cells = [ratio_text(r[kind][g]) for kind in ("nominal", "sustained") if kind in r for g in bandwidths]
        t.add_row(r["row"], "yes" if r["t4_whole"] else "no", *cells)
    return t


def summary(rows: list[dict], bandwidths: list[float]) -> list[str]:
    """Per figure and bandwidth: on the rows where np idles the T4s, how many have ppipe >= GOAL x np."""
    idle = [r for r in rows if not r["t4_whole"]]
    if not idle:
        return [f"a T4 runs every model here whole within its SLO: np idles the T4s on none of these {len(rows)} rows"]
    out = []
    for kind in ("nominal", "sustained"):
        for gbps in bandwidths:
            ratios = [r[kind][gbps][0] / r[kind][gbps][1] for r in idle if kind in r and r[kind][gbps][1] > 0]
            if not ratios:
                continue
            reach = sum(x >= GOAL for x in ratios)
            out.append(f"{kind} at {gbps:g} Gbps: where np idles the T4s ({len(idle)} rows), ppipe is "
                       f"{min(ratios):.2f}-{max(ratios):.2f}x np; >= {GOAL}x on {reach} of {len(ratios)}")
    return out


def _positive(text: str) -> bool:
    try:
        return float(text) > 0
    except ValueError:
        return False


def pick(models: str) -> list[str]:
    names = all_models()
    if models == "all":
        return names
    chosen = []
    for short in models.split(","):
        s, _, f = short.partition("@")
        if f and not _positive(f):
            sys.exit(f"ppipe_ceiling: --models {short!r}: the SLO factor after '@' must be a number > 0")
        found = [n for n in names if n.startswith(s) and (not f or n.endswith("@" + f))]
        if not found and f:  # another SLO factor of one of its models
            found = sorted({f"{n.split('@')[0]}@{f}" for n in names if n.startswith(s)})
        if not found:
            sys.exit(f"ppipe_ceiling: no model {short!r} in live_paper's set; try one of {', '.join(names)}")
        chosen += found
    return chosen


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--models", default="all",
                    help="'all' (live_paper's rows) or NAME@FACTOR,... (name prefixes of its models, any SLO factor)")
    ap.add_argument("--bandwidths", default="10,100", help="NIC bandwidths in Gbps, the first the reference's")
    ap.add_argument("--sustained", action="store_true",
                    help="also plan both for the rate they sustain, at each bandwidth (slower)")
    args = ap.parse_args(argv)
    bandwidths = [float(x) for x in args.bandwidths.split(",")]
    console = Console(width=max(Console().width, 200))  # a row per line, also in a log
    rows = []
    with console.status("planning") as status:
        for name in pick(args.models):
            status.update(f"planning {name}")
            rows.append(row(name, bandwidths, args.sustained))
    console.print(table(rows, bandwidths, args.sustained))
    for line in summary(rows, bandwidths):
        console.print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
