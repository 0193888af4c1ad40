"""The sustained objective: the closed form against the simulator (which runs the shipped driver), candidate
plans over margins, the recorded sustainable rates, and the CLI's flags."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner import PlanRequest, plan
from planner.ppipe.reference_plans import load_reference_plans, spec_from_reference
from planner.sustained.capacity import COST_RISE, cost_resilience, predicted_rps, risen
from planner.sustained.choice import (
    MODEL_ERROR,
    OWN_PLAN_TOLERANCE,
    CandidatePlan,
    kept,
    robust_best,
    to_verify,
)
from planner.sustained.queueing import PipelineTerms, PoolTerms, erlang_c, shed_fraction, sustainable_rps
from planner.sustained.search import with_serving_costs
from plans.arrivals import parse_arrivals
from plans.spec.planning_spec import ClusterSpec, check_spec
from poolpipe_common.errors import InputError
from poolpipe_common.overheads import DEFAULT_OVERHEADS
from profiling.reference import import_ppipe_profile
from scheduler.sim.sustain import simulated_rps
from scheduler.sim.sweep import PointJob, run_point
from tests.conftest import REFERENCE_DIR, run_cli
from workloads.arrivals import parse_trace

MODEL = "centernet-update_r50-caffe_fpn_ms-1x_coco"
# The closed form ranks candidates for the simulator to measure (and sets where its search starts): over every
# candidate plan of every model on 4 L4 + 12 T4 at 3x (benchmarks/closed_form.py --quick) it came within 10 % of the
# simulator on 79 % of them; it is not a promise, so it is held to this band.
CLOSED_FORM_BAND = (0.85, 1.15)
# What plan.json promises (the simulator's rate, seed 0) must hold, on other arrivals (seed 7), to within this.
PROMISE_ATTAINMENT = 0.985


def small_spec(l4: int, t4: int, slo_factor: float = 3.0, margin: float = 0.3):
    entry = next(e for e in load_reference_plans() if e["suite"] == "ablation" and len(e["models"]) == 1
                 and e["models"][0]["model"] == MODEL and tuple(e["cluster"]["gpu_name_arr"]) == ("L4", "T4"))
    spec = spec_from_reference(entry)
    c = spec.cluster
    ms = spec.models[0]
    slo = slo_factor * ms.profile.latency_us("L4", 1, 1, 0, len(ms.profile.blocks))
    ms = dataclasses.replace(ms, slo_us=slo, slo_margin_us=margin * slo)
    return check_spec(dataclasses.replace(spec, cluster=ClusterSpec({"L4": l4, "T4": t4}, c.gpus_per_server,
                                                                    c.bandwidth_gbps, c.vgpu_levels), models=(ms,)))


def test_erlang_c_matches_known_values():
    assert erlang_c(1, 0.5) == pytest.approx(0.5)  # M/M/1: P(wait) = rho
    assert erlang_c(2, 1.0) == pytest.approx(1 / 3)
    assert erlang_c(3, 3.0) == 1.0


def test_more_vgpus_at_equal_capacity_sustain_more():
    """Many small vGPUs queue less than one big one of the same capacity: the closed form must see it."""
    one = [PipelineTerms(1, (PoolTerms(1, 2_000.0),), 2_000.0)]
    four = [PipelineTerms(1, (PoolTerms(4, 8_000.0),), 8_000.0)]
    assert sustainable_rps(four, 20_000.0) > sustainable_rps(one, 20_000.0) * 0.9
    assert sustainable_rps(one, 2_500.0) < sustainable_rps(one, 20_000.0)


@given(c=st.integers(1, 16), rho=st.floats(0.05, 1.5), slack=st.floats(0.0, 200_000.0))
def test_a_pool_sheds_what_cannot_wait_and_no_more(c, rho, slack):
    """The sidecar sheds a batch whose wait would pass its slack: never more than the unbounded queue's P(W > d), at
    least the overload's 1 - 1/rho, and less the more slack there is."""
    pool = PoolTerms(c, 10_000.0)
    batches = rho * c / pool.service_us
    shed = shed_fraction(pool, batches, slack, 1.0)
    assert 0.0 <= shed <= 1.0
    if rho < 1:
        assert shed <= erlang_c(c, rho * c) + 1e-12
    else:
        assert shed >= 1.0 - 1.0 / rho - 1e-9
    assert shed_fraction(pool, batches, slack + 10_000.0, 1.0) <= shed + 1e-12
    assert shed_fraction(pool, batches, -1.0, 1.0) == 1.0


