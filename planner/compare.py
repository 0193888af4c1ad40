"""Sensitivity sweeps (as in PPipe's sensitivity study): plan one spec at every value of one axis with
several planners, and compare the planned throughput in a table and a plot.

Axes: ``slo-multiplier`` (every model's SLO = value x its fastest batch-1 latency; the margin keeps
its fraction of the SLO), ``gpu-ratio`` (the two GPU types' counts, high:low; high is the type on
which the first model runs fastest at batch 1) and ``slo-margin`` (every model's margin = value x its
SLO). A point where a planner finds nothing that meets the SLOs is recorded as infeasible.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from planner.entry import plan
from planner.request import PlanRequest
from planner.sustained.evaluators import NO_EVALUATOR
from plans.plan_json import Plan
from plans.spec.planning_spec import ModelSpec, PlanningSpec
from poolpipe_common.errors import InputError

AXES = ("slo-multiplier", "gpu-ratio", "slo-margin")
AXIS_TITLES = {"slo-multiplier": "SLO (x fastest batch-1 latency)", "gpu-ratio": "GPUs high:low",
               "slo-margin": "SLO margin (fraction of the SLO)"}


@dataclass(frozen=True)
class SweepPoint:
    label: str
    spec: PlanningSpec


@dataclass(frozen=True)
class SweepResult:
    """Objective per planner and point (None: infeasible there), with each solve's status."""

    axis: str
    labels: tuple[str, ...]
    planners: tuple[str, ...]
    objective: dict[str, list[float | None]]
    status: dict[str, list[str]]
    what: str  # what the objective measures

    def to_dict(self) -> dict[str, Any]:
        return {"axis": self.axis, "objective": self.what, "points": list(self.labels),
                "planners": {p: {"objective": self.objective[p], "status": self.status[p]} for p in self.planners}}


def _with_slo(m: ModelSpec, slo_us: float, margin_fraction: float) -> ModelSpec:
    return replace(m, slo_us=slo_us, slo_margin_us=margin_fraction * slo_us)


def slo_multiplier_spec(spec: PlanningSpec, mult: float) -> PlanningSpec:
    """Every model's SLO = ``mult`` x its fastest batch-1 latency; margins keep their share of the SLO."""
    return replace(spec, models=tuple(_with_slo(m, mult * m.profile.fastest_latency_us(1), m.slo_margin_us / m.slo_us)
                                      for m in spec.models))


def slo_margin_spec(spec: PlanningSpec, fraction: float) -> PlanningSpec:
    return replace(spec, models=tuple(_with_slo(m, m.slo_us, fraction) for m in spec.models))


def high_low_types(spec: PlanningSpec) -> tuple[str, str]:
    """The cluster's two GPU types, the one the first model runs fastest on (batch 1, V = 1) first."""
    types = spec.cluster.gpu_types
    if len(types) != 2:
        raise InputError(f"--gpu-ratios needs a cluster of exactly two GPU types, it has {', '.join(types)}")
    prof = spec.models[0].profile
    speed = {t: prof.latency_us(t, 1, 1) if t in prof.timings and 1 in prof.timings[t] else float("inf")
             for t in types}
    high = min(types, key=lambda t: speed[t])
    return high, next(t for t in types if t != high)


def gpu_ratio_spec(spec: PlanningSpec, high: int, low: int) -> PlanningSpec:
    h, lo = high_low_types(spec)
    return replace(spec, cluster=replace(spec.cluster, gpus={h: high, lo: low}))


def parse_values(axis: str, text: str) -> list[Any]:
    """'2,3,5' -> [2.0, 3.0, 5.0]; gpu-ratio '2:14,4:12' -> [(2, 14), (4, 12)]."""
    out: list[Any] = []
    for item in (x.strip() for x in text.split(",")):
        try:
            if axis == "gpu-ratio":
                h, sep, lo = item.partition(":")
                pair = (int(h), int(lo))
                if not sep or min(pair) < 0 or sum(pair) == 0:
                    raise ValueError
                out.append(pair)
            else:
                v = float(item)
                if not (v > 0 if axis == "slo-multiplier" else 0 <= v < 1):
                    raise ValueError
                out.append(v)
        except ValueError:
            need = {"gpu-ratio": "HIGH:LOW counts, e.g. 2:14,4:12", "slo-multiplier": "numbers > 0, e.g. 2,5,10",
                    "slo-margin": "fractions in [0, 1), e.g. 0.2,0.4"}[axis]
            raise InputError(f"--{axis}s: expected {need}; got {item!r}") from None
    return out


