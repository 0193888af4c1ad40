"""scheduler/core: reservation tables, probe paths, and each policy on tiny traces with known outcomes."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies

from scheduler.core import make_scheduler
from scheduler.core.api import RequestRow
from scheduler.core.arrival_rate import ArrivalRate
from scheduler.core.executor_load import ExecutorLoad
from scheduler.core.probe import ProbeResult, ReservationState
from scheduler.core.reservations import OVERLAP_TOLERANCE_US, ResourceTable, earliest_common, owner_key
from scheduler.core.topology import Pipeline, Stage, Topology, VGpu

BW = 8.0  # Gbit/s: 1000 bytes take 1 µs


def table(*intervals: tuple[float, float]) -> ResourceTable:
    t = ResourceTable("t")
    for i, (s, e) in enumerate(intervals):
        t.reserve(s, e, owner_key(i + 1, 0))
    return t


def test_earliest_slot_skips_gaps_too_small_and_touching_intervals():
    t = table((10, 20), (25, 40), (50, 60))
    assert t.earliest(0, 10) == 0  # fits before the first interval, ending exactly at its start
    assert t.earliest(0, 11) == 60  # 0..11, 20..31 and 40..51 all clash
    assert t.earliest(5, 10) == 40  # gap 20..25 too small, 40..50 fits exactly
    assert t.earliest(20, 5) == 20  # [20, 25) touches both neighbours without overlapping
    assert t.earliest(15, 1) == 20
    assert t.earliest(70, 100) == 70


def test_reserve_refuses_overlap():
    t = table((10, 20))
    with pytest.raises(ValueError, match="overlaps"):
        t.reserve(15, 30, 99)
    t.reserve(20, 30, 99)
    assert t.intervals()[-1] == (20, 30, 99)


def test_earliest_common_slot_over_several_tables():
    a = table((0, 10), (30, 40))
    b = table((12, 25))
    c = table((45, 50))
    assert earliest_common([a, b], 0, 5) == 25  # a free from 10, b busy 12..25, then both free 25..30
    assert earliest_common([a, b], 0, 6) == 40  # 25..31 clashes with a's 30..40
    assert earliest_common([a, b, c], 0, 6) == 50  # 40..46 clashes with c
    assert earliest_common([a, b, c], 0, 2) == 10


def test_correction_trims_and_pushes_back():
    t = table((0, 10), (10, 20), (30, 40))
    t.correct(owner_key(1, 0), 0, 15)  # first batch overran by 5: the next one moves, the third is untouched
    assert [(s, e) for s, e, _ in t.intervals()] == [(0, 15), (15, 25), (30, 40)]
    t.correct(owner_key(2, 0), 15, 18)  # second finished early: space frees up
    assert t.earliest(18, 12) == 18
    t.correct(owner_key(3, 0), 16, 26)  # measured start before the previous end: previous is trimmed
    assert [(s, e) for s, e, _ in t.intervals()] == [(0, 15), (15, 16), (16, 26)]


def two_stage_topology(pool0: list[tuple[str, str]], pool1: list[tuple[str, str]], lat0: dict[int, float],
                       lat1: dict[int, float], batch: int = 1, in_bytes: int = 5000, slo: float = 1000.0,
                       extra: tuple[Pipeline, ...] = ()) -> Topology:
    vgpus = {v: VGpu(v, "T", 1, srv) for v, srv in pool0 + pool1}
    p = Pipeline("m/0", "m", batch, (Stage((0, 1), tuple(v for v, _ in pool0), lat0, 0),
                                     Stage((1, 2), tuple(v for v, _ in pool1), lat1, in_bytes)), 100.0)
    for v in (v for e in extra for st in e.stages for v in st.pool):
        vgpus.setdefault(v, VGpu(v, "T", 1, "srvE"))
    return Topology(vgpus, {"m": (p, *extra)}, {"m": slo}, BW)


def two_batches(topo: Topology) -> tuple[ProbeResult, ProbeResult, ReservationState]:
    """Model m's first pipeline probed for a batch of 1 at 0, that path reserved, and the next batch probed at 0."""
    st = ReservationState(topo)
    cp = st.pipelines["m"][0]
    first = st.probe(cp, 1, 0.0)
    st.commit(first, 1)
    return first, st.probe(cp, 1, 0.0), st


