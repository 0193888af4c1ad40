"""A stage's hop (the response's way back after its compute, the tail a live executor measures) delays the next
stage and the answer, not the vGPU's next batch: in the core's reservations, in the simulator's virtual vGPUs and
in the planner's queueing estimate alike."""

from __future__ import annotations

import pytest

from planner.sustained.capacity import pipeline_terms
from poolpipe_common.overheads import Overheads
from scheduler.core import make_scheduler
from scheduler.core.topology import Pipeline, Stage, Topology, VGpu, with_stage_overhead
from scheduler.sim.engine import simulate
from tests.test_sched_core import two_batches, two_stage_topology


def test_with_stage_overhead_adds_the_tail_as_the_stages_hop() -> None:
    st = with_stage_overhead(two_stage_topology([("A0", "x")], [("B0", "y")], {1: 10.0, 2: 16.0}, {1: 20.0}), 3.0)
    first = st.pipelines["m"][0].stages[0]
    assert first.latency_us == {1: 13.0, 2: 19.0}  # what the next stage and the answer wait for
    assert first.hold(1) == 10.0 and first.hold(2) == 16.0  # what the vGPU is held for


def test_the_vgpus_next_batch_starts_at_the_compute_end_and_the_next_stage_after_the_hop() -> None:
    r, r2, _ = two_batches(with_stage_overhead(two_stage_topology([("A0", "x")], [("B0", "y")], {1: 10.0},
                                                                  {1: 20.0}), 3.0))
    # A0 computes 0-10, its answer is back at 13, the transfer takes 13-18, B0 computes 18-38, answer at 41
    assert [(lg.vgpu, lg.start_us, lg.end_us) for lg in r.legs] == [("A0", 0, 10), ("B0", 18, 38)]
    assert (r.legs[1].transfer_start_us, r.legs[1].transfer_end_us) == (13, 18)
    assert r.completion_us == 41
    assert [(lg.start_us, lg.end_us) for lg in r2.legs] == [(10, 20), (38, 58)]  # not (13, 23): A0 is free at 10
    assert r2.completion_us == 61


def test_the_simulators_vgpu_computes_for_the_hold_and_answers_a_tail_later() -> None:
    lat, tail = 1000.0, 300.0
    vgpus = {"V": VGpu("V", "T", 1, "srv")}
    p = Pipeline("m/0", "m", 1, (Stage((0, 1), ("V",), {1: lat}, 0),), 1e6 / lat)
    topo = with_stage_overhead(Topology(vgpus, {"m": (p,)}, {"m": 1e6}, 8.0), tail)
    res = simulate(topo, make_scheduler("ppipe", topo), [(0.0, "m"), (0.0, "m")], 1e5,
                   overheads=Overheads(tail_us=tail), record_timeline=True)
    assert [(b.start_us, b.end_us) for b in res.timeline] == [(0.0, lat), (lat, 2 * lat)]
    assert sorted(res.finish_us.values()) == pytest.approx([lat + tail, 2 * lat + tail])


def test_the_planners_pools_are_busy_for_the_compute_only() -> None:
    from planner.entry import plan as plan_spec
    from planner.request import PlanRequest
    from tests.test_sustained import small_spec

    plan = plan_spec(small_spec(1, 2), PlanRequest("ppipe", objective="throughput", evaluator="none",
                                                   time_limit_s=30)).plan
    costs = Overheads(lead_us=400.0, tail_us=300.0, slowdown=1.5)
    for terms, pl in zip(pipeline_terms(plan.models[0], costs), plan.models[0].pipelines):
        assert [p.service_us for p in terms.pools] == pytest.approx([q.latency_us * 1.5 for q in pl.partitions])
        assert terms.latency_us == pytest.approx(sum(q.latency_us * 1.5 + 700.0 + q.transfer_us
                                                     for q in pl.partitions))
