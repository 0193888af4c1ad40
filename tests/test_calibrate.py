"""The cost model: stage calls' lead and tail grow with their bytes and the rate served, the way outside the
sidecar's clock with the input's bytes; `poolpipe calibrate` fits it on a live (emulated) deployment, `poolpipe
plan` finds it, and the closed form and the simulator count the same costs."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import yaml

from backends import native_front
from loadtest.calibrate import Step, between_share, held_share, limit_share
from loadtest.open_loop import RunResult
from model_repository_gen.generate import generate
from planner import PlanRequest
from planner import plan as plan_for
from planner.objectives import limit_note, reach_note
from planner.sustained.capacity import predicted_rps
from planner.sustained.evaluators import evaluator
from planner.sustained.front_reserve import kept_reserve
from plans.arrivals import parse_arrivals
from plans.plan_costs import front_reserve_us
from poolpipe_common.cost_fit import CostPoint, fit_front, fit_line, fit_runs, fit_stage_costs, leveled
from poolpipe_common.overheads import MeasuredLimit, Overheads, read_overheads, stage_calls_per_request
from scheduler.core.topology import with_slowdown, with_stage_overhead
from scheduler.sim.placement import topology_from_plan
from scheduler.sim.sweep import PointJob, run_point
from tests.conftest import run_cli
from tests.deploy_helpers import write_cluster
from tests.test_emulated import SCALE, emulated_hosts, ppipe_plan
from tests.test_planner import tiny_profile


def test_the_fit_recovers_a_known_cost_model_and_never_a_falling_one() -> None:
    rng = np.random.default_rng(3)
    points = [CostPoint(rate, mb * 1e6, mb * 5e5, 300 + 40 * mb + 200 * rate / 1e3 + rng.normal(0, 2),
                        200 + 10 * mb + 100 * rate / 1e3 + rng.normal(0, 2), 50)
              for rate in (50.0, 150.0, 300.0) for mb in (0.1, 0.8, 3.0)]
    c = fit_stage_costs(points, Overheads())
    assert c.lead_us == pytest.approx(300, abs=5) and c.lead_per_mb_us == pytest.approx(40, abs=3)
    assert c.lead_per_krps_us == pytest.approx(200, abs=25)
    assert c.tail_us == pytest.approx(200, abs=5) and c.tail_per_mb_us == pytest.approx(20, abs=3)
    # levelled through what the sidecar itself measured (its driver's lead) at the median rate, the slopes kept
    lv = leveled(c, points, Overheads(lead_us=800, tail_us=400), 150.0)
    mb = sum(p.sent_bytes for p in points) / len(points) / 1e6
    assert lv.lead_per_krps_us == c.lead_per_krps_us and lv.at_rate(150).lead_for(mb * 1e6) == pytest.approx(800)
    # a cost that seems to fall with the rate is fitted flat in it, not promised to shrink
    assert fit_line([(0.0,), (1.0,), (2.0,)], [500.0, 480.0, 470.0], [1, 1, 1])[1] == 0.0
    # the way outside the sidecar: a slope per input MB, and the distribution of what is left
    samples = [(b, 1000 + 500 * b / 1e6 + x) for b in (1e5, 2e6) for x in rng.exponential(300, 400)]
    f = fit_front(Overheads(front_us=2000), samples)
    assert f.front_per_mb_us == pytest.approx(500, rel=0.15) and 1150 < f.front_at(0.5) < 1350
    assert f.front_us == 2000  # the deadlines' offset stays what the sidecar served with (serve --front-us)


def test_rates_close_together_give_no_slope_and_a_fitted_line_keeps_what_was_measured() -> None:
    """Two live points at 212 and 216 req/s (gcnet at 3x) were fitted lead and tail slopes of 25 and 41 ms per 1,000
    req/s with the intercepts held at 0, which put 5-9 ms on every stage call at the rate they were measured at."""
    runs = [Overheads(lead_us=380, tail_us=330), Overheads(lead_us=420, tail_us=370)]
    close = [CostPoint(212.0, 1e5, 1e5, 300, 250, 100), CostPoint(216.0, 1e5, 1e5, 420, 420, 100)]
    fitted = fit_runs(runs, close)
    assert (fitted.lead_us, fitted.tail_us) == (400, 350)
    assert fitted.lead_per_krps_us == fitted.tail_per_krps_us == 0
    # rates far apart whose slope would cross 0 above no load: the line still goes through what was measured
    apart = [CostPoint(50.0, 1e5, 1e5, 10, 10, 100), CostPoint(150.0, 1e5, 1e5, 400, 350, 100),
             CostPoint(300.0, 1e5, 1e5, 900, 800, 100)]
    steep = fit_runs([Overheads(lead_us=400, tail_us=350)], apart)
    assert steep.at_rate(150).lead_for(1e5) == pytest.approx(400)
    assert steep.lead_per_krps_us == pytest.approx(400 / 0.15)  # lowered: through 0 at no load
    assert steep.at_rate(150).tail_for(1e5) == pytest.approx(350) and steep.tail_per_krps_us > 0


def test_the_way_outside_the_sidecar_grows_with_the_rate_by_its_tail() -> None:
    """Measured at three rates, the tail (not the median) rising 2 ms per 1000 req/s: the fit finds that slope,
    and the costs at a rate never measured give the tail a client would see there."""
    rng = np.random.default_rng(3)
    samples, rates = [], []
    for rate in (100.0, 500.0, 900.0):
        for x in rng.exponential(500, 5000):
            samples.append((0.0, 1000 + x + (2.0 * rate if x > 1500 else 0.0)))  # only the slow answers slow down
            rates.append(rate)
    f = fit_front(Overheads(), samples, rates)
    assert f.front_per_krps_us == pytest.approx(2000, rel=0.2) and f.rate_dependent
    # the distribution is the one measured at the lowest rate: the higher rates' bodies, moved down by the tail's
    # slope, would put its median near 0
    assert f.front_at(0.5) == pytest.approx(1000 + 500 * np.log(2), rel=0.05)
    p99_at_700 = float(np.percentile([1000 + x + 1400 * (x > 1500) for x in rng.exponential(500, 20_000)], 99))
    assert f.at_rate(700).front_at(0.99) == pytest.approx(p99_at_700, rel=0.1)
    # and its body does not move: shifted whole by the tail's slope, the median at 700 req/s was 1.2 ms higher
    assert f.at_rate(700).front_at(0.5) == pytest.approx(f.front_at(0.5), abs=50)
    assert f.front_slopes_per_krps_us[50] < 50
    # below the lowest rate measured the tail is taken as measured there, not extrapolated down
    assert f.front_rate_rps == 100 and f.at_rate(20).front_at(0.99) == pytest.approx(f.at_rate(100).front_at(0.99))
    assert Overheads.from_dict(f.to_dict()) == f
    # one rate (or too few answers at the others) says nothing about a slope
    assert fit_front(Overheads(), samples[:5000], rates[:5000]).front_per_krps_us == 0.0
    assert fit_front(Overheads(), samples[:5100], rates[:5100]).front_per_krps_us == 0.0


def test_slopes_round_trip_and_fold_at_a_rate() -> None:
    c = Overheads(lead_us=300, tail_us=200, lead_per_mb_us=40, lead_per_krps_us=200, tail_per_krps_us=100,
                  front_per_mb_us=7)
    assert Overheads.from_dict(c.to_dict()) == c
    at = c.at_rate(500)
    assert (at.lead_us, at.tail_us, at.rate_dependent) == (400, 250, False)
    assert at.lead_for(2e6) == 480 and at.front_extra_us(1e6) == 7
    # the way outside the sidecar: its measured quantiles move with the rate; with none, front_us does
    sampled = replace(c, front_per_krps_us=1000).with_front_samples([1000.0, 3000.0])
    assert sampled.at_rate(500).front_at(0.99) == pytest.approx(sampled.front_at(0.99) + 500)
    assert sampled.at_rate(500).front_us == sampled.front_us
    assert Overheads(front_us=2000, front_per_krps_us=1000).at_rate(250).front_us == 2250
    assert Overheads(front_us=2000, front_per_krps_us=1000, front_rate_rps=100).at_rate(250).front_us == 2150
    assert "lead_per_mb_us" not in Overheads(lead_us=1).to_dict()  # flat costs write the file they always did
    # costs a sidecar measured at 500 req/s are those of the model at 500 req/s, not a base its slope adds to
    seen = c.rebased({"lead_us": 900.0, "tail_us": 260.0}, 500)
    assert seen.at_rate(500).lead_us == 900 and seen.at_rate(500).tail_us == 260 and seen.lead_per_mb_us == 0


def test_rate_terms_follow_the_stage_calls_of_the_plan_they_are_taken_for() -> None:
    """Fitted on a whole-model plan (one call per request), a two-stage plan's costs at a rate are the whole-model
    plan's at twice it; at half the batch, twice again; the ratio counts pipelines by their rates."""
    whole = Overheads(front_us=2000, tail_us=100, front_per_krps_us=1000, tail_per_krps_us=200,
                      rate_calls_per_request=stage_calls_per_request([(400.0, 1, 1)]))
    assert Overheads.from_dict(whole.to_dict()) == whole
    two = stage_calls_per_request([(300.0, 2, 1), (100.0, 2, 1)])
    assert two == 2.0 and stage_calls_per_request([(300.0, 2, 2), (100.0, 1, 1)]) == pytest.approx(1.0)
    assert whole.at_rate(400, two).front_us == whole.at_rate(800).front_us == 2800
    assert whole.at_rate(400, two).tail_us == pytest.approx(260)
    assert whole.at_rate(400, 1.0) == whole.at_rate(400)  # the plan it was fitted on: as measured
    assert replace(whole, rate_calls_per_request=0).at_rate(400, two).front_us == 2400  # not known: not scaled
    # what the two-stage plan's sidecar measured at 400 req/s is what its costs at 400 req/s are
    assert whole.rebased({"tail_us": 300.0}, 400, two).at_rate(400, two).tail_us == pytest.approx(300)
    plan = ppipe_plan(batch=2, slo_us=60_000.0)
    assert plan.stage_calls_per_request() == pytest.approx(
        sum(pl.throughput_rps * len(pl.partitions) / pl.batch for pl in plan.models[0].pipelines)
        / sum(pl.throughput_rps for pl in plan.models[0].pipelines))