def test_probe_one_vgpu_per_stage_includes_transfer_and_queues_behind_own_reservations():
    r, r2, st = two_batches(two_stage_topology([("A0", "x")], [("B0", "y")], {1: 10.0}, {1: 20.0}))
    assert [(lg.vgpu, lg.start_us, lg.end_us) for lg in r.legs] == [("A0", 0, 10), ("B0", 15, 35)]
    assert (r.legs[1].transfer_start_us, r.legs[1].transfer_end_us) == (10, 15)
    assert r.completion_us == 35
    assert [(lg.start_us, lg.end_us) for lg in r2.legs] == [(10, 20), (35, 55)]  # transfer 20..25, B0 busy to 35
    assert st.probe_calls == 2


def test_probe_two_vgpus_per_stage_picks_the_known_best_path():
    topo = two_stage_topology([("A0", "x"), ("A1", "y")], [("B0", "y"), ("B1", "z")], {1: 10.0}, {1: 20.0})
    st = ReservationState(topo)
    cp = st.pipelines["m"][0]
    st.vgpu_tables["B0"].reserve(0, 100, owner_key(50, 1))
    r = st.probe(cp, 1, 0.0)  # A0 first (earliest, first in pool), then B1 via a transfer x -> z
    assert [lg.vgpu for lg in r.legs] == ["A0", "B1"] and r.completion_us == 35
    st.commit(r, 1)
    r = st.probe(cp, 1, 0.0)  # A1 is free at 0; B0 on its own server needs no transfer but is busy to 100;
    assert [lg.vgpu for lg in r.legs] == ["A1", "B1"]  # B1 is free after 35 -> 55 beats 120
    assert r.completion_us == 55 and r.legs[1].transfer_start_us == 15.0  # z's downlink carried 10..15
    st.vgpu_tables["B0"].release(owner_key(50, 1))
    r = st.probe(cp, 1, 0.0)
    assert [lg.vgpu for lg in r.legs] == ["A1", "B0"]  # same server: no NIC, finishes at 30
    assert r.legs[1].transfer_start_us is None and r.completion_us == 30


def test_transfers_share_a_server_uplink():
    _, r, _ = two_batches(two_stage_topology([("A0", "x"), ("A1", "x")], [("B0", "y"), ("B1", "z")], {1: 10.0},
                                             {1: 20.0}))  # A1 also ends at 10, but x's uplink carries 10..15
    assert r.legs[0].vgpu == "A1" and r.legs[1].transfer_start_us == 15.0 and r.completion_us == 40


def test_vgpu_down_releases_its_reservations_and_leaves_probes():
    topo = two_stage_topology([("A0", "x"), ("A1", "x")], [("B0", "y")], {1: 10.0}, {1: 20.0})
    sched = make_scheduler("ppipe", topo)
    sched.enqueue(RequestRow(1, "m", 0.0, 1000.0))
    d = sched.step(0.0).dispatches[0]
    assert d.stages[0].vgpu == "A0"
    sched.set_vgpu_up("A0", False, 0.0)
    assert len(sched.state.vgpu_tables["A0"]) == 0
    sched.enqueue(RequestRow(2, "m", 1.0, 1000.0))
    assert sched.step(1.0).dispatches[0].stages[0].vgpu == "A1"
    sched.report(12345, 0, 0.0, 1.0)  # unknown dispatch: ignored
    sched.report(d.id, 5, 0.0, 1.0)  # unknown stage: ignored


def one_stage(lat: dict[int, float], batch: int, slo: float, n: int = 1) -> Topology:
    vgpus = {f"G{i}": VGpu(f"G{i}", "T", 1, f"s{i}") for i in range(n)}
    p = Pipeline("m/0", "m", batch, (Stage((0, 1), tuple(vgpus), lat, 0),), 100.0)
    return Topology(vgpus, {"m": (p,)}, {"m": slo}, BW)


def req(i: int, t: float, slo: float) -> RequestRow:
    return RequestRow(i, "m", t, t + slo)