def test_a_pipeline_near_the_slo_weighs_on_the_model_as_its_own_slack_says():
    """Pipelines queue as one pool, but a request landing on the one whose latency nearly fills the SLO has little
    slack: the model sustains less than with both pipelines at their mean latency."""
    near, far = (PipelineTerms(1, (PoolTerms(4, 10_000.0),), lat) for lat in (19_000.0, 5_000.0))
    mean = PipelineTerms(1, (PoolTerms(4, 10_000.0),), 12_000.0)
    assert sustainable_rps([near, far], 20_000.0) < sustainable_rps([mean, mean], 20_000.0)


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(l4=st.integers(1, 3), t4=st.integers(0, 6), margin=st.sampled_from([0.1, 0.2, 0.3]),
       load=st.floats(0.5, 1.0))
def test_the_promised_rate_holds_on_other_arrivals(l4, t4, margin, load):
    """Over pool sizes (clusters and margins make them) and loads up to the promise: plan.json's sustainable_rps,
    simulated on arrivals it was not measured on, keeps >= PROMISE_ATTAINMENT."""
    p = plan(small_spec(l4, t4, margin=margin), PlanRequest(objective="throughput", time_limit_s=30, verify=True)).plan
    m = p.models[0]
    # an L4 runs the whole model within a third of the SLO: every such cluster sustains some rate
    assert m.sustainable_rps is not None and 0 < m.sustainable_rps <= m.throughput_rps * 1.05, m
    summary, _ = run_point(PointJob(p, {MODEL: m.throughput_rps}, "ppipe", parse_trace("poisson"),
                                    load * m.sustainable_rps / m.throughput_rps, 20.0, 7, driver="live",
                                    overheads=DEFAULT_OVERHEADS))
    assert summary["models"][MODEL]["slo_attainment"] >= PROMISE_ATTAINMENT, (load, m.sustainable_rps)


@pytest.mark.parametrize("l4,t4,margin", [(2, 0, 0.2), (2, 3, 0.3), (1, 4, 0.2)])
def test_the_closed_form_ranks_within_its_stated_band(l4, t4, margin):
    """The closed form only ranks candidates for the simulator to measure: within CLOSED_FORM_BAND of it."""
    p = plan(small_spec(l4, t4, margin=margin),
             PlanRequest(objective="throughput", evaluator="none", time_limit_s=30)).plan
    arrivals = parse_arrivals("poisson")
    predicted = predicted_rps(p, arrivals, DEFAULT_OVERHEADS)[MODEL]
    simulated = simulated_rps(p, arrivals, DEFAULT_OVERHEADS)[MODEL]
    lo, hi = CLOSED_FORM_BAND
    assert lo * simulated <= predicted <= hi * simulated, (predicted, simulated)


def test_compute_slower_than_profiled_shrinks_the_budget_the_milp_screens_with():
    """With compute at ``slowdown`` x the profile's, a pipeline the MILP keeps fits its SLO at the slowed latency:
    budget and stage cost divided by the slowdown (profiled + cost <= budget <=> slowed + cost x s <= SLO - margin)."""
    spec = small_spec(2, 3, margin=0.0)
    flat, slow = DEFAULT_OVERHEADS, dataclasses.replace(DEFAULT_OVERHEADS, slowdown=1.025)
    m0, m1 = with_serving_costs(spec, 0.1, flat).models[0], with_serving_costs(spec, 0.1, slow).models[0]
    assert (m1.slo_us - m1.slo_margin_us) * 1.025 == pytest.approx(m0.slo_us - m0.slo_margin_us)
    assert m1.stage_overhead_us * 1.025 == pytest.approx(m0.stage_overhead_us)