def test_a_plan_says_where_its_costs_were_calibrated_on_another_plan_or_far_below_its_promise() -> None:
    plan = ppipe_plan(batch=2, slo_us=60_000.0)
    promise, calls = sum(plan.capacity_rps().values()), plan.stage_calls_per_request()
    assert reach_note(plan, None) == () and reach_note(plan, Overheads()) == ()  # nothing known: nothing said
    assert reach_note(plan, Overheads(calibrated_rps=promise, rate_calls_per_request=calls)) == ()
    low = reach_note(plan, Overheads(calibrated_rps=promise / 2, rate_calls_per_request=calls))
    assert len(low) == 1 and "costs extrapolated" in low[0] and "poolpipe calibrate" in low[0]
    assert reach_note(plan, Overheads(calibrated_rps=promise, rate_calls_per_request=calls / 2))
    assert Overheads.from_dict(Overheads(calibrated_rps=12.5).to_dict()).calibrated_rps == 12.5
    # calibrated on this very plan, or on another one cut, sized or batched otherwise
    mine = Overheads(calibrated_rps=promise, rate_calls_per_request=calls, calibrated_layouts=(plan.layout_key(),))
    assert reach_note(plan, mine) == () and Overheads.from_dict(mine.to_dict()) == mine
    elsewhere = reach_note(plan, replace(mine, calibrated_layouts=("0" * 16,)))
    assert len(elsewhere) == 1 and "not this one" in elsewhere[0]
    # served with a 2 ms deadline reserve: a plan keeping 1 ms rests on a reserve no step measured; 2.3 ms does not
    served = replace(mine, calibrated_front_us=2000.0)
    assert all(reach_note(plan, replace(served, front_us=us)) == () for us in (2000.0, 2300.0))
    smaller = reach_note(plan, replace(served, front_us=1000.0))
    assert len(smaller) == 1 and "served with a 2.0 ms deadline reserve" in smaller[0] and "keeps 1.0 ms" in smaller[0]
    assert Overheads.from_dict(served.to_dict()) == served


