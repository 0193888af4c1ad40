"""`poolpipe demo` end to end, shortened: every step runs for real and the report comes from measurements."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_cli


@pytest.mark.triton
@pytest.mark.e2e
def test_short_demo_checks_answers_and_measures_every_system(tmp_path):
    out = tmp_path / "demo"
    r = run_cli("demo", "--out", out, "--input-size", "112", "--duration-s", "3", "--load-factors", "0.3",
                "--l4", "1", "--t4", "3", timeout=400)
    assert r.returncode == 0, r.stderr[-3000:]
    s = json.loads((out / "summary.json").read_text())
    # part 1: the real model through the sidecar equals ONNX Runtime
    assert s["answers"]["requests"] > 0 and s["answers"]["max_abs_diff"] <= 1e-3
    # part 2: every system measured (and predicted) at the load factor and at the ppipe plan's promise, from what the
    # clients saw
    promise_lf = s["paper"]["promise_lf"]
    assert promise_lf == pytest.approx(s["paper"]["promise_rps"] / s["paper"]["ppipe_rps"], abs=1e-3)
    assert {(x["system"], x["load_factor"]) for x in s["runs"]} == {
        (sys, lf) for sys in ("ppipe", "np", "triton-native", "sim-ppipe") for lf in (0.3, promise_lf)}
    assert f"the ppipe plan's promise, {s['paper']['promise_rps']:.1f} req/s" in r.stdout
    for run in s["runs"]:
        assert 0.0 <= run["attainment"] <= 1.0
        if not run["system"].startswith("sim"):
            assert run["offered"] > 0
        if run["system"] in ("ppipe", "np"):  # the sidecar's errors are explicit sheds, never a client timeout
            assert run["first_error"] is None or "shed to protect the SLO" in run["first_error"], run
    assert s["paper"]["ppipe_rps"] > 0 and s["paper"]["slo_ms"] > 0 and s["paper"]["time_scale"] == 8
    assert (out / "attainment.png").stat().st_size > 0 and (out / "timeline.png").stat().st_size > 0
    last = r.stdout.strip().splitlines()[-1]
    assert last.startswith("highest tested load with >= 99% SLO attainment: poolpipe "), last
    stages = [json.loads(line) for line in (out / "batches.jsonl").read_text().splitlines()]
    assert stages and all(st["end_s"] >= st["start_s"] for st in stages)
