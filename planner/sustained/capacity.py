"""A plan's pipelines in the closed form's terms, and its predicted sustainable rate per model."""

from __future__ import annotations

from planner.sustained.queueing import PipelineTerms, PoolTerms, sustainable_rps
from plans.arrivals import Arrivals
from plans.plan_json import ModelPlan, Plan
from poolpipe_common.overheads import Overheads, driver_margin_us, sidecar_slo_us


def pipeline_terms(model: ModelPlan, costs: Overheads) -> list[PipelineTerms]:
    """Each pipeline's pools (a vGPU is busy for the compute, slowed as measured: the response's tail delays
    the next stage, not the vGPU's next batch) and its unloaded latency (compute, transfers, and the lead and
    tail of every stage call)."""
    out = []
    for pl in model.pipelines:
        pools = tuple(PoolTerms(p.num_vgpus, p.latency_us * costs.slowdown) for p in pl.partitions)
        latency = sum(p.latency_us * costs.slowdown + costs.lead_us + costs.tail_us + p.transfer_us
                      for p in pl.partitions)
        out.append(PipelineTerms(pl.batch, pools, latency))
    return out


def predicted_rps(plan: Plan, arrivals: Arrivals, costs: Overheads) -> dict[str, float]:
    """Per model, the closed form's sustainable rate at >= 99 % SLO attainment under ``arrivals``: the SLO less
    the margin the sidecar's driver keeps and the way outside its clock, and less the per-stage costs."""
    return {m.name: sustainable_rps(pipeline_terms(m, costs),
                                    sidecar_slo_us(m.slo_us, costs.front_us) - driver_margin_us(m.slo_us),
                                    arrival_scv=arrivals.scv)
            for m in plan.models}