def test_a_calibration_that_saw_its_plan_miss_holds_a_plan_of_that_layout_to_it() -> None:
    """convnext_large at 3x: its calibration's last step missed (98.9 % at 412.1 req/s), the costs it fitted promised
    421.6 for the same plan, which held 365 live. What a calibration measured of a plan now bounds its promise."""
    assert limit_share([(0.25, 1.0), (0.5, 1.0), (0.75, 0.994), (1.0, 0.989)]) == pytest.approx(0.95)
    assert limit_share([(0.25, 1.0), (0.5, 0.985), (1.0, 0.999)]) is None  # a short step's noise below one that held
    assert limit_share([(0.5, 0.98)]) == pytest.approx(0.25)  # from full attainment at no load
    assert limit_share([(0.25, 1.0), (0.5, 0.99)]) is None
    # a miss far above the last step that held gets a step between them, and the limit then comes from the nearer two
    steps = [(0.25, 1.0), (0.5, 1.0), (0.75, 0.9935), (1.0, 0.986)]
    assert between_share(steps) == pytest.approx(0.875) and limit_share(steps) == pytest.approx(0.8667, abs=1e-3)
    assert limit_share([*steps, (0.875, 0.996)]) == pytest.approx(0.95)
    assert between_share([*steps, (0.875, 0.996)]) is None  # 0.125 apart: close enough
    assert between_share([(0.25, 1.0), (0.5, 1.0)]) is None and between_share([(0.1, 0.5)]) is None
    one_try = Step(1.0, 100.0, 95.0, Overheads(), (), {"m": RunResult(100, 99, 1, 0, (), None, 0.0)})
    assert held_share(one_try) == pytest.approx(0.99)
    assert held_share(replace(one_try, tries=(0.995, 0.982))) == pytest.approx(0.9885)  # both tries weigh alike
    assert held_share(replace(one_try, tries=(0.988, 0.784, 0.991))) == pytest.approx(0.988)  # a stalled try: outvoted
    plan, arrivals = ppipe_plan(batch=2, slo_us=60_000.0), parse_arrivals("poisson")
    name = plan.models[0].name
    free = predicted_rps(plan, arrivals, Overheads())[name]
    held = Overheads(measured_limits=(MeasuredLimit(plan.layout_key(), name, free / 2),))
    assert predicted_rps(plan, arrivals, held)[name] == pytest.approx(free / 2)
    assert evaluator("analytic")[1](plan, arrivals, held)[name] == pytest.approx(free / 2)
    reach = Overheads(calibrated_rps=free / 4)  # no promise beyond 1.25x the rates its costs were measured at
    assert predicted_rps(plan, arrivals, reach)[name] == pytest.approx(1.25 * free / 4)
    capped_note = reach_note(replace(plan, models=tuple(replace(m, sustainable_rps=1.25 * free / 4)
                                                          for m in plan.models)), reach)
    assert "held to 1.25x" in capped_note[0]
    other = ppipe_plan(batch=1, slo_us=60_000.0)  # another layout: its own costs decide
    assert other.layout_key() != plan.layout_key()
    assert predicted_rps(other, arrivals, held) == predicted_rps(other, arrivals, Overheads())
    assert Overheads.from_dict(held.to_dict()).measured_limits == held.measured_limits
    with pytest.raises(ValueError, match="measured_limits"):
        Overheads.from_dict({"measured_limits": [{"layout": "x", "model": name}]})
    assert limit_note(plan, held) == () and limit_note(plan, Overheads()) == ()  # not held to it: nothing said
    capped = replace(plan, models=tuple(replace(m, sustainable_rps=free / 2) for m in plan.models))
    assert "promise held to measurement" in limit_note(capped, held)[0]


