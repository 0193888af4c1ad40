"""A plan's pipelines in the closed form's terms, and its predicted sustainable rate per model.

The driver forms batches of any size up to each pipeline's planned one, so a plan whose planned batch misses the SLO
once serving's costs are counted may still hold a good rate at a smaller batch: a model's rate is the best the closed
form finds over the batch sizes the driver may use (each pipeline at min(b, its batch)), as the simulator would."""

from __future__ import annotations

from dataclasses import replace

from planner.sustained.queueing import TARGET, PipelineTerms, PoolTerms, sustainable_rps
from plans.arrivals import Arrivals
from plans.plan_json import ModelPlan, PartitionPlan, PipelinePlan, Plan, nominal_objective
from poolpipe_common.overheads import SLOPE_FIELDS, Overheads, driver_margin_us, sidecar_slo_us

RATE_STEPS = 12  # bisection steps for the rate that rate-dependent costs are taken at (1/4096 of the unloaded total)
# How much serving's costs may rise over those a plan was made with, for its resilience (cost_resilience): between
# the calibration steps of one plan on this host a stage call's lead and tail moved by up to a third about their
# median, and the way outside the sidecar's clock that a client measured at p99 by 40 % between live points.
COST_RISE = 0.25


def _compute_us(model: ModelPlan, pipeline: PipelinePlan, part: PartitionPlan, batch: int) -> float:
    """One batch's compute on one of the partition's vGPUs (the profile's time at that batch; the planned batch's
    latency where the profile has no column for it, as for an unequal size)."""
    dev = part.timing_device
    prof = model.profile
    if batch == pipeline.batch or dev not in prof.timings or batch not in prof.batch_sizes(dev, part.v):
        return part.latency_us
    first, end = part.blocks
    return prof.latency_us(dev, part.v, batch, first, end) * part.slowdown


def pipeline_at(model: ModelPlan, pipeline: PipelinePlan, costs: Overheads, batch: int | None = None
                ) -> PipelineTerms:
    """One pipeline at ``batch`` (default and at most: its planned batch): its pools (a vGPU is busy for the compute,
    slowed as measured: the response's tail delays the next stage, not the vGPU's next batch) and its unloaded latency
    (compute, transfers, and the lead and tail of every stage call)."""
    b = pipeline.batch if batch is None else min(batch, pipeline.batch)
    pools, latency = [], 0.0
    for part in pipeline.partitions:
        compute = _compute_us(model, pipeline, part, b) * costs.slowdown
        pools.append(PoolTerms(part.num_vgpus, compute))
        sent, back = model.profile.call_bytes(*part.blocks)
        latency += (compute + costs.lead_for(sent * b) + costs.tail_for(back * b)
                    + part.transfer_us * b / pipeline.batch)
    return PipelineTerms(b, tuple(pools), latency)


def pipeline_terms(model: ModelPlan, costs: Overheads, batch: int | None = None) -> list[PipelineTerms]:
    """Every pipeline of ``model`` at ``batch`` (:func:`pipeline_at`)."""
    return [pipeline_at(model, pl, costs, batch) for pl in model.pipelines]


def front_tail_us(costs: Overheads) -> float:
    """The way outside the sidecar's clock that 99 % of answers stay within: its measured quantile where a client
    measured it (a heavy tail there makes every answer of a plan with no slack late), else front_us."""
    return float(costs.front_at(TARGET)) if costs.front_quantiles_us else costs.front_us


def model_rps(model: ModelPlan, arrivals: Arrivals, costs: Overheads) -> float:
    """The closed form's sustainable rate of one model: the best over the batch sizes its driver may form (the
    costs at one rate: :func:`predicted_rps` finds the rate)."""
    front = front_tail_us(costs) + costs.front_extra_us(model.profile.input_bytes or 0)
    budget = sidecar_slo_us(model.slo_us, front) - driver_margin_us(model.slo_us)
    top = max((pl.batch for pl in model.pipelines), default=0)
    return max((sustainable_rps(pipeline_terms(model, costs, b), budget, arrival_scv=arrivals.scv)
                for b in range(1, top + 1)), default=0.0)


def predicted_rps(plan: Plan, arrivals: Arrivals, costs: Overheads) -> dict[str, float]:
    """closed_form_rps, each no higher than a calibration measured a plan of the same layout to hold."""
    return costs.held_to_limits(plan.layout_key(), closed_form_rps(plan, arrivals, costs))


