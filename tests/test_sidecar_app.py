"""An application DAG served through the sidecar as one KServe model, over real tritonservers generated from a plan:
a conv detector whose every image gives FAN_OUT feature rows, each classified by a second model. Its answers equal
running the two ONNX models one after the other (gRPC, HTTP, concurrent requests, fan-out rows), bad inputs get
explicit errors, a module's shed or failure names the module, and the Triton ensemble baseline answers the same."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from ensembles.app_ensemble import write_app_ensemble
from ensembles.triton_baseline import start_baseline
from model_repository_gen import triton_config as tc
from runtime.app_testbed import CLASSES, CLS, DET, FAN_OUT, FEATURES, IMAGE, build_app_deployment
from runtime.launch import Deployment
from runtime.sidecar_process import SidecarProcess
from tests.planned_testbed import serving

pytestmark = pytest.mark.triton
APP = "traffic"
SLO_US = 400_000.0


@pytest.fixture(scope="module")
def app_testbed(tmp_path_factory: pytest.TempPathFactory):
    work = tmp_path_factory.mktemp("app")
    deploy, paths, manifest = build_app_deployment(work, slo_us=SLO_US)
    sessions = {n: ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]) for n, p in paths.items()}
    with serving(deploy, work) as (dep, sc):
        yield {"sc": sc, "dep": dep, "ort": sessions, "paths": paths, "manifest": manifest, "work": work}


def _x(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, *IMAGE)).astype(np.float32)


def _ref(tb: dict, x: np.ndarray) -> np.ndarray:
    """The two ONNX models one after the other: every image's FAN_OUT crops classified in order."""
    crops = tb["ort"][DET].run(None, {"image": x})[0]
    return tb["ort"][CLS].run(None, {"feat": crops.reshape(-1, FEATURES)})[0].reshape(len(x), FAN_OUT, CLASSES)


def _grpc_input(x: np.ndarray, name: str = "image", datatype: str = "FP32") -> grpcclient.InferInput:
    i = grpcclient.InferInput(name, list(x.shape), datatype)
    i.set_data_from_numpy(x)
    return i


def test_app_answers_equal_the_two_models_in_turn(app_testbed: dict) -> None:
    sc = app_testbed["sc"]
    g, h = grpcclient.InferenceServerClient(sc.grpc_url), httpclient.InferenceServerClient(sc.http_url)
    assert g.is_server_ready() and h.is_model_ready(APP) and g.is_model_ready(APP)
    meta = h.get_model_metadata(APP)  # the source's inputs, the sink's outputs with the fan-out rows per image
    assert meta["platform"] == "poolpipe_application"
    assert meta["inputs"] == [{"name": "image", "datatype": "FP32", "shape": [-1, *IMAGE]}]
    assert meta["outputs"] == [{"name": "probs", "datatype": "FP32", "shape": [-1, FAN_OUT, CLASSES]}]
    cfg = g.get_model_config(APP).config
    assert cfg.max_batch_size == 4 and cfg.parameters["poolpipe_modules"].string_value == "det:det,cls:cls"
    before = {m: g.get_inference_statistics(m).model_stats[0].inference_count for m in (DET, CLS)}
    for n, seed in ((1, 1), (3, 2), (4, 3)):
        x = _x(n, seed)
        np.testing.assert_allclose(g.infer(APP, [_grpc_input(x)]).as_numpy("probs"), _ref(app_testbed, x),
                                   rtol=1e-5, atol=1e-6)
        hi = httpclient.InferInput("image", list(x.shape), "FP32")
        hi.set_data_from_numpy(x)
        np.testing.assert_allclose(h.infer(APP, [hi]).as_numpy("probs"), _ref(app_testbed, x), rtol=1e-5, atol=1e-6)
    hj = httpclient.InferInput("image", [2, *IMAGE], "FP32")
    hj.set_data_from_numpy(_x(2, 4), binary_data=False)  # JSON both ways
    res = h.infer(APP, [hj], outputs=[httpclient.InferRequestedOutput("probs", binary_data=False)])
    np.testing.assert_allclose(res.as_numpy("probs"), _ref(app_testbed, _x(2, 4)), rtol=1e-5, atol=1e-6)
    stats = g.get_inference_statistics(APP).model_stats[0]
    assert stats.inference_stats.success.count == 7 and stats.inference_count == 2 * (1 + 3 + 4) + 2
    after = {m: g.get_inference_statistics(m).model_stats[0].inference_count for m in (DET, CLS)}
    # every image went through the detector once, and its FAN_OUT crops through the classifier as rows
    assert after[DET] - before[DET] == 18 and after[CLS] - before[CLS] == 18 * FAN_OUT


