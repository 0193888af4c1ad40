"""Variable-latency models: latency quantiles in profiles, batch order statistics, Orloj's priority, the orloj
policy (in the core and the simulator), elsa's alpha and beta, and the emulated device drawing from a distribution."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hst

from backends.partition.emulated import EmulatedDevice, parse_quantile_table
from poolpipe_common.errors import InputError
from profiling.latency_quantiles import two_mode_multipliers
from profiling.merge import merge_profiles
from profiling.profile import load_profile, profile_from_dict
from profiling.reference import import_ppipe_profile
from runtime.testbed import EMULATED_MODEL, with_two_mode_latency
from scheduler.core import make_scheduler
from scheduler.core.api import RequestRow
from scheduler.core.driver import DriverConfig
from scheduler.core.latency_dist import PriorityScore, QuantileDist, TabulatedScore, max_of
from scheduler.core.topology import Pipeline, Stage, Topology, VGpu
from scheduler.sim.engine import simulate
from tests.conftest import REFERENCE_DIR
from workloads.arrivals import mixed_arrivals

LEVELS = tuple(float(x) for x in np.linspace(0, 1, 41))


def _two_mode(scale_us: float = 10_000.0) -> QuantileDist:
    return QuantileDist(LEVELS, tuple(float(x) for x in two_mode_multipliers(LEVELS) * scale_us))


# -- profiles ---------------------------------------------------------------------------------------------------
def test_profile_quantiles_survive_save_load_merge_and_scaling(tmp_path: Path) -> None:
    base = import_ppipe_profile(REFERENCE_DIR, EMULATED_MODEL)
    prof = with_two_mode_latency(base)
    prof.save(tmp_path / "p.json")
    back = load_profile(tmp_path / "p.json")
    levels, q = back.latency_quantiles_us("L4", 1, 2, 2, 5)
    assert len(levels) == 21 and q == prof.latency_quantiles_us("L4", 1, 2, 2, 5)[1]
    # blocks add level by level (one input makes them all slow), so the partition's median is the medians' sum
    assert q[10] == pytest.approx(back.latency_us("L4", 1, 2, 2, 5), rel=1e-6)
    assert q[-1] > 1.5 * q[10] > 3 * q[0]  # two modes: the slow inputs take about four times the fast ones
    assert base.latency_quantiles_us("L4", 1, 2) is None  # no distribution: the median path only
    slow = back.time_scaled(3.0)
    scaled = slow.latency_quantiles_us("L4", 1, 2)[1]
    assert scaled == pytest.approx([3 * x for x in back.latency_quantiles_us("L4", 1, 2)[1]])
    l4 = replace(back, timings={"L4": back.timings["L4"]})
    t4 = replace(base, timings={"T4": base.timings["T4"]})
    merged = merge_profiles([("l4.json", l4), ("t4.json", t4)])
    assert merged.latency_quantiles_us("L4", 1, 1) is not None and merged.latency_quantiles_us("T4", 1, 1) is None


@pytest.mark.parametrize("change, message", [
    (lambda q: q.update(levels=[0.5, 0.2]), "strictly increasing"),
    (lambda q: q.update(levels=[0, 1.5]), "within [0, 1]"),
    (lambda q: q.update(latency_us=q["latency_us"][:1]), "shape"),
    (lambda q: q["latency_us"][0][0].reverse(), "must not decrease"),
    (lambda q: q.update(bins=3), "bins"),
])
def test_bad_quantiles_are_refused_with_the_field_named(change, message) -> None:
    d = with_two_mode_latency(import_ppipe_profile(REFERENCE_DIR, EMULATED_MODEL)).to_dict()
    q = d["devices"]["L4"]["1"]["latency_quantiles"]
    q["latency_us"][0][0] = [1.0 + i for i in range(len(q["levels"]))]
    change(q)
    with pytest.raises(InputError, match="devices.L4.1.latency_quantiles") as e:
        profile_from_dict(json.loads(json.dumps(d)))
    assert message in str(e.value)


# -- distributions ----------------------------------------------------------------------------------------------
def test_batch_latency_is_the_order_statistic_and_a_mix_the_product() -> None:
    d = _two_mode()
    for k in (2, 4, 8):
        dk = d.order_statistic(k)
        xs = np.linspace(d.low, d.high, 50)
        np.testing.assert_allclose(dk.cdf(xs), d.cdf(xs) ** k, atol=0.02)
        assert dk.mean > d.order_statistic(k // 2).mean if k > 2 else dk.mean > d.mean
        np.testing.assert_allclose(max_of([d] * k).quantile(LEVELS), dk.quantile(LEVELS), rtol=0.03)
    fixed = QuantileDist.point(5000.0)  # a request of fixed latency batched with one drawn from d
    mixed = max_of([fixed, d])
    xs = np.linspace(0.0, d.high, 60)
    np.testing.assert_allclose(mixed.cdf(xs), np.where(xs < 5000.0, 0.0, d.cdf(xs)), atol=0.02)
    rng = np.random.default_rng(1)
    draws = np.maximum(d.quantile(rng.random((20000, 4))).max(axis=1), 0)  # sampled maxima of 4
    assert np.mean(draws) == pytest.approx(d.order_statistic(4).mean, rel=0.02)


def test_priority_ranks_certain_requests_by_deadline_and_hopeless_ones_last() -> None:
    d = _two_mode()
    exact = PriorityScore.of(d, 1e-7)
    slack = np.array([d.low * 0.5, float(d.quantile(0.3)), float(d.quantile(0.9)), d.high * 1.01, d.high * 3])
    p = exact(slack)
    assert p[0] == 0.0  # cannot make it
    assert p[1] < p[2] < p[3]  # a better chance of making it scores higher
    assert p[4] < p[3]  # past the distribution: earliest deadline first
    fast = TabulatedScore(exact, d.low, d.high)
    np.testing.assert_allclose(fast(slack), p, rtol=1e-3)


# -- the orloj policy -------------------------------------------------------------------------------------------
def _topology(slo_us: float, estimate: str = "median", batches=(1, 2, 4, 8)) -> Topology:
    solo = _two_mode()
    dists = {b: QuantileDist(solo.levels, tuple(v * (1 + 0.15 * (b - 1)) for v in solo.values)) for b in batches}
    est = {"median": lambda b: float(dists[b].quantile(0.5)),
           "p99": lambda b: float(dists[b].order_statistic(b).quantile(0.99))}[estimate]
    st = Stage((0, 1), ("g:0",), {b: est(b) for b in batches}, 0, dists)
    return Topology({"g:0": VGpu("g:0", "V100", 1, "s")}, {"m": (Pipeline("m/0", "m", batches[-1], (st,), 0.0),)},
                    {"m": slo_us}, 10.0)


def _expected_us(topo: Topology, batch: int) -> float:
    return topo.pipelines["m"][0].stages[0].dist(batch).order_statistic(batch).mean


def test_orloj_forms_the_largest_feasible_batch_and_drops_what_no_batch_size_can_serve() -> None:
    topo = _topology(60_000.0)
    pol = make_scheduler("orloj", topo)
    e1, e2, e4 = (_expected_us(topo, b) for b in (1, 2, 4))
    hopeless = RequestRow(0, "m", 0.0, 0.5 * e1)  # even a batch of 1 is expected to miss it
    near = [RequestRow(1 + i, "m", 0.0, e2 + 500.0 * (i + 1)) for i in range(3)]  # feasible up to batch 2
    far = [RequestRow(4 + i, "m", 0.0, 500_000.0 + i) for i in range(4)]  # feasible at every batch size
    for r in (hopeless, *near, *far):
        pol.enqueue(r)
    assert e2 + 1500.0 < e4
    res = pol.step(0.0)
    assert [d.request.id for d in res.drops] == [0] and "smallest batch" in res.drops[0].reason
    (first,) = res.dispatches
    assert sorted(r.id for r in first.requests) == [4, 5, 6, 7]  # Q_8 has 4 < 8; Q_4 has the 4 far ones
    assert pol.step(1.0).dispatches == []  # its only vGPU is busy until the batch is reported
    pol.report(first.id, 0, 0.0, 1000.0)
    (second,) = pol.step(1000.0).dispatches  # the near ones now: only batch 1 and 2 serve them in time
    assert second.batch == 2 and {r.id for r in second.requests} <= {1, 2, 3}
    assert pol.queue_lengths() == {"m": 1}


def test_orloj_prefers_requests_that_can_make_it() -> None:
    topo = _topology(60_000.0, batches=(1,))
    pol = make_scheduler("orloj", topo)
    one = topo.pipelines["m"][0].stages[0].dist(1)
    pol.enqueue(RequestRow(1, "m", 0.0, float(one.quantile(0.52))))  # about an even chance
    pol.enqueue(RequestRow(2, "m", 0.0, one.high + 1000.0))  # certain
    (d,) = pol.step(0.0).dispatches
    assert [r.id for r in d.requests] == [2]  # EDF would run 1 first and likely lose both


def test_orloj_beats_ppipe_and_fifs_on_a_two_mode_model_in_the_simulator() -> None:
    topo = _topology(3 * float(_two_mode().quantile(0.99)))
    peak = max(b / (topo.pipelines["m"][0].stages[0].dist(b).order_statistic(b).mean / 1e6) for b in (1, 2, 4, 8))
    arrivals = mixed_arrivals("replay:azure-conv", {"m": 0.85 * peak}, 20.0, 0)
    rate = {}
    clockwork_like = _topology(topo.slo_us["m"], "p99")  # reservations on a fixed estimate at each batch's P99
    for policy, t in (("orloj", topo), ("ppipe", topo), ("fifs", topo), ("ppipe@p99", clockwork_like)):
        res = simulate(t, make_scheduler(policy.split("@")[0], t), arrivals, 20e6, driver=DriverConfig.ideal())
        rate[policy] = res.models["m"].attainment
    assert rate["orloj"] > max(rate["ppipe"], rate["fifs"], rate["ppipe@p99"]) + 0.05, rate


def test_orloj_and_elsa_refuse_bad_parameters() -> None:
    topo = _topology(60_000.0)
    with pytest.raises(ValueError, match="b=0"):
        make_scheduler("orloj", topo, b_per_ms=0)
    with pytest.raises(ValueError, match="alpha=-1"):
        make_scheduler("elsa", topo, alpha=-1)


# -- elsa as specified ------------------------------------------------------------------------------------------
def test_elsa_slack_scales_with_alpha_and_beta() -> None:
    """Two pipelines: a small slow one and a big fast one. With the profile trusted the small one has slack; a
    conservative alpha (or beta on the new batch's latency) leaves it none, so the batch goes to the big one."""
    vg = {"small:0": VGpu("small:0", "T4", 1, "s"), "big:0": VGpu("big:0", "L4", 1, "s")}
    small = Pipeline("m/0", "m", 1, (Stage((0, 1), ("small:0",), {1: 40_000.0}, 0),), 0.0)
    big = Pipeline("m/1", "m", 1, (Stage((0, 1), ("big:0",), {1: 10_000.0}, 0),), 0.0)
    topo = Topology(vg, {"m": (small, big)}, {"m": 50_000.0}, 10.0)
    chosen = {}
    for ab in ((1.0, 1.0), (1.5, 1.0), (1.0, 1.5)):
        pol = make_scheduler("elsa", topo, alpha=ab[0], beta=ab[1])
        pol.enqueue(RequestRow(1, "m", 0.0, 50_000.0))
        chosen[ab] = pol.step(0.0).dispatches[0].pipeline_id
    assert chosen == {(1.0, 1.0): "m/0", (1.5, 1.0): "m/1", (1.0, 1.5): "m/1"}


def test_elsa_waits_count_the_running_batch_remaining_time() -> None:
    """T_wait includes what is left of the batch running on a vGPU: while the small pipeline is busy for 30 ms
    more, its slack is gone and the next batch goes to the big one."""
    vg = {"small:0": VGpu("small:0", "T4", 1, "s"), "big:0": VGpu("big:0", "L4", 1, "s")}
    small = Pipeline("m/0", "m", 1, (Stage((0, 1), ("small:0",), {1: 40_000.0}, 0),), 0.0)
    big = Pipeline("m/1", "m", 1, (Stage((0, 1), ("big:0",), {1: 10_000.0}, 0),), 0.0)
    pol = make_scheduler("elsa", Topology(vg, {"m": (small, big)}, {"m": 50_000.0}, 10.0))
    pol.enqueue(RequestRow(1, "m", 0.0, 45_000.0))
    assert pol.step(0.0).dispatches[0].pipeline_id == "m/0"
    pol.enqueue(RequestRow(2, "m", 10_000.0, 55_000.0))
    assert pol.step(10_000.0).dispatches[0].pipeline_id == "m/1"


# -- the emulated device ----------------------------------------------------------------------------------------
def test_emulated_device_draws_its_hold_from_the_distribution() -> None:
    levels = list(np.linspace(0, 1, 21))
    mult = two_mode_multipliers(tuple(levels))
    text = json.dumps({"levels": levels, "latency_us": {"1": list(mult * 1000), "4": list(mult * 2000)}})
    dev = EmulatedDevice({1: 1000.0, 4: 2000.0}, 0, [("y", np.float32, (4,))], seed=3,
                         quantiles=parse_quantile_table(text))
    one = np.array([dev.hold_us(1) for _ in range(4000)])
    assert np.median(one) == pytest.approx(1000.0, rel=0.1)
    assert np.mean(one < 0.6 * 1000) == pytest.approx(0.5, abs=0.05)  # the short mode
    four = np.array([dev.hold_us(4) for _ in range(4000)])
    assert np.mean(four < 0.6 * 2000) == pytest.approx(0.5 ** 4, abs=0.03)  # all four short: padded to the longest
    assert np.median([dev.hold_us(2) for _ in range(2000)]) > np.median(one)  # batch 2 scaled from batch 1's table
    for bad in ('{"levels": [0, 1]}', '{"levels": [1, 0], "latency_us": {"1": [1, 2]}}',
                '{"levels": [0, 1], "latency_us": {"1": [2, 1]}}'):
        with pytest.raises(ValueError, match="emulated_latency_quantiles_us"):
            parse_quantile_table(bad)
    assert parse_quantile_table("") is None


def test_simulator_topology_carries_the_plan_profiles_distribution() -> None:
    from scheduler.core.topology import with_stage_overhead
    from scheduler.sim.placement import topology_from_plan
    from tests.deploy_helpers import make_plan
    from tests.test_emulated import PIPELINE

    prof = with_two_mode_latency(import_ppipe_profile(REFERENCE_DIR, EMULATED_MODEL))
    topo = topology_from_plan(make_plan(prof, [PIPELINE], batch=2))
    st = topo.pipelines[EMULATED_MODEL][0].stages[1]
    (first, end), gpu, v = PIPELINE[1][:3]
    assert st.latency_dist[2].values == prof.latency_quantiles_us(gpu, v, 2, first, end)[1]
    shifted = with_stage_overhead(topo, 500.0).pipelines[EMULATED_MODEL][0].stages[1]
    assert shifted.dist(2).mean == pytest.approx(st.dist(2).mean + 500.0)
    plain = topology_from_plan(make_plan(import_ppipe_profile(REFERENCE_DIR, EMULATED_MODEL), [PIPELINE], batch=2))
    assert plain.pipelines[EMULATED_MODEL][0].stages[1].latency_dist is None  # the median path, unchanged


@settings(max_examples=40, deadline=None)
@given(hst.lists(hst.floats(0.0, 200_000.0), min_size=1, max_size=400), hst.sampled_from([1, 2, 4, 8]))
def test_orloj_batch_pick_equals_scoring_every_queued_request(deadlines: list[float], batch: int) -> None:
    """The chunked search (score only where the priority can still beat the k-th best) picks exactly what
    scoring every request of the batch size's queue picks."""
    from scheduler.core.policies.deadline_queue import DeadlineQueue
    from scheduler.core.policies.orloj import _top_by_priority

    pol = make_scheduler("orloj", _topology(60_000.0))
    bm = next(b for b in pol.models["m"][0][1] if b.batch == batch)
    q = DeadlineQueue()
    for i, d in enumerate(deadlines):
        q.append(RequestRow(i, "m", 0.0, d))
    lo = q.first_at_or_after(bm.mean_us)
    if len(q) - lo < batch:
        return
    score = bm.score(np.asarray(q.deadlines[lo:]))
    idx = np.arange(lo, len(q))
    brute = idx[np.lexsort((idx, -score))[:batch]]
    assert sorted(_top_by_priority(q, bm, lo, 0.0)) == sorted(int(i) for i in brute)