def test_ppipe_waits_for_a_full_batch_but_not_past_the_deadline():
    s = make_scheduler("ppipe", one_stage({1: 10.0, 2: 15.0}, 2, 100.0), fill_aware=False)  # the paper's rule
    s.enqueue(req(0, 0.0, 100.0))
    r = s.step(0.0)
    assert not r.dispatches and r.wake_at_us == pytest.approx(90.0)  # batch 1 takes 10: start by 90
    s.enqueue(req(1, 5.0, 100.0))
    r = s.step(5.0)
    assert [d.batch for d in r.dispatches] == [2] and r.dispatches[0].completion_us == 20.0
    s.enqueue(req(2, 30.0, 100.0))
    assert not s.step(30.0).dispatches
    r = s.step(120.0)  # the wake-up: dispatch the lone request, finishing exactly at its deadline
    assert [d.batch for d in r.dispatches] == [1] and r.dispatches[0].completion_us == 130.0


def test_ppipe_holds_a_batch_only_when_the_arrival_rate_can_fill_it():
    """fill_aware (the default): at a rate the vGPU serves easily at batch 1, a lone request goes at once;
    at a rate it cannot serve one by one, it waits for the batch as the paper does."""
    s = make_scheduler("ppipe", one_stage({1: 10.0, 2: 15.0}, 2, 100.0))
    t = 0.0
    for i in range(4):  # one request every 1000 µs: 0.001/µs against a capacity of 0.1/µs at batch 1
        s.enqueue(req(i, t, 100.0))
        r = s.step(t)
        assert [d.batch for d in r.dispatches] == [1] and r.dispatches[0].stages[0].start_us == t
        t += 1000.0
    busy = make_scheduler("ppipe", one_stage({1: 10.0, 2: 15.0}, 2, 100.0))
    t, batches = 0.0, []
    for i in range(8):  # one request every 8 µs: 0.125/µs, above what batch 1 sustains (0.1/µs)
        busy.enqueue(req(i, t, 100.0))
        r = busy.step(t)
        batches += [d.batch for d in r.dispatches]
        t += 8.0
    assert batches == [1, 2, 2, 2]  # the first goes alone (no rate known yet), then in pairs
    assert not r.dispatches and r.wake_at_us is not None and r.wake_at_us > t - 8.0  # the 8th waits


def test_ppipe_holds_for_a_fuller_batch_while_the_executor_is_saturated():
    """At a rate the vGPU serves at batch 1 a lone request goes at once, unless the executor itself is saturated
    (each dispatch costs it a stage call): then it waits for the batch, and goes at once again when it is not."""
    s = make_scheduler("ppipe", one_stage({1: 10.0, 2: 15.0}, 2, 10_000.0))
    t, batches = 0.0, []
    for i in range(6):  # one request every 100 µs: 0.01/µs against a capacity of 0.1/µs at batch 1
        if i == 2:
            s.set_executor_saturated(True)
        if i == 4:
            s.set_executor_saturated(False)
        s.enqueue(req(i, t, 10_000.0))
        batches.append([d.batch for d in s.step(t).dispatches])
        t += 100.0
    assert batches == [[1], [1], [], [2], [1], [1]]  # the third waits for the fourth while saturated


def test_executor_load_turns_saturated_on_high_and_off_only_well_below():
    load = ExecutorLoad(on=0.9, off=0.5, weight=1.0)  # unsmoothed: each window decides
    changes = [load.update(b) for b in (0.3, 0.92, 0.7, 0.6, 0.45, 0.8)]
    assert changes == [False, True, False, False, True, False] and not load.saturated
    with pytest.raises(ValueError, match="off < on"):
        ExecutorLoad(on=0.5, off=0.6)


def test_one_busy_window_does_not_saturate_the_executor_but_a_busy_second_does():
    load = ExecutorLoad()
    for b in (0.2, 0.2, 1.0, 0.2, 0.2):  # a start-up or a collection: one busy window among quiet ones
        assert not load.update(b)
    turned = [load.update(0.95) for _ in range(10)]  # a second of a saturated loop
    assert load.saturated and turned.count(True) == 1 and 3 <= turned.index(True) <= 8


def test_ppipe_releases_a_held_request_when_its_stream_falls_silent():
    """A closed-loop client sends its next request only once it has the answer: requests 12 µs apart look
    like a stream worth holding for, but when the next one does not come within a few such gaps the held
    request goes, instead of waiting out its whole SLO (and risking a late wake-up near its deadline)."""
    s = make_scheduler("ppipe", one_stage({1: 10.0, 2: 15.0}, 2, 100_000.0))
    s.enqueue(req(0, 0.0, 100_000.0))
    assert [d.batch for d in s.step(0.0).dispatches] == [1]  # no rate known yet: at once
    s.enqueue(req(1, 12.0, 100_000.0))
    r = s.step(12.0)  # 1/12 per µs would fill the batch long before the deadline: held
    assert not r.dispatches and r.wake_at_us == pytest.approx(12.0 + 5 * 12.0)
    r = s.step(r.wake_at_us)
    assert [d.batch for d in r.dispatches] == [1] and r.dispatches[0].stages[0].start_us == pytest.approx(72.0)


