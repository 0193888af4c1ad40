"""Harpagon's module scheduler and SLO splitting: the paper's toy cases exactly, properties of schedules and splits
(hypothesis), the spec's ``applications`` and ``poolpipe plan`` writing them into plan.json."""

from __future__ import annotations

import json
import math

import pytest
import yaml
from hypothesis import example, given, settings
from hypothesis import strategies as st

from planner.apps.harpagon_module import Config, latency_cost_efficiency, schedule_module, worst_latency
from planner.apps.harpagon_split import AppGraph, SplitModule, cost_steps, split
from plans.plan_json import load_plan
from plans.spec.applications import apps_from_list
from poolpipe_common.errors import InputError
from profiling.reference import REFERENCE_DIR, import_ppipe_profile
from tests.conftest import run_cli

M1 = (Config(2, 0.160), Config(4, 0.200), Config(8, 0.320))
M3 = (Config(2, 0.100), Config(8, 0.250), Config(32, 0.800))


def test_toy_m1_batch_dispatch_needs_4_machines_round_robin_5() -> None:
    rr = schedule_module(100, 0.4, M1, "rr", multi=False, dummy=False)
    tc = schedule_module(100, 0.4, M1, "tc", multi=True, dummy=False)
    assert (rr.machines, [r.config.batch for r in rr.rows]) == (5, [4])
    assert (tc.machines, [r.config.batch for r in tc.rows]) == (4, [8])


@pytest.mark.parametrize("how, cost, rows", [
    (("rr", False, False), 6.3, [(8, 6, 192), (2, 0.3, 6)]),
    (("tc", False, False), 5.9, [(32, 4, 160), (2, 1, 20), (2, 0.9, 18)]),
    (("tc", True, False), 5.3, [(32, 4, 160), (8, 1, 32), (2, 0.3, 6)]),
    (("tc", True, True), 5.0, [(32, 5, 200)]),
])
def test_toy_m3_table_ii(how: tuple, cost: float, rows: list) -> None:
    """Table II: S1-S4 for M3 at 198 req/s within 1.0 s, configuration by configuration."""
    s = schedule_module(198, 1.0, M3, *how)
    assert s.cost == pytest.approx(cost)
    assert [(r.config.batch, r.count, r.rate) for r in s.rows] == [pytest.approx(x) for x in rows]
    assert s.dummy_rate == pytest.approx(2.0 if how[2] else 0.0)


def test_toy_latency_cost_efficiency() -> None:
    assert latency_cost_efficiency(100, M1[0], M1[1]) == pytest.approx(50.0)
    assert round(latency_cost_efficiency(100, M1[0], M1[2]), 1) == 18.2


configs_st = st.lists(st.builds(Config, st.sampled_from([1, 2, 4, 8, 16]), st.floats(0.005, 0.2),
                                st.sampled_from([0.35, 0.8, 1.0])), min_size=1, max_size=6)


@settings(max_examples=150, deadline=None)
@given(configs_st, st.floats(1, 500), st.floats(0.01, 1.0), st.sampled_from(["tc", "rr"]), st.booleans())
def test_schedules_serve_the_rate_within_the_budget(configs, rate, budget, dispatch, multi) -> None:
    s = schedule_module(rate, budget, configs, dispatch, multi)
    if s is None:
        return
    assert sum(r.rate for r in s.rows) == pytest.approx(rate + s.dummy_rate)
    for k, r in enumerate(s.rows):
        assert r.rate <= r.count * r.config.throughput * (1 + 1e-9)
        left = sum(x.rate for x in s.rows[k:])
        own = r.rate / math.ceil(r.count - 1e-9)
        assert r.worst_latency == pytest.approx(worst_latency(r.config, own, left, dispatch))
        assert r.worst_latency <= budget + 1e-9
    plain = schedule_module(rate, budget, configs, dispatch, multi, dummy=False)
    assert s.cost <= plain.cost + 1e-9  # dummy requests are added only where they pay


