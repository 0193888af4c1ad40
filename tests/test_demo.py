"""`poolpipe demo` end to end, shortened: every step runs for real and the report comes from measurements."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_cli


@pytest.mark.triton
@pytest.mark.e2e
def test_short_demo_measures_both_systems_and_stops_everything(tmp_path):
    out = tmp_path / "demo"
    r = run_cli("demo", "--out", out, "--input-size", "112", "--duration-s", "3", "--load-factors", "0.3,0.6",
                timeout=400)
    assert r.returncode == 0, r.stderr[-3000:]
    s = json.loads((out / "summary.json").read_text())
    assert {(x["system"], x["load_factor"]) for x in s["runs"]} == {
        (sys, lf) for sys in ("poolpipe", "triton") for lf in (0.3, 0.6)}
    for run in s["runs"]:
        assert run["sent"] > 0 and run["unanswered"] == 0  # every request answered or explicitly failed
        assert 0.0 <= run["slo_attainment"] <= 1.0
    assert s["planned_rps"] > 0 and s["slo_ms"] > 0
    assert set(s["vgpu_utilization"]) == {"0.3", "0.6"}
    busy = s["vgpu_utilization"]["0.6"]
    # measured compute time per vGPU (a vGPU of a pipeline the policy rarely picks may idle in 3 s)
    assert len(busy) == 3 and all(0 <= u < 1.5 for u in busy.values()) and max(busy.values()) > 0
    assert (out / "attainment.png").stat().st_size > 0 and (out / "timeline.png").stat().st_size > 0
    assert "highest tested load with >= 99% SLO attainment" in r.stdout
    stages = [json.loads(line) for line in (out / "batches.jsonl").read_text().splitlines()]
    assert stages and {st["vgpu"] for st in stages} <= set(busy)