def test_ppipe_times_a_held_batch_for_every_queued_request_between_profiled_sizes():
    """Three requests queued with batches 1, 2 and 4 profiled: the wait is timed for a batch that holds all three
    (batch 4's latency), and at the wake-up all three go in one batch. Timing it for batch 2 left the third
    request behind, by then unable to make its deadline."""
    s = make_scheduler("ppipe", one_stage({1: 10.0, 2: 15.0, 4: 40.0}, 4, 100.0), fill_aware=False)
    for i in range(3):
        s.enqueue(req(i, 0.0, 100.0))
    r = s.step(0.0)
    assert not r.dispatches and r.wake_at_us == pytest.approx(60.0)  # batch 4 takes 40: start by 60
    r = s.step(60.0)
    assert [len(d.requests) for d in r.dispatches] == [3] and not r.drops
    assert r.dispatches[0].completion_us == pytest.approx(100.0)


def test_arrival_rate_is_zero_once_a_stream_is_silent_for_several_gaps():
    rate = ArrivalRate(stale_after=5.0)
    for t in range(0, 100, 10):
        rate.arrived(float(t))
    assert rate.per_us(90.0) == pytest.approx(0.1)
    assert rate.per_us(130.0) == pytest.approx(0.1) and rate.stale_at_us(130.0) == pytest.approx(140.0)
    assert rate.per_us(140.0) == 0.0 and rate.stale_at_us(140.0) == float("inf")


@given(strategies.lists(strategies.floats(0.0, 1e7, allow_nan=False), min_size=2, max_size=40))
def test_a_wake_up_at_stale_at_us_never_asks_for_the_same_instant_again(times: list[float]) -> None:
    """A core that holds a batch until the stream counts as stopped is woken at ``stale_at_us``: there the stream
    is stale, or the horizon dropped older arrivals and the new stale instant lies later. Asking for the same
    instant again made the core spin where the test and the sum rounded apart (143,111 of 157,378 decisions of
    one simulated run)."""
    rate = ArrivalRate(stale_after=5.0)
    for t in sorted(times):
        rate.arrived(t)
    wake, wake_ups = rate.stale_at_us(max(times)), 0
    while wake != float("inf"):
        later = rate.stale_at_us(wake)
        assert later > wake
        wake, wake_ups = later, wake_ups + 1
        assert wake_ups <= len(times)  # each wake-up that is not stale dropped an arrival


def test_ppipe_shrinks_the_batch_to_meet_the_oldest_deadline_then_drops():
    s = make_scheduler("ppipe", one_stage({1: 10.0, 2: 15.0, 3: 30.0}, 3, 20.0))
    for i in range(4):
        s.enqueue(req(i, 0.0, 20.0))
    r = s.step(0.0)  # batch 3 (30) misses 20; batch 2 (15) fits; then 1 request left, vGPU busy to 15:
    assert [d.batch for d in r.dispatches] == [2]  # batch 1 would end at 25 > 20: the next ones are dropped
    assert len(r.drops) == 2 and all(d.reason == "deadline cannot be met" for d in r.drops)
    assert s.probe_calls >= 3


def test_ppipe_tries_another_pipeline_before_dropping():
    # m/0 (slow vGPU S) and m/1 (fast vGPU F, busy until 30) both idle-or-queued: m/0 waits least (0) but
    # finishes at 50 > 45; m/1 waits 30 and finishes at 40. The request must go to m/1, not be dropped.
    vgpus = {v: VGpu(v, "T", 1, v) for v in ("S", "F")}
    slow = Pipeline("m/0", "m", 1, (Stage((0, 1), ("S",), {1: 50.0}, 0),), 10.0)
    fast = Pipeline("m/1", "m", 1, (Stage((0, 1), ("F",), {1: 10.0}, 0),), 10.0)
    s = make_scheduler("ppipe", Topology(vgpus, {"m": (slow, fast)}, {"m": 45.0}, BW))
    s.state.vgpu_tables["F"].reserve(0.0, 30.0, owner_key(999, 0))
    s.enqueue(req(0, 0.0, 45.0))
    r = s.step(0.0)
    assert not r.drops and [(d.pipeline_id, d.completion_us) for d in r.dispatches] == [("m/1", 40.0)]
    s.enqueue(req(1, 0.0, 45.0))  # now m/1 is busy to 40 (-> 50) and m/0 ends at 50: both miss, it is dropped
    r = s.step(0.0)
    assert not r.dispatches and [d.reason for d in r.drops] == ["deadline cannot be met"]


