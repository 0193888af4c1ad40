"""The costs `serve --overheads-out` writes, and the front path a client measured: what a stage or an answer
typically costs over the run, not one episode's."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from poolpipe_common.overheads import FRONT_QUANTILES, Overheads
from scheduler.server.planned.overhead_meter import MIN_STAGES_FOR_COSTS, WINDOW, OverheadMeter


def serve(meter: OverheadMeter, calls: int, tail_us: float, compute_us: float = 1000.0, planned_us: float = 1000.0
          ) -> None:
    for _ in range(calls):
        meter.stage(planned_us, 0.0, compute_us, compute_us + tail_us)


def test_steady_costs_are_their_mean():
    meter = OverheadMeter()
    meter.calibrated(500.0)
    for i in range(4 * WINDOW):
        meter.stage(1000.0, 0.0, 1100.0, 1100.0 + (300.0 if i % 2 else 500.0))
    o = meter.overheads()
    assert o.tail_us == pytest.approx(400.0) and o.lead_us == pytest.approx(500.0)
    assert o.slowdown == pytest.approx(1.1)


def test_a_host_stall_is_an_episode_not_every_stage_s_cost():
    meter = OverheadMeter()
    meter.learned_lead(150.0)
    serve(meter, 6 * WINDOW, tail_us=450.0)
    meter.learned_lead(8_000.0)  # the stall: the lead learned under it, the tails, the compute all blow up
    serve(meter, 2 * WINDOW, tail_us=30_000.0, compute_us=5_000.0)
    meter.learned_lead(150.0)  # learned again once it passed
    serve(meter, 4 * WINDOW, tail_us=450.0)
    o = meter.overheads()
    assert o.tail_us == pytest.approx(450.0)  # the run's mean tail would be 5,400 µs
    assert o.lead_us == pytest.approx(150.0)  # the learned lead most stages ran with
    assert o.slowdown == pytest.approx(1.0)


def test_a_lasting_change_is_what_is_reported():
    meter = OverheadMeter()
    serve(meter, 2 * WINDOW, tail_us=400.0)
    meter.learned_lead(900.0)
    serve(meter, 5 * WINDOW, tail_us=1_200.0)  # the load rose and stayed: most windows cost more
    o = meter.overheads()
    assert o.tail_us == pytest.approx(1_200.0) and o.lead_us == pytest.approx(900.0)


def test_a_short_run_reports_its_running_means(tmp_path):
    meter = OverheadMeter(front_us=1500.0)
    meter.calibrated(600.0)
    meter.learned_lead(100.0)
    serve(meter, 10, tail_us=300.0)
    serve(meter, 10, tail_us=500.0)
    meter.woke(40.0)
    meter.write(tmp_path / "o.json")
    doc = json.loads((tmp_path / "o.json").read_text())
    assert doc.pop("source") == {"stages": 20, "wake_ups": 1}
    o = Overheads.from_dict(doc)
    assert (o.lead_us, o.tail_us, o.wake_late_us, o.front_us) == pytest.approx((700.0, 400.0, 40.0, 1500.0))
    assert OverheadMeter().overheads().slowdown == 1.0  # nothing measured yet: the profile as it is


def test_one_stalled_answer_weighs_what_it_measured_in_the_front_path():
    """The way outside the sidecar as a client measured it: one answer held 80 ms by a stall among 2,400 of about
    1 ms must not make the simulator draw a few percent of slow answers (41 quantiles drew 2.4 % above 6 ms)."""
    rng = np.random.default_rng(0)
    samples = np.concatenate([rng.lognormal(np.log(1200.0), 0.4, 2399), [80_000.0]])
    ov = Overheads(front_us=2000.0).with_front_samples(samples)
    assert len(ov.front_quantiles_us) == FRONT_QUANTILES and ov.front_at(1.0) == 80_000.0
    drawn = ov.front_at(rng.random(200_000))
    measured = float((samples > 6000.0).mean())
    assert float((drawn > 6000.0).mean()) <= measured + 0.002  # 0.2 %: two quantiles' worth
    assert np.quantile(drawn, 0.99) == pytest.approx(np.quantile(samples, 0.99), rel=0.05)


def test_a_replan_takes_the_measured_costs_once_enough_stage_calls_were_measured():
    """`serve --replan` plans with what the sidecar measured (OverheadMeter.measured_costs), not before
    MIN_STAGES_FOR_COSTS stage calls; the fields are Overheads fields, so the plan's front path stays."""
    meter = OverheadMeter(front_us=1234.0)
    meter.calibrated(400.0)
    serve(meter, MIN_STAGES_FOR_COSTS - 1, tail_us=250.0, compute_us=1050.0)
    assert meter.measured_costs() == {}
    serve(meter, 1, tail_us=250.0, compute_us=1050.0)
    costs = meter.measured_costs()
    assert costs == pytest.approx({"lead_us": 400.0, "tail_us": 250.0, "wake_late_us": 0.0, "slowdown": 1.05})
    planned = Overheads(lead_us=450.0, tail_us=350.0, front_us=2000.0, front_quantiles_us=(0.0, 1.0, 2.0))
    o = replace(planned, **costs)
    assert (o.lead_us, o.tail_us, o.front_us, o.front_quantiles_us) == (400.0, 250.0, 2000.0, (0.0, 1.0, 2.0))