def test_concurrent_app_requests_batch_with_direct_traffic(app_testbed: dict) -> None:
    """App requests and direct requests to the classifier at once: all answered right, classifier rows batched."""
    sc = app_testbed["sc"]

    async def run() -> tuple[list, list]:
        g = grpcaio.InferenceServerClient(sc.grpc_url)
        try:
            xs = [_x(1 + k % 3, 10 + k) for k in range(10)]
            feats = [np.random.default_rng(50 + k).standard_normal((2, FEATURES)).astype(np.float32)
                     for k in range(4)]
            app = [g.infer(APP, [_grpc_input(x)], client_timeout=30) for x in xs]
            direct = [g.infer(CLS, [_grpc_input(f, "feat")], client_timeout=30) for f in feats]
            got = await asyncio.gather(*app, *direct)
            return list(zip(xs, got[:len(xs)])), list(zip(feats, got[len(xs):]))
        finally:
            await g.close()

    app, direct = asyncio.run(run())
    for x, r in app:
        np.testing.assert_allclose(r.as_numpy("probs"), _ref(app_testbed, x), rtol=1e-5, atol=1e-6)
    for f, r in direct:
        np.testing.assert_allclose(r.as_numpy("probs"), app_testbed["ort"][CLS].run(None, {"feat": f})[0],
                                   rtol=1e-5, atol=1e-6)
    g = grpcclient.InferenceServerClient(sc.grpc_url)
    cls = g.get_inference_statistics(CLS).model_stats[0]
    assert cls.execution_count < cls.inference_count  # rows rode shared batches, not one batch each


@pytest.mark.parametrize("inputs, message", [
    ([("image", (1, 3, 8, 8), "FP32")], "unexpected shape for input 'image' for model 'traffic'"),
    ([("image", (1, *IMAGE), "FP64")], "data-type is 'FP64', but model 'traffic' expects 'FP32'"),
    ([("image", (1, *IMAGE), "FP32"), ("feat", (1, FEATURES), "FP32")], "unexpected inference input 'feat'"),
    ([("image", (5, *IMAGE), "FP32")], "batch-size must be <= 4 for 'traffic'"),
])
def test_bad_app_inputs_get_explicit_errors(app_testbed: dict, inputs: list, message: str) -> None:
    sc = app_testbed["sc"]
    arrays = [(n, np.zeros(s, np.float64 if dt == "FP64" else np.float32), dt) for n, s, dt in inputs]
    with pytest.raises(InferenceServerException, match=message):
        grpcclient.InferenceServerClient(sc.grpc_url).infer(APP, [_grpc_input(a, n, dt) for n, a, dt in arrays])
    hin = []
    for n, a, dt in arrays:
        i = httpclient.InferInput(n, list(a.shape), dt)
        i.set_data_from_numpy(a)
        hin.append(i)
    with pytest.raises(InferenceServerException, match=message) as e:
        httpclient.InferenceServerClient(sc.http_url).infer(APP, hin)
    assert e.value.status() == "400"


def test_a_shed_module_is_named(app_testbed: dict) -> None:
    """A deadline the detector cannot meet (the timeout parameter, µs): one explicit error naming the module."""
    sc = app_testbed["sc"]
    with pytest.raises(InferenceServerException, match="application 'traffic': module 'det' .*shed"):
        grpcclient.InferenceServerClient(sc.grpc_url).infer(APP, [_grpc_input(_x(1, 0))], timeout=2000)
    hi = httpclient.InferInput("image", [1, *IMAGE], "FP32")
    hi.set_data_from_numpy(_x(1, 0))
    with pytest.raises(InferenceServerException, match="module 'det'") as e:
        httpclient.InferenceServerClient(sc.http_url).infer(APP, [hi], timeout=2000)
    assert e.value.status() == "503"