def test_ppipe_does_not_reprobe_while_waiting_unless_something_changed():
    s = make_scheduler("ppipe", one_stage({1: 10.0, 2: 15.0}, 2, 100.0, n=2), fill_aware=False)  # holds a lone request
    s.enqueue(req(0, 0.0, 100.0))
    assert s.step(0.0).wake_at_us == pytest.approx(90.0)
    probes = s.probe_calls
    for t in (5.0, 20.0, 60.0):  # other events: same queue, same tables -> same answer, no probe
        assert s.step(t).wake_at_us == pytest.approx(90.0)
    assert s.probe_calls == probes
    s.state.vgpu_tables["G0"].reserve(0.0, 95.0, owner_key(999, 0))  # made by someone else: re-decide
    s.state.commit(s.state.probe(s.state.pipelines["m"][0], 1, 81.0), 998)  # G1 busy 81..91
    r = s.step(82.0)  # batch 1 would now end at 101 (G1) or 105 (G0): past the deadline of 100
    assert s.probe_calls > probes and [d.request.id for d in r.drops] == [0] and r.wake_at_us is None


def test_ppipe_feedback_moves_the_next_slot():
    s = make_scheduler("ppipe", one_stage({1: 10.0}, 1, 1000.0))
    s.enqueue(req(0, 0.0, 1000.0))
    d = s.step(0.0).dispatches[0]
    s.report(d.id, 0, 0.0, 40.0)  # ran four times longer than profiled
    s.enqueue(req(1, 1.0, 1000.0))
    d2 = s.step(1.0).dispatches[0]
    assert d2.stages[0].start_us == 40.0


def test_ppipe_runs_a_stage_early_when_the_one_before_ran_faster_and_its_vgpu_is_free():
    """A stage whose input is ready before its reservation moves, with its transfer, to the earliest free slot;
    where another batch holds the vGPU in between, nothing moves and the tables stay as they were."""
    topo = two_stage_topology([("A0", "x")], [("B0", "y")], {1: 1000.0}, {1: 2000.0}, slo=100_000.0)
    s = make_scheduler("ppipe", topo)
    s.enqueue(req(0, 0.0, 100_000.0))
    d = s.step(0.0).dispatches[0]
    assert [(a.start_us, a.end_us) for a in d.stages] == [(0, 1000), (1005, 3005)]  # transfer 1000..1005
    s.report(d.id, 0, 0.0, 200.0)  # ran five times faster than profiled
    moved = s.advance(d.id, 1, 300.0)
    assert (moved.start_us, moved.end_us, moved.transfer_start_us, moved.transfer_end_us) == (305, 2305, 300, 305)
    assert s.state.vgpu_tables["B0"].intervals() == [(305, 2305, owner_key(d.id, 1))]
    assert s.state.uplinks["x"].intervals() == [(300, 305, owner_key(d.id, 1, 1))]
    assert s.advance(d.id, 1, 310.0) is None  # already as early as it gets

    s.enqueue(req(1, 5000.0, 105_000.0))
    d2 = s.step(5000.0).dispatches[0]
    s.state.vgpu_tables["B0"].reserve(5400.0, 6000.0, owner_key(999, 1))  # another batch holds B0 in between
    before = [t.intervals() for t in (s.state.vgpu_tables["B0"], s.state.uplinks["x"], s.state.downlinks["y"])]
    s.report(d2.id, 0, 5000.0, 5200.0)
    assert s.advance(d2.id, 1, 5300.0) is None
    assert [t.intervals() for t in (s.state.vgpu_tables["B0"], s.state.uplinks["x"], s.state.downlinks["y"])] == before


