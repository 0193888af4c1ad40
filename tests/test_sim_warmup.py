"""A simulated point is judged warm: requests that arrive during its warm-up are served (they load the pools and
teach the driver) but count in none of its figures, so a short point and a long one measure the same steady state;
and it counts enough requests at the rate it offers."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from planner import PlanRequest, plan
from scheduler.core import make_scheduler
from scheduler.core.driver import DriverConfig
from scheduler.sim.engine import simulate
from scheduler.sim.placement import topology_from_plan
from scheduler.sim.sustain import MAX_DURATION_S, MIN_REQUESTS, Run, point_runs
from scheduler.sim.sweep import TARGET_ATTAINMENT, WARMUP_FRACTION, PointJob, run_point, warmup_s
from tests.test_sustained import MODEL, small_spec
from workloads.arrivals import arrival_times, mixed_arrivals, parse_trace

POISSON = parse_trace("poisson")


@pytest.fixture(scope="module")
def small_plan():
    return plan(small_spec(1, 2, margin=0.2), PlanRequest(objective="throughput", time_limit_s=30)).plan


def test_a_cold_burst_in_the_warm_up_is_served_but_not_counted(small_plan) -> None:
    """Far more requests at once than the cluster serves within their SLO, then light traffic: judged from 0 the run
    misses; with the burst inside the warm-up it is judged on the light traffic alone, which it meets, and its
    miss budget is not spent by the burst."""
    topo = topology_from_plan(small_plan)
    rate = small_plan.models[0].throughput_rps
    burst = [(float(i), MODEL) for i in range(int(rate))]  # a second's worth at once
    light = [(1e6 + t * 1e6, MODEL) for t in arrival_times(POISSON, 0.2 * rate, 5.0, seed=1)]
    arrivals = burst + light

    def run(warm_us: float):
        budget = {MODEL: int((1 - TARGET_ATTAINMENT) * len(light))}
        return simulate(topo, make_scheduler("ppipe", topo), arrivals, 6e6, driver=DriverConfig.live(),
                        miss_budget=budget, warmup_us=warm_us)

    cold, warm = run(0.0), run(0.5e6)
    assert cold.models[MODEL].attainment < TARGET_ATTAINMENT
    stats = warm.models[MODEL]
    assert stats.offered == len(light) and stats.finished + stats.dropped == len(light)
    assert stats.attainment >= TARGET_ATTAINMENT and not warm.stopped_early
    assert len(warm.outcomes) == len(arrivals)  # the burst was served (or shed) all the same
    assert sum(warm.outcomes[i] != "met" for i in range(len(burst))) > (1 - TARGET_ATTAINMENT) * len(light)


def test_a_point_counts_only_what_arrives_after_its_warm_up(small_plan) -> None:
    rates = {MODEL: small_plan.models[0].throughput_rps}
    job = PointJob(small_plan, rates, "ppipe", POISSON, 0.5, 4.0, 7, driver="live")
    summary, _ = run_point(job)
    warm = summary["warmup_s"]
    offered = {m: r * job.load_factor for m, r in rates.items()}
    assert warm == warmup_s(topology_from_plan(small_plan).slo_us.values(), offered, job.duration_s) > 0
    times = np.array([t for t, _ in mixed_arrivals(POISSON, offered, warm + job.duration_s, job.seed)])
    counted = int((times >= warm * 1e6).sum())
    assert summary["models"][MODEL]["offered_rps"] * job.duration_s == pytest.approx(counted)
    assert counted < len(times)
    assert run_point(job)[0]["models"] == summary["models"]  # same inputs, same figures
    none = run_point(dataclasses.replace(job, warmup_s=0.0))[0]
    cold = len(mixed_arrivals(POISSON, offered, job.duration_s, job.seed))  # no warm-up: every arrival counts
    assert none["warmup_s"] == 0.0 and none["models"][MODEL]["offered_rps"] * job.duration_s == pytest.approx(cold)


def test_the_warm_up_rule() -> None:
    slo = [50_000.0]
    rates = {"a": 1_000.0, "b": 200.0}
    # the slowest model's requests set it, the same for a quarter-length point as for a full one
    assert warmup_s(slo, rates, 15.0) == warmup_s(slo, rates, 3.75) == pytest.approx(256 / 200)
    assert warmup_s([500_000.0], rates, 15.0) == pytest.approx(2.0)  # ten SLOs, but the 2 s horizon bounds it
    assert warmup_s(slo, rates, 1.0) == pytest.approx(WARMUP_FRACTION * 1.0)  # at most a fraction of the run
    assert warmup_s(slo, {"a": 1e6}, 15.0) == pytest.approx(0.5)  # ten SLOs where requests come fast


def test_a_point_far_below_the_nominal_rate_still_counts_min_requests(small_plan) -> None:
    """A plan is searched at load factors far below its nominal rate where its SLO is tight: such a point lasts long
    enough to offer MIN_REQUESTS (a quarter-length point a quarter of them), up to the longest run."""
    full, = point_runs(small_plan, POISSON, 0, 1.0)
    quarter, = point_runs(small_plan, POISSON, 0, 0.25)
    assert (full.min_requests, full.longest_s) == (MIN_REQUESTS, MAX_DURATION_S)
    assert (quarter.min_requests, quarter.longest_s) == (0.25 * MIN_REQUESTS, 0.25 * MAX_DURATION_S)
    run = Run(0, 15.0, MIN_REQUESTS, MAX_DURATION_S)
    assert run.length_s(MIN_REQUESTS / 15.0 * 2) == 15.0  # enough requests at its own length
    assert run.length_s(MIN_REQUESTS / 30.0) == pytest.approx(30.0)
    assert run.length_s(10.0) == MAX_DURATION_S
