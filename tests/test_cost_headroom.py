"""benchmarks/cost_headroom.py: a live_paper row's plan simulated with its calibrated costs and without them, beside
what the row held live; rows it cannot read are named and skipped, a folder with none is a usage error."""

from __future__ import annotations

import importlib.util
import json
from dataclasses import replace
from pathlib import Path

import pytest

from planner.entry import plan
from planner.request import PlanRequest
from poolpipe.paper_experiment import PaperRun, SystemResult, paper_spec
from poolpipe.paper_rows import SYSTEMS, save_row
from poolpipe_common.overheads import Overheads

_SPEC = importlib.util.spec_from_file_location(
    "cost_headroom", Path(__file__).resolve().parents[1] / "benchmarks" / "cost_headroom.py")
cost_headroom = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(cost_headroom)

RUN = PaperRun("googlenet-v3-pytorch", 2.5, 4, 12, duration_s=6.0, native_front=True)


def _row(work: Path, name: str, a_lf: float, c_lf: float, trace: str = "poisson") -> Path:
    """A finished row as live_paper leaves it: row.json, (a)'s manifest (its plan) and two calibration rounds."""
    row = work / name
    p = plan(paper_spec(RUN, slo_margin=0.3), PlanRequest("np", objective="throughput", time_limit_s=60)).plan
    (row / "ppipe").mkdir(parents=True)
    (row / "ppipe" / "manifest.json").write_text(json.dumps({"plan": p.to_dict()}))
    for n, lead in ((9, 9000.0), (10, 400.0)):  # round 10 is the last, though "10" sorts before "9"
        (row / f"calibration-steps-{n}").mkdir()
        costs = Overheads(lead_us=lead, tail_us=300.0, front_us=2000.0)
        (row / f"calibration-steps-{n}" / "costs.json").write_text(json.dumps(costs.to_dict()))
    lfs = {"ppipe": a_lf, "triton-native": c_lf}
    result = {k: SystemResult(k, lfs.get(k, 0.3), {0.3: 0.995}) for k in SYSTEMS}
    save_row(row, replace(RUN, trace=trace), {**result, "rate": 800.0, "promise": 400.0}, "abc", 1.0)
    return row


def test_the_last_calibration_round_gives_the_costs_and_no_costs_sustain_no_less(tmp_path):
    row = _row(tmp_path, "googlenet-2.5-poisson", 0.55, 0.5)
    assert cost_headroom.last_costs(row).parent.name == "calibration-steps-10"
    result, p, costs, arrivals = cost_headroom.read_row(row)
    assert costs.lead_us == 400.0 and arrivals == "poisson"
    r = cost_headroom.measure(result, p, costs, arrivals, fidelity=0.25)
    assert (r["a"], r["c"]) == (pytest.approx(440.0), pytest.approx(400.0))
    assert 0 < r["calibrated"] <= r["no stage-call costs"] <= r["no costs"]


def test_it_prints_the_rows_it_read_and_names_those_it_could_not(tmp_path, capsys):
    _row(tmp_path, "googlenet-2.5-poisson", 0.6, 0.5)
    (tmp_path / "half-a-row").mkdir()
    assert cost_headroom.main(["--work", str(tmp_path), "--fidelity", "0.25"]) == 0
    out = capsys.readouterr().out
    assert "half-a-row: skipped (no row.json, ppipe/manifest.json, calibration costs)" in out
    assert "googlenet-2.5-poisson" in out and "1.20x" in out  # 480 against 400 live
    assert "a/c >= 1.1: live 1 of 1 rows; simulated, calibrated: " in out


def test_a_folder_without_rows_is_a_usage_error(tmp_path):
    with pytest.raises(SystemExit) as e:
        cost_headroom.main(["--work", str(tmp_path)])
    assert e.value.code == 2


def test_a_row_is_simulated_with_the_arrivals_its_trace_was_planned_for(tmp_path):
    """As run_all plans it: bursty keeps its CV (the trace's default, 4, where it names none), replays carry over,
    a trace the planner has no model of is planned as Poisson (a bare "bursty" was refused by the planner before)."""
    cases = {"bursty:2": "bursty:2", "bursty": "bursty:4", "replay:azure-conv": "replay:azure-conv",
             "maf19:trace.csv": "poisson"}
    for trace, arrivals in cases.items():
        row = _row(tmp_path, f"googlenet-2.5-{trace.replace(':', '_').replace('.', '_')}", 0.55, 0.5, trace=trace)
        assert cost_headroom.read_row(row)[3] == arrivals
