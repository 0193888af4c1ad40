"""What ``poolpipe plan`` prints: the pipelines per model, the GPUs used, the solver's outcome, and costs."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from planner.ppipe.pipeline_columns import partition_rate_rps
from plans.plan_json import ModelPlan, Plan
from plans.spec.planning_spec import ModelSpec, PlanningSpec

WIDTH = 130


def _rates(m: ModelPlan) -> str:
    """The rate the model sustains at >= 99 % (what to size from) beside its pools' nominal throughput."""
    if m.sustainable_rps is None:
        return f"{m.throughput_rps:,.1f} req/s nominal (sustained rate not measured)"
    return f"{m.sustainable_rps:,.1f} req/s sustained at 99% SLO ({m.arrivals}); {m.throughput_rps:,.1f} nominal"


def _model_table(m: ModelPlan, ms: ModelSpec, spec: PlanningSpec) -> Table:
    t = Table(title=f"{m.name}: {_rates(m)}", title_justify="left",
              caption=f"SLO {m.slo_us:,.0f} us, margin {m.slo_margin_us:,.0f} us, weight {m.weight:g}",
              caption_justify="left")
    for col in ("pipe", "blocks", "GPU", "vGPU", "batch", "vGPUs", "latency us", "transfer us", "req/s"):
        t.add_column(col, justify="left" if col in ("blocks", "GPU") else "right")
    for i, pl in enumerate(m.pipelines):
        for k, p in enumerate(pl.partitions):
            if p.size is None:
                rate = p.num_vgpus * partition_rate_rps(ms, spec.cluster, p.gpu, p.v, p.batch, *p.blocks)
                vgpu = p.vgpu_fraction
            else:  # an unequal size (compute only; its timings measured or derived, planner/sizing/size_profiles.py)
                rate = p.num_vgpus * p.batch * 1e6 / max(p.latency_us, 1e-9)
                how = str(m.profile.provenance.get("vgpu_sizes", {}).get(p.timing_device, ""))
                vgpu = f"{p.size} (derived)" if how.startswith("derived") else p.size
            t.add_row(str(i) if k == 0 else "", f"[{p.blocks[0]}, {p.blocks[1]})", p.gpu, vgpu,
                      str(p.batch), str(p.num_vgpus), f"{p.latency_us:,.0f}", f"{p.transfer_us:,.0f}",
                      f"{rate:,.1f}")
        t.add_row("", "", "", "", "", "", f"[b]{pl.latency_us:,.0f}[/b]", "", f"[b]{pl.throughput_rps:,.1f}[/b]",
                  end_section=True)
    return t


def _gpu_table(plan: Plan) -> Table:
    used = plan.physical_gpus_used()
    whole = (plan.cost or {}).get("gpus_used", {})
    g = Table(title="physical GPUs", title_justify="left")
    cols = ("GPU", "used", "whole GPUs", "cluster") if whole else ("GPU", "used", "cluster")
    for col in cols:
        g.add_column(col, justify="left" if col == "GPU" else "right")
    for gpu, count in plan.cluster.gpus.items():
        row = [gpu, f"{used.get(gpu, 0.0):g}"] + ([str(whole.get(gpu, 0))] if whole else []) + [str(count)]
        g.add_row(*row)
    return g


def outcome_line(plan: Plan) -> str:
    """status, incumbent, bound and gap in one line (the bound is what no plan can beat)."""
    what = "cost per hour" if plan.objective_kind == "cost" else (
        "throughput" if len(plan.models) == 1 else "smallest throughput/weight")
    bound = "none" if plan.bound is None else f"{plan.bound:,.4f}"
    gap = "n/a" if plan.gap is None else f"{plan.gap:.4%}"
    return f"solver: {plan.status}  {what}: incumbent {plan.objective:,.4f}, bound {bound}, gap {gap}"


def cost_lines(plan: Plan) -> list[str]:
    c = plan.cost or {}
    gpus = ", ".join(f"{t}={n}" for t, n in c.get("gpus_used", {}).items())
    return [f"GPUs used: {gpus}",
            f"cost: {c.get('cost_per_hour', 0.0):,.4f} per hour, "
            f"{c.get('cost_per_million_requests', 0.0):,.4f} per million requests "
            f"(at {sum(c.get('rates_rps', {}).values()):,.1f} req/s in all)"]


def print_plan(plan: Plan, spec: PlanningSpec) -> None:
    """Per model and pipeline: each partition's blocks, GPU, vGPU, batch, count, latency, transfer, throughput;
    then the GPUs used, the solver's outcome and (cost plans) the costs."""
    console = Console(width=WIDTH)
    specs = {m.name: m for m in spec.models}
    for m in plan.models:
        console.print(_model_table(m, specs[m.name], spec))
    console.print(_gpu_table(plan))
    for gpu, entries in (plan.gpu_splits or {}).items():
        console.print(f"{gpu} split unequally: " + ", ".join(f"{e['gpus']} x [{' + '.join(e['vgpus'])}]"
                                                           for e in entries))
    console.print(outcome_line(plan))
    if plan.status != "optimal":
        console.print("[yellow]stopped at --time-limit: the plan is the best found so far (feasible, not proven "
                      "within --gap)[/yellow]")
    if plan.objective_kind == "cost":
        for line in cost_lines(plan):
            console.print(line)
    elif len(plan.models) > 1:
        console.print(f"smallest throughput/weight: {plan.objective:,.1f}")
