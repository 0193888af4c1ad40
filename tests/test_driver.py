"""scheduler/core/driver: the one loop around the policy, run by the simulator with a virtual executor that
injects what the live executor meets (late servers, late wake-ups, failing servers)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from poolpipe_common.overheads import driver_margin_us
from scheduler.core import make_scheduler
from scheduler.core.api import Dispatch, StageAssignment, StepResult
from scheduler.core.driver import Action, Driver, DriverConfig, NextStep, StageOutcome
from scheduler.core.topology import Pipeline, Stage, Topology, VGpu
from scheduler.sim.engine import Fault, Overheads, simulate
from workloads.arrivals import mixed_arrivals

SLO_US = 40_000.0


def two_stage_topology(pool: int = 2) -> Topology:
    """One model, one pipeline: stage 0 on `pool` vGPUs of server s0, stage 1 on `pool` vGPUs of server s1."""
    lat0 = {b: 4000.0 + 1500.0 * b for b in range(1, 9)}
    lat1 = {b: 3000.0 + 1000.0 * b for b in range(1, 9)}
    vgpus = {f"a{i}": VGpu(f"a{i}", "A", 1, "s0") for i in range(pool)}
    vgpus |= {f"b{i}": VGpu(f"b{i}", "B", 1, "s1") for i in range(pool)}
    stages = (Stage((0, 1), tuple(f"a{i}" for i in range(pool)), lat0, 0),
              Stage((1, 2), tuple(f"b{i}" for i in range(pool)), lat1, 10_000))
    tput = pool * 8 / 16_000.0 * 1e6
    pipe = Pipeline("m/0", "m", 8, stages, tput)
    return Topology(vgpus, {"m": (pipe,)}, {"m": SLO_US}, 100.0, {"A": pool, "B": pool})


def run(load: float, *, driver: DriverConfig, overheads: Overheads | None = None, faults=(), seed: int = 1,
        duration_s: float = 4.0, policy: str = "ppipe"):
    topo = two_stage_topology()
    rate = load * topo.pipelines["m"][0].throughput_rps
    arrivals = mixed_arrivals("poisson", {"m": rate}, duration_s, seed)
    return simulate(topo, make_scheduler(policy, topo), arrivals, duration_s * 1e6, driver=driver,
                    overheads=overheads, faults=faults, seed=seed)


def totals(res) -> dict[str, int]:
    return {k: sum(getattr(s, k) for s in res.models.values()) for k in ("offered", "met", "late", "dropped")}


def test_late_servers_raise_the_margin_and_win_back_attainment():
    """Servers slower than profiled finish batches late; the live driver learns that lateness as its margin
    (as the sidecar does) and so turns late answers into early, explicit sheds; the ideal driver cannot."""
    slow = Overheads(slowdown=1.4, lead_us=800.0, tail_us=600.0)
    ideal = run(0.6, driver=DriverConfig.ideal(), overheads=slow)
    live = run(0.6, driver=DriverConfig.live(), overheads=slow)
    base = DriverConfig.live().min_margin_us
    assert live.margins_us["m"] > base + 1000.0  # learned from the measured lateness
    assert ideal.margins_us["m"] == 0.0
    assert totals(live)["late"] < totals(ideal)["late"] / 2
    assert live.models["m"].attainment > ideal.models["m"].attainment
    for r in (ideal, live):
        t = totals(r)
        assert t["met"] + t["late"] + t["dropped"] == t["offered"] and r.unfinished == 0


def test_on_time_servers_keep_the_base_margin():
    res = run(0.5, driver=DriverConfig.live())
    assert res.margins_us["m"] == pytest.approx(driver_margin_us(SLO_US))
    assert totals(res)["late"] == 0 and res.models["m"].attainment == 1.0


def test_a_failed_server_retries_its_batches_on_the_rest_of_the_pool():
    """A vGPU of the last stage fails for a second: its batches are retried on the pool's other vGPU (the driver
    re-enqueues them), none is lost, and once it is back it serves again."""
    fault = Fault("b0", 1.0e6, 2.0e6)
    res = run(0.4, driver=DriverConfig.live(), faults=[fault], duration_s=4.0)
    t = totals(res)
    assert res.retries > 0
    assert t["met"] + t["late"] + t["dropped"] == t["offered"] and res.unfinished == 0
    assert t["met"] >= 0.97 * t["offered"]  # half the pool is gone for a second at 40 % load: retries save them
    no_retry = run(0.4, driver=DriverConfig.live(max_attempts=1), faults=[fault], duration_s=4.0)
    assert totals(no_retry)["dropped"] > t["dropped"]
    assert "vGPU b0 failed and no retry could meet the deadline" in no_retry.drop_reasons


def test_late_wake_ups_are_stepped_at_the_time_asked_for():
    """An event loop wakes late; within the tolerance the driver steps at the requested time, so a batch the
    core planned is not dropped as 'too late'."""
    late = Overheads(wake_late_us=1500.0)
    res = run(0.3, driver=DriverConfig.live(), overheads=late)
    strict = run(0.3, driver=DriverConfig.live(min_late_wake_tolerance_us=0.0, min_margin_us=0.0,
                                               margin_fraction=0.0, learn_lateness=False), overheads=late)
    assert res.models["m"].attainment >= strict.models["m"].attainment
    assert res.models["m"].attainment >= 0.99


class _AsksForTheSameInstant:
    """A core that holds its queue until an instant and, stepped there, asks for it again (the arrival-rate rounding
    that did so is fixed; the loop must not spin on any other)."""

    def __init__(self) -> None:
        self.stepped_at: list[float] = []

    def step(self, now_us: float) -> StepResult:
        self.stepped_at.append(now_us)
        return StepResult(wake_at_us=1000.0 if now_us <= 1000.0 else None)


def test_a_late_wake_up_is_stepped_at_the_time_asked_for_only_once():
    core = _AsksForTheSameInstant()
    driver = Driver(core, two_stage_topology(), executor=None, config=DriverConfig.live(), callers=None)
    assert driver.step(0.0) == 1000.0
    assert driver.step(1001.0) == 1000.0  # woken late: stepped at 1000, and the core asks for 1000 again
    assert driver.step(1002.0) is None  # stepped at the loop's time now, not at 1000 until the tolerance ran out
    assert core.stepped_at == [0.0, 1000.0, 1002.0]


@pytest.mark.parametrize("front_us", [3000.0, 12_000.0])
def test_the_way_outside_the_sidecars_clock_counts_in_every_deadline_and_answer(front_us: float):
    """With ``front_us`` (serve --front-us) each answer reaches its client that much later than the driver sees it,
    so the simulated driver plans against deadlines that much sooner: every answer counted in time is in time for
    the client, and at a load that fills the SLO the front path costs attainment it did not cost before."""
    base = run(0.8, driver=DriverConfig.live())
    res = run(0.8, driver=DriverConfig.live(), overheads=Overheads(front_us=front_us))
    for r in (base, res):
        t = totals(r)
        assert t["met"] + t["late"] + t["dropped"] == t["offered"]
        lat = np.array(r.models["m"].latencies_us)
        assert (lat <= SLO_US).sum() == t["met"]  # latencies are the client's: met means within its SLO
    fast = np.array(res.models["m"].latencies_us)
    assert fast.min() >= front_us + 7000.0  # the fastest path (batch 1) plus the way outside the clock
    if front_us > 10_000.0:  # a quarter of the SLO: the driver sheds what it could otherwise have served
        assert totals(res)["dropped"] > totals(base)["dropped"]
        assert res.models["m"].attainment < base.models["m"].attainment


def test_a_measured_front_path_makes_the_answers_late_that_its_tail_delays():
    """Overheads with the front path's measured quantiles: every simulated answer draws its way outside the
    sidecar's clock from them (deadlines still use front_us), so a tail longer than the slack the driver leaves
    turns answers late that a constant front_us counts in time; a distribution at front_us changes nothing."""
    const = Overheads(front_us=3000.0)
    same = replace(const, front_quantiles_us=(3000.0,) * 5)
    tail = const.with_front_samples([1000.0] * 90 + [3000.0] * 5 + [15_000.0] * 5)
    runs = {name: run(0.8, driver=DriverConfig.live(), overheads=ov, duration_s=3.0)
            for name, ov in (("const", const), ("same", same), ("tail", tail))}
    assert totals(runs["same"]) == totals(runs["const"])
    lat = np.array(runs["tail"].models["m"].latencies_us)
    assert totals(runs["tail"])["late"] > 0.02 * totals(runs["tail"])["offered"]
    assert totals(runs["const"])["late"] == 0
    assert lat.min() >= 1000.0 + 7000.0  # the shortest front plus the fastest path
    t = totals(runs["tail"])
    assert t["met"] + t["late"] + t["dropped"] == t["offered"]
    assert (lat <= SLO_US).sum() == t["met"]


def test_reactive_runs_through_the_driver_stage_by_stage():
    res = run(0.4, driver=DriverConfig.live(), policy="reactive")
    t = totals(res)
    assert t["met"] + t["late"] + t["dropped"] == t["offered"] and t["met"] > 0.9 * t["offered"]


class _Recorder:
    """Executor and callers at once: what the driver hands out and answers."""

    def __init__(self) -> None:
        self.executed: list[tuple[Dispatch, list]] = []
        self.rejected: list[tuple[object, str, bool]] = []
        self.finished: list[tuple[int, list, object]] = []
        self.failed: list[tuple[list, object]] = []

    def execute(self, dispatch, rows, report):
        self.executed.append((dispatch, rows, report))

    def finish(self, dispatch, rows, outputs, now_us):
        self.finished.append((dispatch.id, list(rows), outputs))

    def reject(self, row, reason, *, failure=False):
        self.rejected.append((row.call, reason, failure))

    def fail(self, dispatch, rows, error):
        self.failed.append((list(rows), error))


class _OneShot:
    """A policy stand-in that dispatches everything queued as one batch on vGPU a0 (for driver bookkeeping)."""

    def __init__(self) -> None:
        self.queue = []
        self.reported = []
        self.up = {}
        self.released = []
        self.next_id = 1

    def enqueue(self, r):
        self.queue.append(r)

    def step(self, now_us):
        res = StepResult()
        if self.queue:
            reqs, self.queue = self.queue, []
            a = StageAssignment(0, "a0", now_us, now_us + 1000.0)
            res.dispatches.append(Dispatch(self.next_id, "m", "m/0", reqs, [a], now_us + 1000.0))
            self.next_id += 1
        return res

    def report(self, *args):
        self.reported.append(args)

    def set_vgpu_up(self, v, up, now_us):
        self.up[v] = (up, now_us)

    def release(self, dispatch_id, now_us):
        self.released.append((dispatch_id, now_us))

    def advance(self, dispatch_id, stage, ready_us):
        return None  # reserves nothing ahead: every stage keeps its assignment

    def queue_lengths(self):
        return {"m": len(self.queue)}

    probe_calls = 0


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 12), attempts=st.integers(1, 4), fails=st.integers(0, 5))
def test_every_item_ends_exactly_once_whatever_fails(n, attempts, fails):
    """Property: however often batches fail, each submitted request is either executed in a completed batch or
    rejected, exactly once; retries never exceed the attempts allowed."""
    ex = _Recorder()
    core = _OneShot()
    drv = Driver(core, two_stage_topology(), ex, DriverConfig.live(max_attempts=attempts, clock_lead_us=500.0),
                 callers=ex)
    for i in range(n):
        drv.submit(i, "m", 0.0, SLO_US)
    t = 0.0
    done: list[int] = []
    for k in range(fails + 1):
        t += 1000.0
        drv.step(t)
        if not ex.executed:
            break
        d, rows, report = ex.executed.pop()
        if k < fails:
            assert report(StageOutcome(d, 0, t, failed="vGPU a0 failed", wanted=rows)).action is Action.STOP
        else:
            assert report(StageOutcome(d, 0, t, (t - 1000.0, t), wanted=rows, outputs="out")).action is Action.FINISH
            assert ex.finished[-1] == (d.id, rows, "out")  # the driver, not the executor, answers the callers
            done.extend(r.call for r in rows)
    rejected = [i for i, _, failure in ex.rejected if failure]
    assert sorted(done + rejected) == list(range(n))
    assert not drv.rows and drv.queue_lengths() == {"m": 0}
    assert (len(rejected) == n) == (fails >= attempts)


def test_one_report_per_stage_says_what_follows():
    """The executor's one call into the driver: a stage before the last answers NEXT_STAGE (its measured interval
    reaches the core), the last FINISH (the dispatch is complete: lateness learned), a given-up dispatch STOP."""
    ex, core = _Recorder(), _OneShot()
    drv = Driver(core, two_stage_topology(), ex, DriverConfig.live(), callers=ex)
    drv.submit("x", "m", 0.0, SLO_US)
    drv.step(0.0)
    d, rows, report = ex.executed.pop()
    d = replace(d, stages=[*d.stages, StageAssignment(1, "b0", d.completion_us, d.completion_us + 1000.0)])
    assert report(StageOutcome(d, 0, 1000.0, (100.0, 900.0))).action is Action.NEXT_STAGE
    assert core.reported == [(d.id, 0, 100.0, 900.0)] and drv.learned == 0
    assert report(StageOutcome(d, 1, 2500.0, (1500.0, 2400.0))).action is Action.FINISH
    assert core.reported[-1] == (d.id, 1, 1500.0, 2400.0) and drv.learned == 1
    drv.submit("y", "m", 3000.0, 3000.0 + SLO_US)
    drv.step(3000.0)
    d, rows, report = ex.executed.pop()
    assert report(StageOutcome(d, 0, 3500.0, gave_up=True)) == NextStep(Action.STOP)
    assert drv.learned == 1 and not ex.rejected and not drv.rows
    assert core.released == [(d.id, 3500.0 + drv.lead_us)]  # what it held goes back to the core at once


def test_a_stage_ready_before_its_reservation_runs_early_and_the_completion_follows():
    """Stage 0 measured far faster than profiled: the executor's next stage starts when its input is ready (its
    vGPU is free), not at the reserved start, and the dispatch's predicted completion moves with it."""
    ex = _Recorder()
    drv = Driver(make_scheduler("ppipe", two_stage_topology()), two_stage_topology(), ex, DriverConfig.live(),
                 callers=ex)
    drv.submit("x", "m", 0.0, SLO_US)
    drv.step(0.0)
    d, _, report = ex.executed.pop()
    reserved, completion = d.stages[1], d.completion_us
    step = report(StageOutcome(d, 0, 1500.0, (0.0, 1000.0)))
    assert step.action is Action.NEXT_STAGE
    moved = step.next  # the executor runs the moved assignment the driver hands it
    assert moved.start_us < reserved.start_us - 2000.0 and moved.start_us >= 1500.0 + drv.lead_us
    assert moved.end_us - moved.start_us == pytest.approx(reserved.end_us - reserved.start_us)
    assert d.stages[1] == reserved and d.completion_us == completion  # the dispatch is not changed under it
    assert drv._completion_us[d.id] == pytest.approx(completion - (reserved.end_us - moved.end_us))
    assert report(StageOutcome(d, 1, moved.end_us + 500.0, (moved.start_us, moved.end_us))).action is Action.FINISH