def sweep_points(spec: PlanningSpec, axis: str, values: list[Any]) -> list[SweepPoint]:
    if axis == "slo-multiplier":
        return [SweepPoint(f"{v:g}x", slo_multiplier_spec(spec, v)) for v in values]
    if axis == "slo-margin":
        return [SweepPoint(f"{v:g}", slo_margin_spec(spec, v)) for v in values]
    if axis == "gpu-ratio":
        return [SweepPoint(f"{h}:{lo}", gpu_ratio_spec(spec, h, lo)) for h, lo in values]
    raise InputError(f"unknown sweep axis {axis!r}; choose one of {', '.join(AXES)}")


def _solve_point(spec: PlanningSpec, planner: str, solve: Callable[..., Plan]) -> tuple[float | None, str]:
    try:
        plan = solve(spec, planner)
    except InputError as e:  # infeasible at this point (or dart-r without two GPU types)
        return None, "infeasible" if "infeasible" in str(e) or "below the fastest" in str(e) else "n/a"
    return plan.objective, plan.status


def run_sweep(spec: PlanningSpec, axis: str, points: list[SweepPoint], planners: list[str],
              solve: Callable[..., Plan], step: Callable[[str], None] = lambda _: None) -> SweepResult:
    """Plan every point with every planner; ``solve(spec, planner) -> Plan``; ``step`` after each solve."""
    objective: dict[str, list[float | None]] = {p: [] for p in planners}
    status: dict[str, list[str]] = {p: [] for p in planners}
    for pt in points:
        for p in planners:
            obj, st = _solve_point(pt.spec, p, solve)
            objective[p].append(obj)
            status[p].append(st)
            step(f"{pt.label} {p}")
    what = "throughput req/s" if len(spec.models) == 1 else "smallest throughput/weight"
    return SweepResult(axis, tuple(pt.label for pt in points), tuple(planners), objective, status, what)


def default_solve(solver: str, time_limit_s: float | None, rel_gap: float) -> Callable[..., Plan]:
    """Each point planned as ``poolpipe plan --planner P --objective throughput`` plans it (applications and
    co-location included): the sweeps compare the planners' nominal throughput, as the paper's figures do."""
    return lambda spec, planner: plan(spec, PlanRequest(planner, objective="throughput", evaluator=NO_EVALUATOR,
                                                        solver=solver, time_limit_s=time_limit_s, gap=rel_gap)).plan


def sweep_table(res: SweepResult):
    """A rich Table: one row per point, the planners' objectives and ppipe's gain over each baseline."""
    from rich.table import Table

    t = Table(title=f"plan sweep over {AXIS_TITLES[res.axis]} ({res.what})", title_justify="left")
    t.add_column(res.axis)
    for p in res.planners:
        t.add_column(p, justify="right")
    others = [p for p in res.planners if p != "ppipe"] if "ppipe" in res.planners else []
    for p in others:
        t.add_column(f"ppipe/{p}", justify="right")
    for i, label in enumerate(res.labels):
        cells = [label] + [_cell(res.objective[p][i], res.status[p][i]) for p in res.planners]
        for p in others:
            a, b = res.objective["ppipe"][i], res.objective[p][i]
            cells.append(f"{a / b:.3f}" if a is not None and b else "-")
        t.add_row(*cells)
    return t


def _cell(obj: float | None, status: str) -> str:
    if obj is None:
        return status
    return f"{obj:,.1f}" + ("" if status == "optimal" else " *")


def plot_sweep(res: SweepResult, path: Path) -> None:
    """Planned objective per planner over the axis, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    xs = list(range(len(res.labels)))
    for p, marker in zip(res.planners, "osd^v<>"):
        ys = [float("nan") if v is None else v for v in res.objective[p]]
        ax.plot(xs, ys, marker=marker, label=p)
    ax.set_xticks(xs, res.labels)
    ax.set_xlabel(AXIS_TITLES[res.axis])
    ax.set_ylabel(res.what)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=120)
    except OSError as e:
        raise InputError(f"cannot write {path}: {e.strerror or e}") from None
    finally:
        plt.close(fig)


def save_result(res: SweepResult, path: Path) -> None:
    try:
        path.write_text(json.dumps(res.to_dict(), indent=1) + "\n")
    except OSError as e:
        raise InputError(f"cannot write {path}: {e.strerror or e}") from None
