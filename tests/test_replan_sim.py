"""Re-planning in the simulator: the trigger's decisions, and a step change of the mix served with and without
re-planning by the shared driver (real MILP solves, every request ending exactly once)."""

from __future__ import annotations

import pytest

from planner.entry import spec_planner
from planner.planners import solve_spec
from planner.request import PlanRequest
from plans.spec.planning_spec import ClusterSpec, ModelSpec, PlanningSpec
from poolpipe_common.errors import InputError
from profiling.reference import import_ppipe_profile
from runtime.testbed import REFERENCE_DIR
from scheduler.core.replan_trigger import ReplanConfig, ReplanTrigger, mix_distance
from scheduler.sim.mix_shift import parse_phases, shifting_arrivals, step_change
from scheduler.sim.replan import Migration, simulate_shifting

MODELS = ("googlenet-v3-pytorch", "repvgg-b3")


def _feed(trig: ReplanTrigger, rates: dict[str, float], t0_s: float, t1_s: float) -> list:
    """Evenly spaced arrivals at ``rates`` in [t0, t1); the decisions checked at each arrival."""
    events = sorted((t0_s + k / r, m) for m, r in rates.items() for k in range(int((t1_s - t0_s) * r)))
    out = []
    for t, m in events:
        d = trig.check(t * 1e6)
        if d is not None:
            out.append(d)
            trig.replanned(d.rates_rps, t * 1e6)
        trig.arrived(m, t * 1e6)
    return out


def test_trigger_waits_for_a_shifted_mix_out_of_headroom_and_cools_down() -> None:
    cfg = ReplanConfig(window_s=1.0, smoothing=0.5, high=0.9, mix_tolerance=0.1, cooldown_s=10.0)
    trig = ReplanTrigger(cfg, {"a": 100.0, "b": 100.0})
    assert _feed(trig, {"a": 80.0, "b": 80.0}, 0, 10) == []  # planned mix, within headroom
    assert _feed(trig, {"a": 50.0, "b": 50.0}, 10, 20) == []  # load falls: nothing to gain
    decisions = _feed(trig, {"a": 40.0, "b": 120.0}, 20, 60)  # b over its throughput, mix moved
    assert len(decisions) == 1, "one re-plan, then the new plan fits the mix"
    d = decisions[0]
    assert "b at" in d.reason and d.rates_rps["b"] > 100 and d.at_us < 26e6
    assert mix_distance({"a": 1, "b": 3}, {"a": 2, "b": 6}) == pytest.approx(0.0)
    with pytest.raises(ValueError, match="smoothing"):
        ReplanConfig(smoothing=0)


def test_phases_are_checked() -> None:
    assert [p.start_s for p in parse_phases("0:a=1,b=2;5:a=2,b=1", ["a", "b"])] == [0.0, 5.0]
    for bad in ("1:a=1,b=2", "0:a=1", "0:a=1,b=2;0:a=1,b=1", "0:a=x,b=1", ""):
        with pytest.raises(InputError, match="--phases"):
            parse_phases(bad, ["a", "b"])


def test_replanning_recovers_attainment_after_a_step_change_and_loses_no_request() -> None:
    models = []
    for name in MODELS:
        p = import_ppipe_profile(REFERENCE_DIR, name)
        slo = 5 * p.latency_us("L4", 1, 1, 0, p.num_blocks)
        models.append(ModelSpec(p, slo, 0.1 * slo))
    spec = PlanningSpec(ClusterSpec({"L4": 2, "T4": 6}, {"L4": 2, "T4": 2}, 10.0, {"L4": 1, "T4": 1}),
                        tuple(models), max_partitions=2)
    first = solve_spec(spec, time_limit_s=20)
    before = {m.name: 0.65 * m.throughput_rps for m in first.models}
    arrivals = shifting_arrivals("poisson", step_change(before, dict(zip(MODELS, (1.0, 4.0))), 4.0), 16.0)
    static = simulate_shifting(first, arrivals, 16e6)
    # the re-planner's mechanics on PPipe's nominal objective (its capacities are the nominal rates, as the first
    # plan's); the sustained objective's re-plans are tested in tests/test_replan_apps.py
    nominal = PlanRequest(objective="throughput", evaluator="none", time_limit_s=30.0)
    replan = simulate_shifting(first, arrivals, 16e6, plan_for=spec_planner(spec, nominal),
                               config=ReplanConfig(window_s=1.0, cooldown_s=30.0), migration=Migration(0.5))
    for res in (static, replan):
        assert len(res.outcomes) == len(arrivals), "every request ends (met, late or dropped)"
    assert len(replan.events) == 1
    ev = replan.events[0]
    slo_max = max(m.slo_us for m in first.models)
    assert ev.decided_us >= 4e6 and ev.resumed_us - ev.paused_us >= slo_max
    assert ev.capacity_rps["repvgg-b3"] > first.model("repvgg-b3").throughput_rps
    after = ev.resumed_us + 1e6
    assert replan.attainment(after) > static.attainment(after) + 0.05
