"""Filling what a candidate plan leaves idle (planner.sustained.fill): idle whole GPUs, the merged plan, and that a
wide-margin plan with its idle T4s planned at a smaller margin sustains more than either plan alone."""

from __future__ import annotations

from dataclasses import replace

from planner import PlanRequest, plan
from planner.planners import PLANNERS
from planner.solvers.milp_solvers import SolverOptions
from planner.sustained.fill import fills, idle_gpus, merged
from planner.sustained.measure_pool import WorkerPool
from planner.sustained.search import fill_margins, solve_each, with_serving_costs
from plans.arrivals import parse_arrivals
from poolpipe_common.overheads import DEFAULT_OVERHEADS
from scheduler.sim.sustain import simulated_rps
from tests.test_sustained import MODEL, small_spec

OPTS = SolverOptions("highs", 30.0, 1e-4)


def run_planner(spec, planner: str):
    return PLANNERS[planner].solve(spec, OPTS)


def test_idle_gpus_counts_whole_gpus_no_vgpu_sits_on_and_merging_adds_pipelines():
    spec = small_spec(4, 12, margin=0.0)
    base = run_planner(with_serving_costs(spec, 0.3, DEFAULT_OVERHEADS), "ppipe")
    used = base.physical_gpus_used()
    idle = idle_gpus(base, spec.cluster.gpus)
    # at 3x a margin of 0.3 rules out a T4 serving centernet whole, and the pipelines' T4 stages are fewer than 12
    assert idle.get("T4", 0) > 0 and all(used[t] + idle.get(t, 0) <= spec.cluster.gpus[t] for t in used)
    extra = run_planner(replace(with_serving_costs(spec, 0.0, DEFAULT_OVERHEADS),
                                cluster=replace(spec.cluster, gpus=idle)), "np")
    both = merged(base, extra)
    m, b, e = both.models[0], base.models[0], extra.models[0]
    assert m.pipelines == b.pipelines + e.pipelines
    assert abs(m.throughput_rps - (b.throughput_rps + e.throughput_rps)) < 1e-6 and both.objective == m.throughput_rps
    assert both.bound is None and idle_gpus(both, spec.cluster.gpus) == {}
    assert all(both.physical_gpus_used()[t] <= spec.cluster.gpus[t] for t in spec.cluster.gpus)


def test_filling_idle_gpus_sustains_more_than_the_plan_that_left_them_idle():
    """centernet at 3x on 4 L4 + 12 T4: the margin-0.3 plan's pipelines keep slack but leave T4s idle; the same
    plan with those T4s serving the model whole (margin 0) sustains more, simulated, than it does alone."""
    spec = small_spec(4, 12, margin=0.0)
    arrivals = parse_arrivals("poisson")
    base = run_planner(with_serving_costs(spec, 0.3, DEFAULT_OVERHEADS), "ppipe")
    out = fills(spec, base, idle_gpus(base, spec.cluster.gpus), (0.0,), [PLANNERS["ppipe"], PLANNERS["np"]],
                solve_each(WorkerPool(1), OPTS), lambda s, m: with_serving_costs(s, m, DEFAULT_OVERHEADS))
    assert out and all(margin == 0.0 for margin, _ in out)
    alone = simulated_rps(base, arrivals, DEFAULT_OVERHEADS)[MODEL]
    with_fill = max(simulated_rps(p, arrivals, DEFAULT_OVERHEADS)[MODEL] for _, p in out)
    assert with_fill > 1.05 * alone, (with_fill, alone)


def test_idle_gpus_are_planned_at_no_margin_and_halfway_down_to_the_candidates():
    assert fill_margins(0.3) == (0.0, 0.15) and fill_margins(0.05) == (0.0, 0.025)
    assert fill_margins(0.025) == (0.0,) and fill_margins(0.0) == ()


def test_the_sustained_objective_weighs_filled_candidates_and_records_them():
    sustained = plan(small_spec(4, 12, margin=0.0), PlanRequest(time_limit_s=30)).plan
    table = sustained.to_dict()["sustained"]["candidates"]
    filled = [c for c in table if c["fill_margin_fraction"] is not None]
    # each weighed: measured, or screened out at its first point below the best measured less the model's error
    assert filled and all((c["measured_rps"] is not None) != bool(c.get("fell_short")) for c in filled)
    assert all(c["fill_margin_fraction"] < c["margin_fraction"] for c in filled)
    best = max(c["measured_rps"][MODEL] for c in table if c["measured_rps"] is not None)
    assert sustained.models[0].sustainable_rps == best


def test_pipelines_the_sidecar_would_find_no_slack_in_are_not_kept():
    """fsaf at 3x on 4 L4 + 12 T4 with costs a sidecar measured there: PPipe's own plan keeps 8 T4s serving the model
    whole at batch 1, 59.05 ms of compute (x 1.0059 as measured) + a stage call's lead and tail against 60.0 ms left;
    the sidecar sent them nothing. The search drops such pipelines (their GPUs idle, to be filled) and keeps none."""
    from planner.sustained.capacity import leaves_slack, without_dead_pipelines
    from poolpipe.paper_experiment import PaperRun, paper_spec
    from poolpipe_common.overheads import Overheads

    spec = paper_spec(PaperRun("fsaf_r101_fpn_1x_coco", 3.0, 4, 12), slo_margin=0.0)
    costs = Overheads(lead_us=430, tail_us=281, slowdown=1.0059, front_us=2000)
    own = run_planner(spec, "ppipe")
    m = own.models[0]
    dead = [pl for pl in m.pipelines if not leaves_slack(m, pl, costs)]
    assert dead and all(len(pl.partitions) == 1 and pl.partitions[0].gpu == "T4" for pl in dead)
    assert all(leaves_slack(m, pl, Overheads()) for pl in m.pipelines)  # with no costs every one fits
    pruned = without_dead_pipelines(own, costs)
    assert pruned is not None and len(pruned.models[0].pipelines) == len(m.pipelines) - len(dead)
    assert idle_gpus(pruned, spec.cluster.gpus)["T4"] >= sum(pl.partitions[0].physical_gpus for pl in dead)
    kept = plan(spec, PlanRequest("ppipe", time_limit_s=30, overheads=costs)).plan.models[0]
    assert kept.sustainable_rps > 0 and all(leaves_slack(kept, pl, costs) for pl in kept.pipelines)