def test_the_planner_never_promises_a_plan_more_than_its_calibration_held() -> None:
    from tests.test_sustained import small_spec

    spec = small_spec(1, 3)
    ask = {"time_limit_s": 20, "evaluator": "analytic"}
    first = plan_for(spec, PlanRequest(**ask, overheads=Overheads(lead_us=300, tail_us=300))).plan
    name, promised = first.models[0].name, first.models[0].sustainable_rps
    limit = MeasuredLimit(first.layout_key(), name, 0.9 * promised)
    again = plan_for(spec, PlanRequest(**ask, overheads=Overheads(lead_us=300, tail_us=300,
                                                                   measured_limits=(limit,)))).plan
    assert again.layout_key() == first.layout_key()  # still the best, held to what was measured, and it says so
    assert again.models[0].sustainable_rps == pytest.approx(0.9 * promised)
    assert any("promise held to measurement" in n for n in again.notes)
    assert not any("promise held" in n for n in first.notes)


def test_the_simulated_policy_plans_with_the_slowed_compute_the_sidecar_measures() -> None:
    """Compute (a stage's latency less its hop) slowed, the hop as it was; the run then computes it as planned."""
    topo = with_stage_overhead(topology_from_plan(ppipe_plan(batch=2, slo_us=60_000.0)), 300.0)
    slow = with_slowdown(topo, 1.1)
    assert with_slowdown(topo, 1.0) is topo
    for ps, qs in zip(topo.pipelines.values(), slow.pipelines.values()):
        for p, q in zip(ps, qs):
            for s, t in zip(p.stages, q.stages):
                for b, us in s.latency_us.items():
                    assert t.latency_us[b] == pytest.approx((us - 300.0) * 1.1 + 300.0)
                    assert t.hop_us[b] == s.hop_us[b]