def test_ensemble_baseline_gives_the_same_answers(app_testbed: dict, tmp_path: Path) -> None:
    manifest = app_testbed["manifest"]
    repo = tmp_path / "repo"
    write_app_ensemble(repo, manifest.applications[0], {m.name: m for m in manifest.models}, app_testbed["paths"],
                       tc.DynamicBatching((4,), 2000), settings=tc.BackendSettings(intra_op_threads=1))
    cfg = tc.parse_config(repo / APP / "config.pbtxt")
    assert cfg.platform == "ensemble"
    assert [s.model_name for s in cfg.ensemble_scheduling.step] == [f"{APP}__det", f"{APP}__cls"]
    assert tc.parse_config(repo / f"{APP}__cls" / "config.pbtxt").dynamic_batching.max_queue_delay_microseconds == 2000
    with start_baseline(repo, log_path=tmp_path / "triton.log") as server:
        async def run() -> list:
            g = grpcaio.InferenceServerClient(server.grpc_url)
            try:
                return await asyncio.gather(*[g.infer(APP, [_grpc_input(_x(1 + k % 4, 30 + k))], client_timeout=30)
                                              for k in range(6)])
            finally:
                await g.close()

        for k, r in enumerate(asyncio.run(run())):
            np.testing.assert_allclose(r.as_numpy("probs"), _ref(app_testbed, _x(1 + k % 4, 30 + k)),
                                       rtol=1e-5, atol=1e-6)


def test_a_failed_module_server_is_named(app_testbed: dict) -> None:
    """The classifier's only server killed: the app request gets one explicit error naming module 'cls', no hang.
    (Last in this file: the deployment is left without the classifier.)"""
    sc, dep = app_testbed["sc"], app_testbed["dep"]
    cls_vgpu = app_testbed["manifest"].model(CLS).pipelines[0].stages[0].vgpus[0]
    os.killpg(dep.servers[cls_vgpu].proc.pid, signal.SIGKILL)
    with pytest.raises(InferenceServerException, match="application 'traffic': module 'cls' \\(model 'cls'\\)"):
        grpcclient.InferenceServerClient(sc.grpc_url).infer(APP, [_grpc_input(_x(2, 0))], client_timeout=30)


def _executed_batch_sizes(http_url: str, model: str) -> dict[int, int]:
    c = httpclient.InferenceServerClient(http_url)
    try:
        stats = c.get_inference_statistics(model)["model_stats"][0]
    finally:
        c.close()
    return {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in stats.get("batch_stats", [])}


def test_dummy_requests_pad_the_planned_modules_batches(tmp_path: Path) -> None:
    """Where the plan assumes dummy requests (cls), a lone app request's two crops run as a batch of the planned
    4 (two zero rows added, their outputs dropped); det, without, runs its one image alone. Answers unchanged."""
    from runtime.app_testbed import application

    deploy, paths, manifest = build_app_deployment(tmp_path, slo_us=SLO_US,
                                                   app=application(SLO_US, 50.0, dummy=(CLS,)))
    sessions = {n: ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]) for n, p in paths.items()}
    with Deployment(deploy, check_hardware=False, log_dir=tmp_path / "logs"), \
            SidecarProcess(manifest=deploy, log_path=tmp_path / "sidecar.log") as sc:
        stage = {m.name: m.pipelines[0].stages[0] for m in manifest.models}
        url = {v.id: v.http_url for v in manifest.vgpus}

        def sizes() -> dict[str, dict[int, int]]:
            return {n: _executed_batch_sizes(url[stage[n].vgpus[0]], stage[n].triton_model) for n in (DET, CLS)}
        before = sizes()  # calibration's batches
        g = grpcclient.InferenceServerClient(sc.grpc_url)
        for seed in range(3):
            x = _x(1, seed)
            got = g.infer(APP, [_grpc_input(x)]).as_numpy("probs")
            np.testing.assert_allclose(got, _ref({"ort": sessions}, x), rtol=1e-5, atol=1e-5)
        g.close()

        def executed_since() -> dict[str, dict[int, int]]:
            after = sizes()
            return {n: {b: c - before[n].get(b, 0) for b, c in after[n].items() if c != before[n].get(b, 0)}
                    for n in (DET, CLS)}
        # Triton may record a batch's statistics after its response is on its way: wait for the third to land.
        ran, stop = executed_since(), time.monotonic() + 5.0
        while min(sum(r.values()) for r in ran.values()) < 3 and time.monotonic() < stop:
            time.sleep(0.05)
            ran = executed_since()
    assert ran[CLS] == {4: 3}, ran  # each request's 2 crops + 2 dummy rows
    assert ran[DET] == {1: 3}, ran
