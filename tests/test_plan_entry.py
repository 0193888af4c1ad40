"""``planner.plan(spec, request)``, the one planning entry point: what ``poolpipe plan`` writes for its flags equals
what the library plans for the same request (applications with their SLO split, the cost objective, PARIS sizing,
another planner), plan.json records the request and a plan.json without one still loads (defaults), and requests
are checked when made with one-line errors that name the flag."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from planner import PlanRequest, plan, reweighted
from planner.request import request_of
from planner.solvers.milp_solvers import SolverOptions
from plans.plan_json import load_plan, plan_from_dict
from plans.spec.planning_spec import load_spec
from poolpipe_common.errors import InputError
from poolpipe_common.overheads import Overheads
from profiling.reference import REFERENCE_DIR, import_ppipe_profile
from tests.conftest import run_cli
from tests.test_harpagon import SPEC_APP
from tests.test_paris_sizing import TOY
from tests.test_planner import tiny_profile


def _apps_case(work: Path) -> tuple[dict, list[str], PlanRequest]:
    for m in ("googlenet-v3-pytorch", "repvgg-b3"):
        import_ppipe_profile(REFERENCE_DIR, m).save(work / f"{m}.json")
    spec = {"cluster": {"gpus": {"L4": 2, "T4": 2}, "bandwidth_gbps": 10},
            "models": [{"profile": f"{m}.json", "slo_us": 200_000} for m in ("googlenet-v3-pytorch", "repvgg-b3")],
            "applications": [SPEC_APP]}
    # the CLI plans in turn (--jobs 1), the library side by side (default: a worker per core): the same plan, down to
    # every candidate weighed (one of its MILPs has several plans within the gap, and HiGHS's pick depended on the
    # exact time limit it was given, which the clock's remainder made vary with the host's load)
    flags = ["--app-split", "optimal", "--price", "L4=0.8,T4=0.35", "--time-limit", "20", "--jobs", "1"]
    return spec, flags, PlanRequest(app_split="optimal", prices={"L4": 0.8, "T4": 0.35}, time_limit_s=20)


def _tiny_spec(work: Path) -> dict:
    (work / "tiny.json").write_text(json.dumps(tiny_profile()))
    return {"cluster": {"gpus": {"A": 1, "B": 2}, "bandwidth_gbps": 1000}, "max_partitions": 2,
            "models": [{"profile": "tiny.json", "slo_us": 1e6}]}


def _cost_case(work: Path) -> tuple[dict, list[str], PlanRequest]:
    flags = ["--objective", "cost", "--rate", "tiny=300", "--price", "A=3,B=1"]
    return _tiny_spec(work), flags, PlanRequest(objective="cost", rates_rps={"tiny": 300.0},
                                                prices={"A": 3.0, "B": 1.0})


def _np_case(work: Path) -> tuple[dict, list[str], PlanRequest]:
    return _tiny_spec(work), ["--planner", "np", "--time-limit", "0", "--gap", "0.01"], PlanRequest(
        "np", time_limit_s=None, gap=0.01)


def _paris_case(work: Path) -> tuple[dict, list[str], PlanRequest]:
    cluster = {"gpus": {"L4": 2}, "bandwidth_gbps": 100, "vgpu_sizes": {"L4": {"mps_percent": [[50, 50], [100]]}}}
    spec = {"cluster": cluster, "models": [{"profile": TOY.to_dict(), "slo_us": 20000}]}
    return spec, ["--paris", "--batch-pdf", "1=0.7,2=0.3"], PlanRequest(paris_batch_pdf={1: 0.7, 2: 0.3})


def _comparable(d: dict[str, Any]) -> dict[str, Any]:
    """plan.json as JSON has it, without the wall time of the solve: same inputs, same plan, down to the candidates
    the sustained objective weighed (one single-threaded HiGHS search, bounded by work where a pass is cut short)."""
    d = json.loads(json.dumps(d))
    d.pop("solve_seconds")
    return d


@pytest.mark.parametrize("case", [_apps_case, _cost_case, _np_case, _paris_case])
def test_plan_equals_what_the_cli_wrote(tmp_path: Path, case) -> None:
    spec_doc, flags, request = case(tmp_path)
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec_doc))
    r = run_cli("plan", "--spec", tmp_path / "spec.yaml", *flags, "--out", tmp_path / "plan.json")
    assert r.returncode == 0, r.stderr
    outcome = plan(load_spec(tmp_path / "spec.yaml"), request)
    written = json.loads((tmp_path / "plan.json").read_text())
    assert _comparable(written) == _comparable(outcome.plan.to_dict())
    assert written["request"] == request.to_dict() and request_of(load_plan(tmp_path / "plan.json")) == request
    assert all(line in r.stdout for line in outcome.lines)
    # PARIS, the applications and the objectives that measure what the plan holds each say how in a line
    assert bool(outcome.lines) == bool(spec_doc.get("applications") or request.paris_batch_pdf
                                       or request.objective in ("sustained", "cost"))


def test_the_plan_is_the_same_for_any_number_of_measuring_processes(tmp_path: Path) -> None:
    spec = _tiny_spec(tmp_path)
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    one, two = (plan(load_spec(tmp_path / "spec.yaml"), PlanRequest(jobs=jobs)).plan for jobs in (1, 2))
    assert _comparable(one.to_dict()) == _comparable(two.to_dict())
    assert one.sustained["evaluated_by"] == "simulated" and one.models[0].sustainable_rps > 0


def test_every_step_of_a_solve_is_given_the_requests_limit_not_the_clocks_remainder() -> None:
    options = SolverOptions(time_limit_s=20.0)
    assert options.remaining(0.1234).time_limit_s == options.remaining(7.5).time_limit_s == 20.0
    assert options.remaining(20.0).time_limit_s == 1e-3  # spent: no further step starts
    assert SolverOptions().remaining(99.0).time_limit_s is None


def test_a_promise_on_default_costs_says_so(tmp_path: Path) -> None:
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(_tiny_spec(tmp_path)))
    spec = load_spec(tmp_path / "spec.yaml")
    default = plan(spec, PlanRequest(jobs=1))
    assert default.plan.sustained["costs"] == "default"
    assert any(line.startswith("costs uncalibrated:") and "poolpipe calibrate" in line for line in default.lines)
    measured = plan(spec, PlanRequest(jobs=1, overheads=Overheads(lead_us=300.0, tail_us=200.0)))
    assert measured.plan.sustained["costs"] == "measured"
    assert not any(line.startswith("costs uncalibrated:") for line in measured.lines)


def test_the_throughput_objective_measures_only_when_asked(tmp_path: Path) -> None:
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(_tiny_spec(tmp_path)))
    spec = load_spec(tmp_path / "spec.yaml")
    nominal = plan(spec, PlanRequest(objective="throughput")).plan
    assert nominal.sustained is None and nominal.models[0].sustainable_rps is None
    verified = plan(spec, PlanRequest(objective="throughput", verify=True)).plan
    assert verified.sustained["evaluated_by"] == "simulated" and verified.models[0].sustainable_rps > 0
    assert verified.models[0].pipelines == nominal.models[0].pipelines
    with pytest.raises(InputError, match="--verify"):
        PlanRequest(objective="throughput", verify=True, evaluator="none")


def test_a_plan_without_a_request_loads_with_the_defaults(tmp_path: Path) -> None:
    spec_doc, _, _ = _np_case(tmp_path)
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec_doc))
    d = plan(load_spec(tmp_path / "spec.yaml"), PlanRequest("np", solver="cbc", time_limit_s=None)).plan.to_dict()
    del d["request"]
    old = plan_from_dict(d)
    assert old.request is None and "request" not in old.to_dict()
    assert request_of(old) == PlanRequest("np", solver="cbc")  # the plan's planner and solver, else defaults
    assert request_of(old, time_limit_s=5.0).time_limit_s == 5.0


@pytest.mark.parametrize("fields, message", [
    ({"objective": "cost"}, "--objective cost needs --rate"),
    ({"rates_rps": {"a": 1.0}}, "--rate and --price go with --objective cost"),
    ({"planner": "dart-r", "paris_batch_pdf": {1: 1.0}}, "--paris needs --batch-pdf"),
    ({"paris_batch_pdf": {0: 1.0}}, "--batch-pdf: batch sizes must be whole numbers >= 1"),
    ({"gap": 2}, "--gap must be"),
    ({"time_limit_s": -1}, "time limit must be a positive number"),
    ({"planner": "fast"}, "unknown planner 'fast'"),
    ({"objective": "speed"}, "unknown objective 'speed'; choose one of sustained, throughput, cost"),
    ({"app_split": "fastest"}, "unknown --app-split 'fastest'"),
])
def test_requests_are_checked_when_made(fields: dict, message: str) -> None:
    with pytest.raises(InputError, match=message) as e:
        PlanRequest(**fields)
    assert "\n" not in str(e.value)


def test_request_round_trip_and_prices_need_cost_or_applications(tmp_path: Path) -> None:
    r = PlanRequest("np", "cost", {"tiny": 5.0}, {"A": 1.0, "B": 0.5}, True, "uniform", None, "bursty:2",
                    Overheads(lead_us=900.0, tail_us=700.0), "analytic", "cbc", None, 0.01)
    assert PlanRequest.from_dict(json.loads(json.dumps(r.to_dict()))) == r
    pdf = PlanRequest(paris_batch_pdf={1: 0.5, 4: 0.5})
    assert PlanRequest.from_dict(json.loads(json.dumps(pdf.to_dict()))) == pdf
    with pytest.raises(InputError, match="unknown field 'objectve'"):
        PlanRequest.from_dict({"objectve": "cost"})
    spec_doc, _, _ = _np_case(tmp_path)
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec_doc))
    with pytest.raises(InputError, match="--price also with a spec's applications"):
        plan(load_spec(tmp_path / "spec.yaml"), PlanRequest(prices={"A": 1.0}))


def test_reweighted_sets_each_weight_to_its_rate_with_a_floor(tmp_path: Path) -> None:
    spec_doc, _, _ = _apps_case(tmp_path)
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec_doc))
    spec = reweighted(load_spec(tmp_path / "spec.yaml"), {"googlenet-v3-pytorch": 200.0, "repvgg-b3": 0.0})
    assert [m.weight for m in spec.models] == [200.0, 2.0] and spec.applications