def test_costs_that_grow_with_the_rate_lower_the_promise_and_the_simulated_rate_alike() -> None:
    plan = ppipe_plan(batch=2, slo_us=60_000.0)
    flat = Overheads(lead_us=400, tail_us=300)
    steep = replace(flat, lead_per_krps_us=100_000, tail_per_krps_us=100_000)  # +10 ms each way a call, 100 req/s
    arrivals = parse_arrivals("poisson")
    promised = {k: predicted_rps(plan, arrivals, c)[plan.models[0].name] for k, c in (("flat", flat),
                                                                                      ("steep", steep))}
    assert 0 < promised["steep"] < 0.8 * promised["flat"]
    rate = {plan.models[0].name: 100.0}
    att = {k: run_point(PointJob(plan, rate, "ppipe", "poisson", 1.0, 20.0, 1, driver="live",
                                 overheads=c))[0]["models"][plan.models[0].name]["slo_attainment"]
           for k, c in (("flat", flat), ("steep", steep))}
    # where the flat costs hold, the simulator, counting the same costs grown at the rate, no longer does
    assert att["flat"] >= 0.99 and att["steep"] < 0.9


def test_calibrate_fits_costs_on_a_live_deployment_and_plan_finds_them(tmp_path) -> None:
    cluster = write_cluster(tmp_path / "cluster.json", emulated_hosts())
    generate(ppipe_plan(), {}, cluster, tmp_path / "deploy", emulated_tensor_scale=SCALE)
    out = tmp_path / "poolpipe-costs.json"
    r = run_cli("calibrate", tmp_path / "deploy", "--launch", "--shares", "0.1,0.3", "--duration-s", "4",
                "--out", out, "--work", tmp_path / "work", timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "step 2/2" in r.stdout and "wrote" in r.stdout
    costs = read_overheads(out)
    doc = json.loads(out.read_text())
    steps = doc["calibration"]["steps"]
    assert [s["share"] for s in steps] == [0.1, 0.3]
    assert all(s["served_rps"] > 0 and s["kinds_of_call"] >= 1 for s in steps)
    assert steps[1]["served_rps"] > 1.5 * steps[0]["served_rps"]
    at = costs.at_rate(steps[0]["served_rps"])  # at a rate it served (a base alone may be extrapolated to 0)
    assert 0 < at.lead_us < 50_000 and 0 < at.tail_us < 50_000
    assert len(costs.front_quantiles_us) > 0  # the client measured the way outside the sidecar's clock
    assert costs.lead_shape and costs.tail_shape  # how each call's costs spread about their means
    assert costs.calibrated_layouts == (ppipe_plan().layout_key(),)  # and which plan it measured
    assert costs.calibrated_front_us == front_reserve_us(ppipe_plan())  # with the reserve its serve kept
    assert costs.rate_calls_per_request == pytest.approx(ppipe_plan().stage_calls_per_request())  # whose rates
    assert any(costs.calibrated_rps == pytest.approx(s["served_rps"]) for s in steps)  # how far they reach
    reserve = doc["calibration"]["front_reserve"]  # the deadline's reserve the simulator sustained most with
    assert costs.front_us == reserve["chosen_us"] == kept_reserve(
        {float(r): v for r, v in reserve["simulated_rps"].items()})
    assert "deadline reserve for the way outside the sidecar's clock" in r.stdout
    # `poolpipe plan` run where the file is takes it without --overheads, says so and records it
    (tmp_path / "tiny.json").write_text(json.dumps(tiny_profile()))
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump({
        "cluster": {"gpus": {"A": 1, "B": 2}, "bandwidth_gbps": 1000}, "max_partitions": 2,
        "models": [{"profile": "tiny.json", "slo_us": 1e6}]}))
    r = run_cli("plan", "--spec", "spec.yaml", "--objective", "throughput", "--out", "p.json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "costs: measured, from poolpipe-costs.json" in r.stdout and "uncalibrated" not in r.stdout
    assert json.loads((tmp_path / "p.json").read_text())["request"]["overheads"]["lead_us"] == costs.lead_us


@pytest.mark.skipif(native_front.library() is None, reason="no C compiler here")
def test_calibrate_through_the_native_front_end(tmp_path) -> None:
    """--native-front: the steps' clients go through serve --native-grpc-port, and still measure the way outside the
    sidecar's clock (the sidecar's time comes back through Triton's front end in each answer)."""
    cluster = write_cluster(tmp_path / "cluster.json", emulated_hosts())
    generate(ppipe_plan(), {}, cluster, tmp_path / "deploy", emulated_tensor_scale=SCALE)
    out = tmp_path / "costs.json"
    r = run_cli("calibrate", tmp_path / "deploy", "--launch", "--native-front", "--shares", "0.2", "--duration-s",
                "3", "--out", out, "--work", tmp_path / "work", timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "event=native_front_listening" in (tmp_path / "work" / "sidecar.log").read_text()
    step = json.loads(out.read_text())["calibration"]["steps"][0]
    assert step["served_rps"] > 0 and 0 < step["front_p50_us"] <= step["front_p99_us"] < 1e6
    assert len(read_overheads(out).front_quantiles_us) > 0


def test_calibrate_refuses_a_plan_that_promises_nothing(tmp_path) -> None:
    """A plan whose promise is 0 (no pipeline fits its SLO with the costs it was made with) leaves no load to offer:
    steps at shares of it would measure an idle sidecar (tail 0, attainment 100 %) and a plan made from those would
    promise far too much (698 req/s for tf_efficientdet_d1 at 2.5x, where 176 held). It is refused, saying why."""
    plan = ppipe_plan()
    plan = replace(plan, models=tuple(replace(m, sustainable_rps=0.0) for m in plan.models))
    cluster = write_cluster(tmp_path / "cluster.json", emulated_hosts())
    generate(plan, {}, cluster, tmp_path / "deploy", emulated_tensor_scale=SCALE)
    r = run_cli("calibrate", tmp_path / "deploy", "--shares", "0.5", "--out", tmp_path / "c.json", timeout=120)
    assert r.returncode != 0 and "promises 0 req/s" in r.stderr and not (tmp_path / "c.json").exists()