@settings(max_examples=80, deadline=None)
@given(configs_st, st.floats(5, 300), st.floats(0.02, 0.6))
@example([Config(16, 0.2, 0.35)], 120.0, 0.5999999999999999)  # a step 1e-16 above the budget, met within the slack
def test_cost_steps_are_exact(configs, rate, budget) -> None:
    """No budget up to ``budget`` gives a cheaper schedule than the last cost step within it."""
    m = SplitModule("m", rate, tuple(configs))
    within = [c for b, c in cost_steps(m) if b <= budget + 1e-9]  # the slack the scheduler and the split allow
    best = within[-1] if within else math.inf
    for k in range(1, 41):
        s = schedule_module(rate, budget * k / 40, configs)
        assert s is None or s.cost >= best - 1e-9


def _app(draw_modules: list, branch: bool, slo: float) -> AppGraph:
    mods = tuple(SplitModule(f"m{i}", rate, tuple(cfgs)) for i, (rate, cfgs) in enumerate(draw_modules))
    if branch and len(mods) >= 3:
        edges = (("m0", "m1"), ("m0", "m2")) + tuple((f"m{i - 1}", f"m{i}") for i in range(3, len(mods)))
    else:
        edges = tuple((f"m{i - 1}", f"m{i}") for i in range(1, len(mods)))
    return AppGraph("app", mods, edges, slo)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(10, 300), configs_st), min_size=2, max_size=4), st.booleans(),
       st.floats(0.05, 1.0))
def test_splits_meet_the_slo_and_the_optimum_is_least(modules, branch, slo) -> None:
    app = _app(modules, branch, slo)
    got = {}
    for method in ("uniform", "harpagon", "optimal"):
        try:
            s = split(app, method)
        except InputError:
            continue
        got[method] = s.cost
        assert app.latency(s.budgets) <= slo + 1e-6
        for n, sched in s.schedules.items():
            assert sched.worst_latency <= s.budgets[n] + 1e-9
    if "optimal" in got:
        assert "harpagon" in got  # the heuristic starts from the fastest schedules: feasible when any split is
        assert got["optimal"] <= min(got.values()) + 1e-6
    else:
        assert not got


SPEC_APP = {"name": "traffic", "slo_us": 120_000, "rate_rps": 100,
            "modules": [{"name": "det", "model": "googlenet-v3-pytorch"}, {"name": "cls", "model": "repvgg-b3"}],
            "edges": [{"from": "det", "to": "cls", "fan_out": 2, "tensors": {"out": "in"}}]}


@pytest.mark.parametrize("change, message", [
    ({"modules": [{"name": "det", "model": "nope"}]}, "'nope' is not one of the spec's models"),
    ({"edges": [{"from": "det", "to": "cls", "fan_out": 0}]}, "fan_out: must be > 0"),
    ({"edges": [{"from": "det", "to": "x"}]}, "'x' is not a module of the application"),
    ({"edges": []}, "exactly one source module .* it has 2: det, cls"),
    ({"edges": [{"from": "det", "to": "cls"}, {"from": "cls", "to": "det"}]}, "none \\(a cycle\\)"),
    ({"slo": 3}, "unknown field 'slo'"),
    ({"rate_rps": -1}, "rate_rps: must be > 0"),
])
def test_bad_spec_applications_give_one_line_errors(change: dict, message: str) -> None:
    with pytest.raises(InputError, match=message):
        apps_from_list([{**SPEC_APP, **change}], ["googlenet-v3-pytorch", "repvgg-b3"])


def test_app_rates_follow_the_fan_outs() -> None:
    (app,) = apps_from_list([SPEC_APP], ["googlenet-v3-pytorch", "repvgg-b3"])
    assert app.rates() == {"det": 100, "cls": 200}