def test_ppipe_runs_a_stage_early_into_a_gap_that_fits_exactly_on_a_clock_of_long_uptime():
    """A sidecar's clock is the host's monotonic clock in µs (5e10 after 13 hours: ulps of 8e-6 µs). Moving a
    stage into a gap exactly its length must not end it an ulp past the next interval (it once computed the end
    as (s + e0) - s0 and the dispatch failed with "overlaps an existing one"; these values did)."""
    t, d, q = 46797951117.42589, 7667.3, 5680.6
    s = make_scheduler("ppipe", two_stage_topology([("A0", "x")], [("B0", "x")], {1: 1000.0}, {1: d},
                                                   slo=1e6))
    b0 = s.state.vgpu_tables["B0"]
    b0.reserve(t + 100.0, t + 300.0, owner_key(900, 1))
    b0.reserve(t + 300.0 + d, t + 300.0 + d + q, owner_key(901, 1))  # the gap between is exactly d long
    s.enqueue(req(0, t, 1e6))
    dispatch = s.step(t).dispatches[0]
    assert dispatch.stages[1].start_us == t + 300.0 + d + q  # after both: stage 0 ends after the gap starts
    s.report(dispatch.id, 0, t, t + 150.0)
    moved = s.advance(dispatch.id, 1, t + 200.0)
    assert moved is not None and moved.start_us == t + 300.0
    spans = b0.intervals()
    assert [o for _, _, o in spans] == [owner_key(900, 1), owner_key(dispatch.id, 1), owner_key(901, 1)]
    assert all(e <= nxt + OVERLAP_TOLERANCE_US for (_, e, _), (nxt, _, _) in zip(spans, spans[1:]))


def test_reactive_hands_the_batch_from_pool_to_pool():
    topo = two_stage_topology([("A0", "x")], [("B0", "x")], {1: 10.0}, {1: 20.0}, slo=1000.0)
    s = make_scheduler("reactive", topo)
    s.enqueue(req(0, 0.0, 1000.0))
    r = s.step(0.0)
    d = r.dispatches[0]
    assert not d.final and not d.reserved and [a.stage for a in d.stages] == [0]
    assert not s.step(5.0).dispatches  # stage 1's queue is empty until stage 0 is reported
    s.report(d.id, 0, 0.0, 10.0)
    d2 = s.step(10.0).dispatches[0]
    assert d2.final and d2.stages[0].vgpu == "B0" and d2.requests[0].id == 0


def test_fifs_sends_up_to_the_planned_batch_to_the_first_idle_vgpu():
    s = make_scheduler("fifs", one_stage({1: 10.0, 2: 15.0}, 2, 1000.0))
    for i in range(3):
        s.enqueue(req(i, 0.0, 1000.0))
    r = s.step(0.0)
    assert [d.batch for d in r.dispatches] == [2]
    assert not s.step(1.0).dispatches  # the only vGPU is busy
    s.report(r.dispatches[0].id, 0, 0.0, 15.0)
    assert [d.batch for d in s.step(15.0).dispatches] == [1]


def test_elsa_prefers_the_smallest_pipeline_with_positive_slack():
    small = Pipeline("m/1", "m", 1, (Stage((0, 2), ("S0",), {1: 50.0}, 0),), 10.0)
    topo = two_stage_topology([("A0", "x")], [("B0", "x")], {1: 5.0}, {1: 5.0}, slo=60.0, extra=(small,))
    s = make_scheduler("elsa", topo)
    s.enqueue(req(0, 0.0, 60.0))
    assert s.step(0.0).dispatches[0].pipeline_id == "m/1"  # 50 < 60: the slow vGPU will do
    s.enqueue(req(1, 0.0, 60.0))
    assert s.step(0.0).dispatches[0].pipeline_id == "m/0"  # slow one busy to 50 -> 100 > 60: the fast path


def test_unknown_policy_and_model():
    topo = one_stage({1: 10.0}, 1, 100.0)
    with pytest.raises(ValueError, match="unknown policy"):
        make_scheduler("nope", topo)
    for name in ("ppipe", "reactive", "fifs", "elsa"):
        s = make_scheduler(name, topo)
        s.enqueue(RequestRow(7, "other", 0.0, 100.0))
        r = s.step(0.0)
        assert [d.request.id for d in r.drops] == [7] and "not served" in r.drops[0].reason