def test_plans_keep_the_way_outside_the_sidecars_clock_free():
    """The front path (overheads front_us, serve --front-us) is kept free under the SLO by every candidate plan and
    lowers the closed form's rate: the client's latency includes it."""
    spec = small_spec(2, 3, margin=0.0)
    none = dataclasses.replace(DEFAULT_OVERHEADS, front_us=0.0)
    far = dataclasses.replace(DEFAULT_OVERHEADS, front_us=8_000.0)
    near = with_serving_costs(spec, 0.1, none).models[0].slo_margin_us
    assert with_serving_costs(spec, 0.1, far).models[0].slo_margin_us == near + 8_000
    p = plan(spec, PlanRequest(objective="throughput", evaluator="none", time_limit_s=30)).plan
    arrivals = parse_arrivals("poisson")
    assert predicted_rps(p, arrivals, far)[MODEL] < predicted_rps(p, arrivals, none)[MODEL]


def test_sustained_plan_records_what_it_holds_and_beats_the_fixed_margin():
    """The default objective on the emulated 4 L4 + 12 T4: plan.json's sustainable_rps holds on other arrivals,
    and it is more than the old default plan (margin 0.3 of the SLO, nominal objective) holds."""
    sustained = plan(small_spec(4, 12, margin=0.0), PlanRequest(time_limit_s=30)).plan
    fixed = plan(small_spec(4, 12, margin=0.3), PlanRequest(objective="throughput", time_limit_s=30, verify=True)).plan
    m = sustained.models[0]
    assert m.arrivals == "poisson" and 0 < m.sustainable_rps <= m.throughput_rps * 1.05
    summary, _ = run_point(PointJob(sustained, {MODEL: m.throughput_rps}, "ppipe", parse_trace("poisson"),
                                    m.sustainable_rps / m.throughput_rps, 30.0, 7, driver="live",
                                    overheads=DEFAULT_OVERHEADS))
    assert summary["models"][MODEL]["slo_attainment"] >= PROMISE_ATTAINMENT
    assert fixed.models[0].sustainable_rps is not None  # a verified throughput plan says what it holds
    assert m.sustainable_rps >= 1.1 * fixed.models[0].sustainable_rps, (m.sustainable_rps, fixed.models[0])
    doc = sustained.to_dict()
    assert doc["models"][0]["sustainable_rps"] == m.sustainable_rps and doc["request"]["objective"] == "sustained"
    assert doc["sustained"]["evaluated_by"] == "simulated"
    assert sum(c["chosen"] for c in doc["sustained"]["candidates"]) == 1


def test_plan_cli_prints_both_rates_and_takes_overheads_and_arrivals(tmp_path):
    prof = tmp_path / "centernet.json"
    import_ppipe_profile(REFERENCE_DIR, MODEL).save(prof)
    (tmp_path / "ov.json").write_text(json.dumps({"format": "poolpipe.overheads/1", "lead_us": 500.0,
                                                  "tail_us": 400.0, "slowdown": 1.0}))
    r = run_cli("plan", "--profile", prof, "--gpus", "L4=1,T4=3", "--slo-multiplier", "3",
                "--overheads", tmp_path / "ov.json", "--arrivals", "bursty:2", "--out", tmp_path / "plan.json")
    assert r.returncode == 0, r.stderr
    out = " ".join(r.stdout.split())
    assert "sustained at 99% SLO (bursty:2)" in out and "nominal" in out
    doc = json.loads((tmp_path / "plan.json").read_text())
    assert doc["models"][0]["arrivals"] == "bursty:2" and doc["models"][0]["sustainable_rps"] > 0
    assert doc["request"]["overheads"]["lead_us"] == 500.0
    bad = run_cli("plan", "--profile", prof, "--gpus", "L4=1", "--slo-multiplier", "3", "--arrivals", "uniform",
                  "--out", tmp_path / "x.json")
    assert bad.returncode != 0 and "--arrivals 'uniform'" in bad.stderr
    assert not (tmp_path / "x.json").exists()


