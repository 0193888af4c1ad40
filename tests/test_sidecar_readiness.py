"""A sidecar started before its Triton servers (as a user who starts both together): not ready until every
planned model has a calibrated path, then ready within seconds of the servers, and serving correct answers."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from runtime.launch import Deployment
from runtime.sidecar_process import SidecarProcess
from runtime.testbed import build_deployment

pytestmark = pytest.mark.triton


def test_not_ready_until_calibrated_then_ready_soon_after_the_servers(tmp_path: Path) -> None:
    deploy, onnx_path, _ = build_deployment(tmp_path, name="resnet", slo_us=500_000.0)
    sc = SidecarProcess(manifest=deploy, log_path=tmp_path / "sidecar.log").start()
    try:
        c = grpcclient.InferenceServerClient(sc.grpc_url)
        assert c.is_server_live() and not c.is_server_ready() and not c.is_model_ready("resnet")
        assert "calibration_skipped" in (tmp_path / "sidecar.log").read_text()
        with Deployment(deploy, check_hardware=False, log_dir=tmp_path / "logs"):
            t0 = time.monotonic()
            while not c.is_model_ready("resnet"):
                assert time.monotonic() - t0 < 15, "the sidecar did not turn ready after its servers did"
                time.sleep(0.1)
            took = time.monotonic() - t0
            assert c.is_server_ready()
            log = (tmp_path / "sidecar.log").read_text()
            assert "event=clock_lead calibrated=1/1" in log and took < 8.0, took
            x = np.random.default_rng(3).standard_normal((2, 3, 112, 112)).astype(np.float32)
            inp = grpcclient.InferInput("input", list(x.shape), "FP32")
            inp.set_data_from_numpy(x)
            got = c.infer("resnet", [inp]).as_numpy("logits")
            ref = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
            np.testing.assert_allclose(got, ref, atol=1e-4)
    finally:
        assert sc.stop() == 0


@pytest.mark.parametrize("slo_us,front_us,warned", [(3_000.0, None, True), (500_000.0, None, False),
                                                   (500_000.0, 499_000.0, True)])
def test_a_pipeline_with_no_slack_under_its_slo_is_named_at_start_up(tmp_path: Path, slo_us: float,
                                                                    front_us: float | None, warned: bool) -> None:
    """A plan whose calibrated pipeline (compute + per-stage lead and tail) exceeds its SLO less the driver's
    margin and the way outside the sidecar's clock (serve --front-us) would shed every request: the sidecar says
    so once at start-up, with the fix; with --front-us its deadlines come that much sooner, so a request is shed
    explicitly, and its overheads file carries the value for the simulator and the planner."""
    deploy, _, _ = build_deployment(tmp_path, name="resnet", slo_us=slo_us)
    log_path = tmp_path / "sidecar.log"
    extra = () if front_us is None else ("--front-us", f"{front_us:g}", "--overheads-out", str(tmp_path / "ov.json"))
    with Deployment(deploy, check_hardware=False, log_dir=tmp_path / "logs"):
        sc = SidecarProcess(manifest=deploy, log_path=log_path, extra_args=extra).start()
        try:
            t0 = time.monotonic()
            while "event=clock_lead calibrated=1/1" not in log_path.read_text():
                assert time.monotonic() - t0 < 30, "the sidecar did not calibrate its pipeline"
                time.sleep(0.1)
            if front_us is not None:
                c = grpcclient.InferenceServerClient(sc.grpc_url)
                while not c.is_model_ready("resnet"):
                    assert time.monotonic() - t0 < 30, "the sidecar did not turn ready"
                    time.sleep(0.1)
                inp = grpcclient.InferInput("input", [1, 3, 112, 112], "FP32")
                inp.set_data_from_numpy(np.zeros((1, 3, 112, 112), np.float32))
                with pytest.raises(InferenceServerException, match="shed to protect the SLO"):
                    c.infer("resnet", [inp])
        finally:
            assert sc.stop() == 0
    lines = [x for x in log_path.read_text().splitlines() if "event=no_slack" in x]
    assert len(lines) == (1 if warned else 0), lines
    if warned:
        assert "pipeline resnet/0" in lines[0] and "poolpipe plan --overheads FILE" in lines[0]
    if front_us is not None:
        assert "serve --front-us" in lines[0]
        assert json.loads((tmp_path / "ov.json").read_text())["front_us"] == front_us