def test_cli_plan_splits_the_applications_slo(tmp_path) -> None:
    """``poolpipe plan`` on a spec with an application: the module budgets fill the SLO, the models are planned
    under them, and plan.json carries the app for ``generate``."""
    for m in ("googlenet-v3-pytorch", "repvgg-b3"):
        import_ppipe_profile(REFERENCE_DIR, m).save(tmp_path / f"{m}.json")
    spec = {"cluster": {"gpus": {"L4": 2, "T4": 2}, "bandwidth_gbps": 10},
            "models": [{"profile": f"{m}.json", "slo_us": 200_000} for m in ("googlenet-v3-pytorch", "repvgg-b3")],
            "applications": [SPEC_APP]}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    r = run_cli("plan", "--spec", tmp_path / "spec.yaml", "--out", tmp_path / "plan.json", "--app-split", "optimal",
                "--price", "L4=0.8,T4=0.35", "--time-limit", "20")
    assert r.returncode == 0, r.stderr
    assert "application traffic: SLO 120.0 ms split by optimal" in r.stdout
    plan = load_plan(tmp_path / "plan.json")
    (app,) = plan.applications
    budgets = {m["name"]: m["slo_us"] for m in app["modules"]}
    assert sum(budgets.values()) == pytest.approx(120_000, abs=1)  # the chain's budgets fill the SLO
    assert [m["rate_rps"] for m in app["modules"]] == [100, 200]
    assert app["edges"][0]["tensors"] == {"out": "in"} and app["split"]["method"] == "optimal"
    slo = {m.name: m.slo_us for m in plan.models}
    assert slo == pytest.approx({"googlenet-v3-pytorch": budgets["det"], "repvgg-b3": budgets["cls"]}, abs=1)
    raw = json.loads((tmp_path / "plan.json").read_text())
    assert raw["applications"][0]["split"]["cost"] <= raw["applications"][0]["split"]["uniform_cost"] + 1e-9
    r = run_cli("plan", "--spec", tmp_path / "spec.yaml", "--out", tmp_path / "p2.json", "--app-split", "fastest")
    assert r.returncode == 2 and "invalid choice: 'fastest'" in r.stderr


def test_spec_application_through_plan_and_generate(tmp_path) -> None:
    """The testbed's det -> cls (real ONNX models): spec with the app -> ``poolpipe plan`` -> ``poolpipe generate``;
    manifest.json serves the app with the planned module budgets and rates."""
    from model_repository_gen.manifest import load_manifest
    from runtime.app_testbed import CLS, DET, FAN_OUT, build_app_plan

    plan0, paths = build_app_plan(tmp_path / "testbed")
    app = {"name": "traffic", "slo_us": 60_000, "rate_rps": 50,
           "modules": [{"name": DET, "model": DET}, {"name": CLS, "model": CLS}],
           "edges": [{"from": DET, "to": CLS, "fan_out": FAN_OUT, "tensors": {"crops": "feat"}}]}
    spec = {"cluster": {"gpus": {"A": 2}, "bandwidth_gbps": 10},
            "models": [{"profile": m.profile.to_dict(), "slo_us": 60_000} for m in plan0.models],
            "applications": [app]}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    hosts = [{"name": "hostA", "address": "127.0.0.1", "gpu_type": "A", "gpus": 2, "bandwidth_gbps": 10,
              "device": "cpu", "cpu_cores": 1, "base_port": 0}]
    (tmp_path / "cluster.json").write_text(json.dumps({"hosts": hosts}))
    r = run_cli("plan", "--spec", tmp_path / "spec.json", "--out", tmp_path / "plan.json", "--time-limit", "20")
    assert r.returncode == 0, r.stderr
    r = run_cli("generate", "--plan", tmp_path / "plan.json", "--onnx", f"{DET}={paths[DET]}",
                "--onnx", f"{CLS}={paths[CLS]}", "--cluster", tmp_path / "cluster.json", "--out", tmp_path / "deploy")
    assert r.returncode == 0, r.stderr
    planned = {m["name"]: m for m in load_plan(tmp_path / "plan.json").applications[0]["modules"]}
    (served,) = load_manifest(tmp_path / "deploy").applications
    assert {m.name: (m.slo_us, m.rate_rps) for m in served.modules} == {
        n: (pytest.approx(m["slo_us"]), pytest.approx(m["rate_rps"])) for n, m in planned.items()}
    assert served.module(CLS).rate_rps == 50 * FAN_OUT and served.module(CLS).rows == FAN_OUT
    assert served.module(DET).slo_us + served.module(CLS).slo_us == pytest.approx(60_000, abs=1)