def test_cost_objective_sustains_the_rate_it_was_asked_for():
    spec = small_spec(4, 12, margin=0.0)
    p = plan(spec, PlanRequest(objective="cost", rates_rps={MODEL: 150.0}, prices={"L4": 0.8, "T4": 0.35},
                               time_limit_s=30)).plan
    assert p.models[0].sustainable_rps >= 150.0
    summary, _ = run_point(PointJob(p, {MODEL: p.models[0].throughput_rps}, "ppipe", parse_trace("poisson"),
                                    150.0 / p.models[0].throughput_rps, 30.0, 7, driver="live",
                                    overheads=DEFAULT_OVERHEADS))
    assert summary["models"][MODEL]["slo_attainment"] >= PROMISE_ATTAINMENT


@pytest.mark.parametrize("text,scv", [("poisson", 1.0), ("bursty:2", 4.0), ("replay:azure-conv", 1.0)])
def test_arrivals_parse(text, scv):
    assert parse_arrivals(text).scv == scv and str(parse_arrivals(text)) == text


@pytest.mark.parametrize("text", ["", "bursty", "bursty:-1", "replay:", "uniform"])
def test_bad_arrivals_say_what_is_expected(text):
    with pytest.raises(InputError, match="--arrivals"):
        parse_arrivals(text)


def test_promises_are_measured_in_the_specs_workload_mix():
    """Every model is offered its weight's share, scaled so the model with the least nominal throughput per weight
    gets its nominal rate: a model with spare pools is not offered more than its clients send, and the others are
    not offered less than theirs (which made one model's promise miss by a third in beyond_ppipe_inss)."""
    from plans.plan_json import ModelPlan, Plan
    from scheduler.sim.sustain import mix_rates

    def model(name, thr, weight):
        return ModelPlan(name, 1e5, thr, (), None, weight=weight)

    plan = Plan("p", "ppipe", 0.0, ClusterSpec({"T4": 1}, {"T4": 1}, 10.0, {"T4": 1}),
                (model("a", 74.5, 0.3), model("b", 210.3, 0.33), model("c", 151.8, 0.37), model("d", 0.0, 1.0)))
    rates = mix_rates(plan)
    assert rates["a"] == pytest.approx(74.5)  # the bottleneck: 74.5 / 0.3 per weight
    assert rates["b"] == pytest.approx(0.33 * 74.5 / 0.3) and rates["c"] == pytest.approx(0.37 * 74.5 / 0.3)
    assert rates["d"] == 0.0  # a model without pools is offered nothing and sets no scale
    assert mix_rates(dataclasses.replace(plan, models=plan.models[1:2])) == {"b": pytest.approx(210.3)}


def _candidate(margin: float | None, rate: float, stages: int = 2) -> CandidatePlan:
    """A measured candidate of one model (weight 1) that sustains ``rate`` with pipelines of ``stages`` partitions."""
    pipeline = SimpleNamespace(throughput_rps=rate, partitions=(None,) * stages)
    one = SimpleNamespace(models=(SimpleNamespace(name="m", weight=1.0, pipelines=(pipeline,)),))
    return CandidatePlan(margin, one, {"m": rate}, {"m": rate})


def test_the_specs_own_plan_is_kept_unless_a_candidate_sustains_clearly_more():
    """A gain within the simulator's spread between seeds does not replace the spec's own plan; a larger one does."""
    own = _candidate(None, 100.0)
    close = _candidate(0.2, 100.0 * (1 + OWN_PLAN_TOLERANCE / 2))
    clear = _candidate(0.1, 100.0 * (1 + 2 * OWN_PLAN_TOLERANCE))
    assert kept([own, close]) is own
    assert kept([close, own, clear]) is clear
    assert kept([close, _candidate(0.3, 90.0)]) is close  # no own plan measured: the best