def closed_form_rps(plan: Plan, arrivals: Arrivals, costs: Overheads) -> dict[str, float]:
    """Per model, the closed form's sustainable rate at >= 99 % SLO attainment under ``arrivals``: the SLO less
    the margin the sidecar's driver keeps and the way outside its clock, and less the per-stage costs. Where the
    costs grow with the rate the sidecar serves, the rates are the fixed point: the total they sum to is the rate
    the costs are taken at (found by bisection, as the total the costs at a rate allow falls as that rate grows)."""
    if not costs.rate_dependent:
        return {m.name: model_rps(m, arrivals, costs) for m in plan.models}

    calls = plan.stage_calls_per_request()

    def at(total: float) -> dict[str, float]:
        c = costs.at_rate(total, calls)
        return {m.name: model_rps(m, arrivals, c) for m in plan.models}

    lo, hi = 0.0, sum(at(0.0).values())
    for _ in range(RATE_STEPS):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if sum(at(mid).values()) >= mid else (lo, mid)
    return at(lo)


def risen(costs: Overheads, rise: float = COST_RISE) -> Overheads:
    """``costs`` with every stage call's lead and tail, their slopes and the way outside the sidecar's clock
    ``rise`` higher."""
    k = 1.0 + rise
    return replace(costs, **{f: getattr(costs, f) * k for f in ("lead_us", "tail_us", "front_us", *SLOPE_FIELDS)},
                   front_quantiles_us=tuple(q * k for q in costs.front_quantiles_us),
                   front_slopes_per_krps_us=tuple(q * k for q in costs.front_slopes_per_krps_us))


def cost_resilience(plan: Plan, arrivals: Arrivals, costs: Overheads) -> dict[str, float]:
    """Per model, the share of its closed-form rate ``plan`` keeps with the costs :func:`risen` (1 where it has
    none to keep): a plan with little slack left falls furthest."""
    now, then = closed_form_rps(plan, arrivals, costs), closed_form_rps(plan, arrivals, risen(costs))
    return {m: then[m] / r if r > 0 else 1.0 for m, r in now.items()}


def slack_reserve_us(costs: Overheads, input_bytes: float) -> float:
    """What a pipeline keeps free at batch 1 beyond its SLO less the driver's margin and the way outside the sidecar's
    clock: one more stage call's lead and tail (at the model's input bytes, no load). The sidecar's start-up test
    (scheduler.server.planned.calibration.no_slack_warning) measures a pipeline's calls once, apart from the costs a
    plan was made with: a T4 pool of fsaf at 3x planned with 0.4 ms to spare measured 0.96 ms of lead and tail
    there against 0.71 ms calibrated under load, found no slack, and every request sent to it was shed."""
    return costs.lead_for(input_bytes) + costs.tail_for(input_bytes)


def leaves_slack(model: ModelPlan, pipeline: PipelinePlan, costs: Overheads) -> bool:
    """Whether ``pipeline`` at batch 1 (compute slowed as measured, each stage's lead and tail at no load) fits its
    model's SLO less the driver's margin, the way outside the sidecar's clock and :func:`slack_reserve_us`; one that
    does not may be sent nothing by the sidecar (its requests shed)."""
    size = model.profile.input_bytes or 0
    rest = costs.at_rate(0.0)
    budget = (sidecar_slo_us(model.slo_us, rest.front_us + rest.front_extra_us(size))
              - driver_margin_us(model.slo_us) - slack_reserve_us(rest, size))
    return pipeline_at(model, pipeline, rest, 1).latency_us <= budget


def without_dead_pipelines(plan: Plan, costs: Overheads) -> Plan | None:
    """``plan`` less the pipelines that leave no slack under ``costs`` (:func:`leaves_slack`; their GPUs idle, for
    planner.sustained.fill), the plan itself where none; None where a model would keep no pipeline."""
    keep = {m.name: tuple(pl for pl in m.pipelines if leaves_slack(m, pl, costs)) for m in plan.models}
    if all(len(keep[m.name]) == len(m.pipelines) for m in plan.models):
        return plan
    if not all(keep.values()):
        return None
    models = tuple(replace(m, pipelines=keep[m.name], throughput_rps=sum(pl.throughput_rps for pl in keep[m.name]))
                   for m in plan.models)
    return replace(plan, models=models, objective=nominal_objective(models), bound=None, gap=None)
