"""One cut fewer: the best candidate plans whose pipelines cut a model into three or more partitions, planned again
at their margin with one partition fewer allowed.

Why: the MILP's nominal objective does not count what a cut costs once requests queue (a stage call's lead and tail,
one more pool to wait in), so at a margin it may take one more cut for a few percent more nominal rate.
convnext_large at 2.5x on 4 L4 + 12 T4: with 100 Gbps links a third partition was the optimum at the margin whose
two-partition plan the search keeps at 10 Gbps (292 req/s), and it kept np's layout (269;
benchmarks/ppipe_ceiling.py --sustained).
"""

from __future__ import annotations

from collections.abc import Sequence

from planner.sustained.choice import CandidatePlan
from plans.plan_json import Plan

# Each planner's best-predicted candidates with three or more partitions that are planned again with one fewer.
FEWER_CUT_CANDIDATES = 2


def most_partitions(plan: Plan) -> int:
    """The most partitions any pipeline of ``plan`` has."""
    return max((len(pl.partitions) for m in plan.models for pl in m.pipelines), default=0)


def worth_fewer_cuts(cands: Sequence[CandidatePlan]) -> list[CandidatePlan]:
    """The first FEWER_CUT_CANDIDATES of ``cands`` (one planner's, best predicted first) planned at a margin of the grid
    with a pipeline of three or more partitions (two would leave np's whole-model pools, which np's own candidates
    cover)."""
    return [c for c in cands if c.margin is not None and most_partitions(c.plan) >= 3][:FEWER_CUT_CANDIDATES]
