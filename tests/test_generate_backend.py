"""The partition backend inside a real tritonserver: outputs equal onnxruntime, timing outputs, bad requests."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from model_repository_gen import triton_config as tc
from poolpipe_common.tensors import TensorSpec
from runtime.tritonserver import TritonProcess

pytestmark = pytest.mark.triton


def tiny_model(path: Path, dynamic_hw: bool = False) -> Path:
    """Conv -> Relu -> Add(const [4,4,4]); the Add only broadcasts for 4x4 inputs."""
    rng = np.random.default_rng(0)
    h, w = ("h", "w") if dynamic_hw else (4, 4)
    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 3, h, w])
    y = helper.make_tensor_value_info("out/put:0", TensorProto.FLOAT, ["batch", 4, h, w])
    inits = [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "W"),
             numpy_helper.from_array(rng.standard_normal((4, 4, 4)).astype(np.float32), "C")]
    nodes = [helper.make_node("Conv", ["input", "W"], ["/b0/conv"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["/b0/conv"], ["/b0/Relu_output_0"]),
             helper.make_node("Add", ["/b0/Relu_output_0", "C"], ["out/put:0"])]
    model = helper.make_model(helper.make_graph(nodes, "tiny", [x], [y], inits),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def test_partition_backend_matches_onnxruntime_and_survives_bad_requests(tmp_path: Path) -> None:
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    onnx_path = tiny_model(tmp_path / "tiny.onnx", dynamic_hw=True)
    # dims -1: Triton lets any spatial size through, so a wrong one reaches (and fails in) the engine
    ins, outs = [TensorSpec("input", "FP32", (3, -1, -1))], [TensorSpec("out/put:0", "FP32", (4, -1, -1))]
    repo = tmp_path / "repo"
    cfg = tc.partition_config("tiny", ins, outs, max_batch_size=8,
                              settings=tc.BackendSettings(intra_op_threads=1))
    tc.write_model(repo, cfg, onnx_path)
    assert tc.parse_config(repo / "tiny" / "config.pbtxt") == cfg
    bad = tc.partition_config("bad", ins, outs, max_batch_size=8, settings=tc.BackendSettings(engine="tensorrt"))
    tc.write_model(repo, bad, onnx_path)

    x = np.random.default_rng(1).standard_normal((3, 3, 4, 4)).astype(np.float32)
    expected = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
    with TritonProcess(repo, log_path=tmp_path / "triton.log", name="tiny",
                       extra_args=("--model-control-mode=explicit", "--load-model=tiny")) as server:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        assert client.is_model_ready("tiny")
        # an engine name the engine module does not know: a clear load error, and the server keeps serving
        with pytest.raises(InferenceServerException, match="engine='tensorrt' is not one of auto, emulated, ort, "):
            client.load_model("bad")

        def infer(arr: np.ndarray):
            inp = grpcclient.InferInput("input", list(arr.shape), "FP32")
            inp.set_data_from_numpy(arr)
            return client.infer("tiny", [inp], outputs=[grpcclient.InferRequestedOutput(n) for n in
                                                       ("out/put:0", *tc.TIMING_OUTPUTS)])

        before = time.time_ns()
        res = infer(x)
        after = time.time_ns()
        np.testing.assert_allclose(res.as_numpy("out/put:0"), expected, atol=1e-5, rtol=0)
        start, end = res.as_numpy(tc.COMPUTE_START_OUTPUT), res.as_numpy(tc.COMPUTE_END_OUTPUT)
        assert start.shape == end.shape == (3, 1) and start.dtype == np.int64
        assert before <= start[0, 0] <= end[0, 0] <= after

        # A 5x5 input passes Triton's shape check (dims -1) but fails in the engine: an error response.
        with pytest.raises(InferenceServerException, match="inference failed"):
            infer(np.zeros((1, 3, 5, 5), np.float32))
        # ... and the model keeps serving.
        np.testing.assert_allclose(infer(x[:1]).as_numpy("out/put:0"), expected[:1], atol=1e-5, rtol=0)
        assert server.proc is not None and server.proc.poll() is None


def test_backend_timing_output_names_match_the_generator() -> None:
    import ast

    src = (Path(tc.MODEL_PY)).read_text()
    consts = {t.id: n.value.value for n in ast.parse(src).body if isinstance(n, ast.Assign)
              for t in n.targets if isinstance(t, ast.Name) and isinstance(n.value, ast.Constant)}
    assert consts["COMPUTE_START_OUTPUT"] == tc.COMPUTE_START_OUTPUT
    assert consts["COMPUTE_END_OUTPUT"] == tc.COMPUTE_END_OUTPUT


def test_one_engine_module_serves_the_profiler_and_the_backend(tmp_path: Path) -> None:
    """The profiler imports the engine module; generate copies the same file beside every model.py."""
    from profiling import devices, engines

    assert devices.ENGINES is engines.ENGINES == ("ort", "ort-trt", "trt", "torch")
    assert devices.default_engine is engines.default_engine and engines.default_engine("cpu") == "ort"
    assert engines.engine_problem("ort", "cpu") is None
    assert "cuda only" in engines.engine_problem("ort-trt", "cpu")
    onnx_path = tiny_model(tmp_path / "tiny.onnx")
    ins, outs = [TensorSpec("input", "FP32", (3, 4, 4))], [TensorSpec("out/put:0", "FP32", (4, 4, 4))]
    version = tc.write_model(tmp_path / "repo", tc.partition_config("tiny", ins, outs, 2), onnx_path) / "1"
    assert (version / "engines.py").read_bytes() == Path(engines.__file__).read_bytes()
    assert sorted(p.name for p in version.iterdir()) == ["emulated.py", "engine_trt.py", "engines.py", "model.onnx",
                                                         "model.py"]
    # the profiler's runner is the backend's engine: same outputs, by the same code
    runner = devices.make_runner(onnx.load(str(onnx_path)), "cpu", "ort", threads=1)
    x = np.random.default_rng(2).standard_normal((2, 3, 4, 4)).astype(np.float32)
    backend = engines.open_engine(str(version / "model.onnx"), "ort", "cpu", threads=1)
    np.testing.assert_array_equal(runner.run({"input": x})[0], backend.run({"input": x})[0])
    assert backend.outputs == ["out/put:0"] and "CPUExecutionProvider" in backend.description
