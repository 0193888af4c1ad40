"""The costs `serve --overheads-out` writes: what a stage typically costs over the run, not one episode's."""

from __future__ import annotations

import json

import pytest

from poolpipe_common.overheads import Overheads
from scheduler.server.planned.overhead_meter import WINDOW, OverheadMeter


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
