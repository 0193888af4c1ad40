"""How finely the simulator measures a plan (scheduler.sim.sustain.Precision): a search that starts from a guessed
bracket finds what bisection from zero finds, wherever the guess is wrong; the mix as one is held by every model; and
a point stops as soon as its misses settle the verdict, with the verdict it would have reached."""

from __future__ import annotations

import dataclasses

import pytest

from planner import PlanRequest, plan
from planner.sustained.measure_pool import WorkerPool
from plans.arrivals import parse_arrivals
from poolpipe_common.overheads import DEFAULT_OVERHEADS
from scheduler.sim.sustain import (
    PARTS,
    Point,
    Precision,
    is_split,
    judge,
    judge_here,
    mix_rates,
    point_job,
    point_runs,
    pooled,
    simulated_rps,
    tally,
)
from scheduler.sim.sweep import TARGET_ATTAINMENT, PointJob, run_point
from tests.test_sustained import MODEL, small_spec
from workloads.arrivals import parse_trace

POISSON = parse_arrivals("poisson")


@pytest.fixture(scope="module")
def small_plan():
    return plan(small_spec(2, 3, margin=0.2), PlanRequest(objective="throughput", time_limit_s=30)).plan


@pytest.mark.parametrize("lo,hi", [(0.05, 0.1), (0.9, 1.0), (0.3, 0.95)])
def test_a_wrong_guess_finds_what_bisection_from_zero_finds(small_plan, lo: float, hi: float) -> None:
    exact = simulated_rps(small_plan, POISSON, DEFAULT_OVERHEADS)[MODEL]
    guessed = simulated_rps(small_plan, POISSON, DEFAULT_OVERHEADS, Precision(start=((MODEL, lo, hi),)))[MODEL]
    rate = mix_rates(small_plan)[MODEL]
    assert exact > 0 and abs(guessed - exact) <= 0.03 * rate, (guessed, exact)


def test_the_mix_as_one_is_held_by_every_model(small_plan) -> None:
    two = dataclasses.replace(small_plan, models=(
        small_plan.models[0], dataclasses.replace(small_plan.models[0], name="twin", weight=0.5)))
    each = simulated_rps(two, POISSON, DEFAULT_OVERHEADS)
    joint = simulated_rps(two, POISSON, DEFAULT_OVERHEADS, Precision(joint=True))
    mix = mix_rates(two)
    assert joint[MODEL] / mix[MODEL] == pytest.approx(joint["twin"] / mix["twin"])  # one fraction of the mix
    assert all(joint[m] <= each[m] + 0.011 * mix[m] for m in mix)


def test_a_point_stops_once_its_misses_settle_it(small_plan) -> None:
    rate = {MODEL: small_plan.models[0].throughput_rps}
    job = PointJob(small_plan, rate, "ppipe", parse_trace("poisson"), 1.2, 20.0, 3, driver="live",
                   overheads=DEFAULT_OVERHEADS)
    whole, _ = run_point(job)
    early, _ = run_point(dataclasses.replace(job, stop_when_failed=(MODEL,)))
    assert not whole["stopped_early"] and early["stopped_early"]
    assert whole["models"][MODEL]["slo_attainment"] < TARGET_ATTAINMENT
    assert early["models"][MODEL]["slo_attainment"] < TARGET_ATTAINMENT
    assert early["dispatches"] < whole["dispatches"]
    # a point that holds runs to its end either way, with the same verdict
    held = dataclasses.replace(job, load_factor=0.3)
    assert run_point(held)[0]["models"] == run_point(dataclasses.replace(held, stop_when_failed=(MODEL,)))[0]["models"]


def _point(plan_, lf: float) -> Point:
    rates, trace = mix_rates(plan_), parse_trace("poisson")
    return Point(plan_, rates, trace, lf, tuple(point_runs(plan_, trace, 0, 1.0)), DEFAULT_OVERHEADS, (MODEL,))


def test_a_full_length_point_in_parts_counts_what_its_whole_run_counts(small_plan) -> None:
    """A full-length point is one run simulated in PARTS parts side by side: together they count exactly the run's
    requests (each part warmed up on the arrivals before it), and its verdict is the run's."""
    point = _point(small_plan, 0.6)
    assert is_split(point) and point.runs[0].parts == PARTS
    whole_job = dataclasses.replace(point_job(point, point.runs[0]), stop_when_failed=())
    whole, _ = run_point(whole_job)
    tallies = [tally(dataclasses.replace(point, open_=()), k) for k in range(PARTS)]
    counted = sum(t[MODEL][1] for t in tallies)
    assert counted == round(whole["models"][MODEL]["offered_rps"] * whole_job.duration_s)
    attainment = pooled(point, tallies)[MODEL]
    assert attainment == pytest.approx(whole["models"][MODEL]["slo_attainment"], abs=0.005)
    assert judge(point) == pooled(point, tallies)


def test_a_pool_judges_a_split_point_as_this_process_does(small_plan) -> None:
    """The parts run in the workers side by side; the verdict is the one judging them in turn gives."""
    points = [_point(small_plan, lf) for lf in (0.6, 1.2)]
    with WorkerPool(2) as pool:
        futures = [pool.judge(p, False) for p in points]
        assert [f.result() for f in futures] == [judge(p) for p in points]


def test_a_known_top_is_not_checked_again(small_plan) -> None:
    """A search from a screened bracket whose top the screen saw fail verifies its bottom only: one point where it
    holds, and lower ones only where it does not."""
    seen: list[float] = []

    def runner(point: Point, speculative: bool):
        if not speculative:
            seen.append(point.lf)
        return judge_here(point, speculative)

    exact = simulated_rps(small_plan, POISSON, DEFAULT_OVERHEADS)[MODEL] / mix_rates(small_plan)[MODEL]
    lo = round(exact - 0.05, 4)
    held = simulated_rps(small_plan, POISSON, DEFAULT_OVERHEADS,
                         Precision(0.03, start=((MODEL, lo, lo + 0.03),), known_hi=(MODEL,)), points=runner)
    assert seen == [lo] and held[MODEL] == pytest.approx(lo * mix_rates(small_plan)[MODEL])
    seen.clear()
    over = round(exact + 0.05, 4)
    simulated_rps(small_plan, POISSON, DEFAULT_OVERHEADS,
                  Precision(0.03, start=((MODEL, over, over + 0.03),), known_hi=(MODEL,)), points=runner)
    assert seen[0] == over and len(seen) > 1 and all(lf < over for lf in seen[1:])
