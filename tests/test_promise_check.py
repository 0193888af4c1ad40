"""The sidecar's promise check (scheduler.server.planned.promise_check) on a plan the planner made (a real MILP, its
promise measured by the simulator): the costs it assumed are recorded in plan.json (older plans still load), the rate
the measured costs imply is exported beside the promise and falls as they rise, one warning per episode names the
command that re-plans; ``serve --replan``'s trigger re-plans (kind costs) when that rate no longer covers the
arrivals. The live sidecar exports it too: tests/test_sidecar_planned.py."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
from dataclasses import replace
from pathlib import Path

import pytest

from planner import PlanRequest, plan
from plans.plan_costs import ASSUMED_COSTS, assumed_costs
from plans.plan_json import Plan, load_plan, plan_from_dict
from poolpipe_common.errors import InputError
from poolpipe_common.overheads import DEFAULT_OVERHEADS, Overheads
from scheduler.core.replan_trigger import ReplanConfig, ReplanTrigger
from scheduler.server.common.metrics import SidecarMetrics
from scheduler.server.common.model_stats import ModelStats
from scheduler.server.planned.overhead_meter import WINDOW, OverheadMeter
from scheduler.server.planned.promise_check import (
    APPROACH,
    CHECK_INTERVAL_S,
    RECENT_WINDOWS,
    TOLERANCE,
    PromiseCheck,
    closed_form_rps,
)
from tests.test_sustained import MODEL, small_spec


@pytest.fixture(scope="module")
def planned(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """centernet on 1 L4 + 3 T4 at 3x its L4 latency, planned with the default objective and costs (plan.json)."""
    path = tmp_path_factory.mktemp("promise") / "plan.json"
    plan(small_spec(1, 3), PlanRequest(time_limit_s=20, jobs=1)).plan.save(path)
    return path


def test_plan_json_records_the_costs_its_promise_assumed_and_older_plans_still_load(planned: Path) -> None:
    doc = json.loads(planned.read_text())
    assert doc["sustained"][ASSUMED_COSTS] == DEFAULT_OVERHEADS.to_dict()
    assert assumed_costs(load_plan(planned)) == (DEFAULT_OVERHEADS, "recorded")
    del doc["sustained"][ASSUMED_COSTS]  # as plan.json was written before the field
    assert assumed_costs(plan_from_dict(doc)) == (DEFAULT_OVERHEADS, "default")
    given = Overheads(lead_us=700.0, tail_us=600.0, front_us=1500.0)
    doc["request"]["overheads"] = given.to_dict()  # planned with --overheads before the field
    assert assumed_costs(plan_from_dict(doc)) == (given, "request")
    doc["sustained"][ASSUMED_COSTS] = {"lead_us": -1}
    with pytest.raises(InputError, match="sustained.assumed_costs: lead_us must be >= 0"):
        assumed_costs(plan_from_dict(doc))


def _serve(meter: OverheadMeter, windows: int, lead_us: float, tail_us: float) -> None:
    """``windows`` windows of stage calls that cost ``lead_us`` (beyond the calibrated 0) and ``tail_us``."""
    meter.learned_lead(lead_us)
    for _ in range(windows * WINDOW):
        meter.stage(1000.0, 0.0, 1000.0, 1000.0 + tail_us)


class _Clock:
    """Checks at CHECK_INTERVAL_S apart, each after ``rate`` rows per second were answered since the last."""

    def __init__(self, check: PromiseCheck, stats: ModelStats) -> None:
        self.check, self.stats, self.t = check, stats, 100.0

    def tick(self, rate: float) -> None:
        self.stats.inferences += round(rate * CHECK_INTERVAL_S)
        self.t += CHECK_INTERVAL_S
        asyncio.run(self.check.check(self.t))


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "event=promise_at_risk" in r.getMessage()]


def test_costs_above_the_plans_lower_the_implied_rate_and_warn_once_per_episode(
        planned: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, request: pytest.FixtureRequest) -> None:
    p: Plan = load_plan(planned)
    promised = p.model(MODEL).sustainable_rps
    metrics, stats, meter = SidecarMetrics(), ModelStats(), OverheadMeter()
    check = PromiseCheck(p, meter, {MODEL: stats}, metrics, overheads_out=tmp_path / "costs.json")
    request.addfinalizer(check.close)
    clock = _Clock(check, stats)

    def gauge(name: str) -> float | None:
        return metrics.registry.get_sample_value(f"poolpipe_sidecar_{name}", {"model": MODEL})

    assert gauge("promised_rps") == promised and math.isnan(gauge("sustainable_rps"))
    caplog.set_level(logging.INFO, "poolpipe.sidecar.promise")
    clock.tick(0.0)
    assert math.isnan(gauge("sustainable_rps"))  # nothing measured yet: no figure
    _serve(meter, RECENT_WINDOWS, DEFAULT_OVERHEADS.lead_us, DEFAULT_OVERHEADS.tail_us)
    clock.tick(0.9 * promised)
    assert gauge("sustainable_rps") == pytest.approx(promised)  # the costs the plan assumed: the promise holds
    assert not _warnings(caplog) and gauge("promise_at_risk") == 0

    _serve(meter, RECENT_WINDOWS, 2000.0, 1500.0)  # a stage call now costs 3,500 us, not 800
    clock.tick(0.5 * promised)  # served far below what the costs still allow: lower, not at risk
    implied = gauge("sustainable_rps")
    closed = closed_form_rps(p, [MODEL], replace(DEFAULT_OVERHEADS, lead_us=2000.0, tail_us=1500.0))[MODEL]
    base = closed_form_rps(p, [MODEL], DEFAULT_OVERHEADS)[MODEL]
    assert implied == pytest.approx(promised * closed / base) and implied < (1 - TOLERANCE) * promised
    assert not _warnings(caplog) and not (tmp_path / "costs.json").exists()
    for _ in range(3):
        clock.tick(APPROACH * implied * 1.1)  # the rate served approaches what the costs imply
    lines = _warnings(caplog)
    assert len(lines) == 1 and gauge("promise_at_risk") == 1
    print("\n" + lines[0])
    fields = dict(f.split("=", 1) for f in lines[0].split("(planned")[0].split() if "=" in f)
    assert float(fields["implied_rps"]) == pytest.approx(implied, abs=0.05)
    assert (float(fields["lead_us"]), float(fields["tail_us"])) == (2000.0, 1500.0)
    assert "(planned lead_us=450 tail_us=350" in lines[0] and "poolpipe plan SPEC --overheads FILE" in lines[0]
    assert f"FILE={tmp_path / 'costs.json'}" in lines[0] and Overheads.from_dict(
        {k: v for k, v in json.loads((tmp_path / "costs.json").read_text()).items() if k != "source"}).lead_us > 450

    _serve(meter, RECENT_WINDOWS, DEFAULT_OVERHEADS.lead_us, DEFAULT_OVERHEADS.tail_us)  # the costs came back
    clock.tick(0.9 * promised)
    assert gauge("sustainable_rps") == pytest.approx(promised) and gauge("promise_at_risk") == 0
    _serve(meter, RECENT_WINDOWS, 2000.0, 1500.0)  # and rose again: a new episode, told again
    clock.tick(implied)
    assert len(_warnings(caplog)) == 2

    # the closed form ran in a child process (tens of ms on the sidecar's event loop made requests late), stopped
    children = list(check._pool._processes.values())
    assert children and all(c.pid != os.getpid() and c.is_alive() for c in children)
    check.close()
    assert not any(c.is_alive() for c in children)


def test_a_plan_whose_costs_the_check_cannot_read_is_served_unchecked(planned: Path,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    doc = json.loads(planned.read_text())
    doc["sustained"][ASSUMED_COSTS] = {"lead_us": -1}
    meter, metrics = OverheadMeter(), SidecarMetrics()
    check = PromiseCheck(plan_from_dict(doc), meter, {MODEL: ModelStats()}, metrics)
    assert "event=promise_check_off reason=plan.json: sustained.assumed_costs: lead_us must be >= 0" in caplog.text
    _serve(meter, RECENT_WINDOWS, 2000.0, 1500.0)
    asyncio.run(check.check(1.0))
    assert check.implied == {} and metrics.registry.get_sample_value("poolpipe_sidecar_sustainable_rps",
                                                                     {"model": MODEL}) is None


def test_replan_trigger_fires_on_costs_when_the_implied_rate_no_longer_covers_the_arrivals() -> None:
    """The core's trigger takes the implied rates in (it imports no planner): a steady mix at 80 % of the plan's
    rate re-plans (kind costs) once the measured costs let the plan hold only 70; not while they let it hold 97."""
    cfg = ReplanConfig(window_s=1.0, smoothing=1.0, high=0.9, cooldown_s=10.0)
    trig = ReplanTrigger(cfg, {"a": 100.0, "b": 100.0})

    def second(t: int) -> object:
        for m in ("a", "b"):
            for _ in range(80):
                trig.arrived(m, t * 1e6)
        return trig.check((t + 1) * 1e6)

    assert [second(t) for t in range(3)] == [None] * 3
    trig.costs_imply({"a": 97.0, "b": math.nan})  # within cost_tolerance; b not judged yet
    assert second(3) is None
    trig.costs_imply({"a": 70.0, "b": 120.0})
    d = second(4)
    assert d is not None and d.kind == "costs" and d.rates_rps == {"a": 80.0, "b": 80.0}
    assert d.reason.startswith("costs: a at 80.0 req/s, the plan holds 70.0") and "b" not in d.reason
    trig.replanned({"a": 90.0, "b": 90.0}, 5e6)
    assert trig.implied_rps == {} and [second(t) for t in range(5, 20)] == [None] * 15  # the new plan: measured anew
    with pytest.raises(ValueError, match="cost_tolerance"):
        ReplanConfig(cost_tolerance=1.0)
