"""One cut fewer (planner.sustained.fewer_cuts): the sustained search plans its best candidates of three or more
partitions again with one fewer, so a faster link, which makes one more cut every margin's nominal optimum, does not
lose the plan that sustains more."""

from __future__ import annotations

from dataclasses import replace

from planner import PlanRequest, plan
from planner.objectives import sustained_planners
from planner.sustained.choice import score
from planner.sustained.fewer_cuts import most_partitions, worth_fewer_cuts
from planner.sustained.search import MARGIN_FRACTIONS, all_candidates, candidate_plans, fewer_cut, filled, to_measure
from plans.arrivals import parse_arrivals
from poolpipe.paper_experiment import PaperRun, paper_spec
from poolpipe_common.overheads import DEFAULT_OVERHEADS

MODEL = "convnext_large"


def fast_link_spec(model: str = MODEL):
    """``model`` at 2.5x on live_paper's 4 L4 + 12 T4 with 100 Gbps links."""
    spec = paper_spec(PaperRun(model, 2.5, 4, 12), slo_margin=0.0)
    return replace(spec, cluster=replace(spec.cluster, bandwidth_gbps=100.0))


def test_the_best_candidates_with_three_partitions_are_planned_again_with_two():
    spec, request = fast_link_spec(), PlanRequest(arrivals="poisson")
    planners, arrivals = sustained_planners(spec, request), parse_arrivals("poisson")
    cands = candidate_plans(spec, planners, request.solver_options(), arrivals, DEFAULT_OVERHEADS)
    bases = worth_fewer_cuts(cands)
    assert len(bases) == 2 and all(b.margin in MARGIN_FRACTIONS and most_partitions(b.plan) == 3 for b in bases)
    fewer = fewer_cut(spec, cands, planners, request.solver_options(), arrivals, DEFAULT_OVERHEADS)
    assert fewer and all(most_partitions(c.plan) == 2 for c in fewer)
    assert {c.margin for c in fewer} <= {b.margin for b in bases}
    # none of them a margin's optimum (fewer_cut drops those), one ranked by the closed form above every plan that
    # cuts the model there
    cut = max(c.predicted[MODEL] for c in cands if most_partitions(c.plan) > 1)
    assert max(c.predicted[MODEL] for c in fewer) > cut


def test_with_fast_links_the_sustained_ppipe_plan_sustains_more_than_np_planned_the_same_way():
    """Before one cut fewer, both searches kept np's whole-L4 layout here (269 req/s each, simulated); the two-partition
    plan sustains about 8 % more."""
    spec = fast_link_spec()
    ppipe = plan(spec, PlanRequest("ppipe", arrivals="poisson")).plan
    np_ = plan(spec, PlanRequest("np", arrivals="poisson")).plan
    assert most_partitions(ppipe) == 2
    assert ppipe.models[0].sustainable_rps > 1.05 * np_.models[0].sustainable_rps
    chosen = [c for c in ppipe.sustained["candidates"] if c["chosen"]]
    assert len(chosen) == 1 and chosen[0]["partitions"] == 2


def test_plans_with_a_cut_fewer_are_screened_beside_the_others_not_in_their_place():
    """fsaf at 2.5x with 100 Gbps links: a plan with one cut fewer, predicted above a two-partition plan that sustains
    the most (simulated), pushed that plan out of the three best-predicted the screen measures, and the search kept
    one that sustains 6 % less. Every candidate screened without them is screened with them, and one of them too."""
    spec, request = fast_link_spec("fsaf_r101_fpn_1x_coco"), PlanRequest(arrivals="poisson")
    planners, arrivals, options = sustained_planners(spec, request), parse_arrivals("poisson"), request.solver_options()
    cands = candidate_plans(spec, planners, options, arrivals, DEFAULT_OVERHEADS)
    old = sorted(cands + filled(spec, cands, planners, options, arrivals, DEFAULT_OVERHEADS),
                 key=lambda c: -score(c.plan, c.predicted))
    new = all_candidates(spec, planners, options, arrivals, DEFAULT_OVERHEADS)
    fewer = [score(c.plan, c.predicted) for c in new if c.fewer_cuts]
    assert fewer and max(fewer) > score(old[2].plan, old[2].predicted)  # one ranks among the three best
    screened = to_measure(new)
    assert {c.plan.layout_key() for c in to_measure(old)} <= {c.plan.layout_key() for c in screened}
    assert sum(c.fewer_cuts for c in screened) == 1