def test_between_plans_within_the_models_error_the_one_with_fewer_stage_calls_is_kept():
    """A plan with fewer cuts loses less when serving's per-stage costs rise: within MODEL_ERROR it is preferred;
    beyond it the plan that sustains more wins; among equals, the one with more slack."""
    cut = _candidate(0.1, 100.0, stages=3)
    whole = _candidate(0.05, 100.0 * (1 - MODEL_ERROR / 2), stages=1)
    far = _candidate(0.05, 100.0 * (1 - 2 * MODEL_ERROR), stages=1)
    assert robust_best([cut, whole]) is whole and robust_best([cut, far]) is cut
    slack = _candidate(0.2, 99.5, stages=3)
    assert robust_best([cut, slack]) is slack


def test_a_plan_passed_over_on_screened_rates_is_measured_again_before_the_choice():
    """The screen's rates are a quarter-length run's to MODEL_ERROR: the kept plan and the best-rated other within
    MODEL_ERROR of the best (which kept() may have passed over for a more robust one) both go to the full-length
    measurement, the kept one first; a plan rated further down does not, nor do rivals of the spec's own plan kept."""
    cut = _candidate(0.1, 100.0, stages=2)
    whole = _candidate(0.3, 100.0 * (1 - MODEL_ERROR / 3), stages=1)
    assert to_verify([cut, whole]) == [whole, cut]
    assert to_verify([_candidate(0.2, 100.0 * (1 - MODEL_ERROR / 2), stages=2), whole, cut]) == [whole, cut]
    own = _candidate(None, 100.0)
    close = _candidate(0.2, 100.0 * (1 + OWN_PLAN_TOLERANCE / 2))
    assert to_verify([close, own]) == [own]  # the spec's own plan stays unless one is clearly better
    clear = _candidate(0.1, 100.0 * (1 + 2 * OWN_PLAN_TOLERANCE))
    assert to_verify([close, own, clear]) == [clear, own, close]
    assert to_verify([cut, _candidate(0.3, 90.0, stages=1)]) == [cut]  # nothing within MODEL_ERROR: it alone


def test_a_plan_that_holds_clearly_more_once_costs_rise_is_kept_instead():
    """The kept plan gives way to one that would sustain more than MODEL_ERROR more with serving's costs risen
    (its rates scaled by its resilience); within that, the plan that sustains the most stays."""
    cut, whole = _candidate(0.025, 100.0, stages=2), _candidate(0.15, 92.0, stages=1)
    cut.resilience, whole.resilience = {"m": 0.65}, {"m": 0.91}
    assert kept([cut, whole]) is whole
    whole.resilience = {"m": 0.72}  # 66.2 against 65: not clearly more
    assert kept([cut, whole]) is cut
    own = _candidate(None, 100.0, stages=2)
    own.resilience = {"m": 0.5}
    assert kept([own, whole]) is whole  # the spec's own plan gives way too


def test_a_plan_with_less_slack_keeps_less_of_its_rate_when_costs_rise():
    """cost_resilience: the closed form's rate with serving's costs COST_RISE higher over its rate; a plan made with
    a narrow margin under its SLO (0.1) falls further than one made with a wide one (0.4), and none rises."""
    spec = small_spec(2, 3, slo_factor=2.5, margin=0.0)
    arrivals = parse_arrivals("poisson")
    ask = PlanRequest(objective="throughput", evaluator="none", time_limit_s=30)
    m = spec.models[0]
    tight, wide = (plan(dataclasses.replace(spec, models=(dataclasses.replace(m, slo_margin_us=f * m.slo_us),)),
                        ask).plan for f in (0.1, 0.4))
    kept_tight = cost_resilience(tight, arrivals, DEFAULT_OVERHEADS)[MODEL]
    kept_wide = cost_resilience(wide, arrivals, DEFAULT_OVERHEADS)[MODEL]
    assert 0.0 <= kept_tight < kept_wide <= 1.0
    assert risen(DEFAULT_OVERHEADS).lead_us == pytest.approx((1 + COST_RISE) * DEFAULT_OVERHEADS.lead_us)
