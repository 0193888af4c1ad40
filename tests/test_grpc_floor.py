"""loadtest/grpc_floor.py: the bare Python gRPC proxy whose cost benchmarks/sidecar.py prints as the floor under the
sidecar's pass-through forwards Triton's answers unchanged and is gone once its block ends; loadtest/side_by_side.py
measures systems in turns."""

from __future__ import annotations

import asyncio

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from ensembles.triton_baseline import start_baseline, write_whole_model
from loadtest.grpc_floor import bare_answerer, bare_proxy
from loadtest.side_by_side import one_at_a_time_in_turns, poisson_in_turns
from model_repository_gen.triton_config import BackendSettings, DynamicBatching
from runtime.testbed import write_trivial_onnx

pytestmark = pytest.mark.triton


def _infer(url: str, x: np.ndarray) -> np.ndarray:
    client = grpcclient.InferenceServerClient(url)
    try:
        i = grpcclient.InferInput("x", list(x.shape), "FP32")
        i.set_data_from_numpy(x)
        return client.infer("trivial", [i], client_timeout=10).as_numpy("y")
    finally:
        client.close()


def test_the_bare_proxy_forwards_triton_answers_and_stops(tmp_path):
    repo = tmp_path / "repo"
    write_whole_model(repo, write_trivial_onnx(tmp_path / "trivial.onnx"), "trivial", 8, DynamicBatching((), 0),
                      settings=BackendSettings(engine="ort", intra_op_threads=1))
    x = np.linspace(-1.0, 1.0, 32, dtype=np.float32).reshape(2, 16)
    with start_baseline(repo, log_path=tmp_path / "triton.log") as triton:
        with bare_proxy(triton.grpc_url) as url:
            np.testing.assert_array_equal(_infer(url, x), np.maximum(x, 0.0))
        with pytest.raises(InferenceServerException):  # its process is gone: nothing listens on its port
            _infer(url, x)


def test_the_bare_answerer_answers_at_once_and_stops():
    x = np.ones((1, 16), np.float32)
    with bare_answerer() as (url, pid):
        np.testing.assert_array_equal(_infer(url, x), np.zeros((1, 16), np.float32))
        assert psutil.pid_exists(pid)
    with pytest.raises(InferenceServerException):
        _infer(url, x)
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_systems_measured_in_turns_each_get_their_share(tmp_path):
    """Side by side: every target gets its share of the time (one at a time) or of the turns (Poisson), and a
    target's results are its own (the proxy's hop makes its requests slower than Triton's)."""
    repo = tmp_path / "repo"
    write_whole_model(repo, write_trivial_onnx(tmp_path / "trivial.onnx"), "trivial", 8, DynamicBatching((), 0),
                      settings=BackendSettings(engine="ort", intra_op_threads=1))
    i = grpcclient.InferInput("x", [1, 16], "FP32")
    i.set_data_from_numpy(np.ones((1, 16), np.float32))
    with start_baseline(repo, log_path=tmp_path / "triton.log") as triton, bare_proxy(triton.grpc_url) as url:
        targets = [("direct", triton.grpc_url), ("proxy", url)]
        lat = asyncio.run(one_at_a_time_in_turns(targets, "trivial", [i], 0.3, block=10))
        assert set(lat) == {"direct", "proxy"}
        assert all(sum(x) >= 0.3 and len(x) % 10 == 0 for x in lat.values())
        assert np.median(lat["proxy"]) > np.median(lat["direct"])
        low = poisson_in_turns(targets, "trivial", [i], 50, 0.6, slo_s=1.0, turns=2)
        assert set(low) == {"direct", "proxy"}
        for r in low.values():
            assert r.sent >= 10 and r.errors == 0 and r.attainment == 1.0 and len(r.latencies_s) == r.sent
