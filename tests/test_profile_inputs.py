"""``profile measure --inputs FILE.npz``: the latency distribution spans the given inputs (a model whose work
grows with its input's content), and a bad input file is a one-line error."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from profiling.profile import load_profile
from tests.conftest import run_cli

MEASURE = ("--blocks", "1", "--threads", "1", "--batch-sizes", "1", "--repeats", "12", "--warmup", "1",
           "--latency-quantiles", "3")


def early_exit_model(path: Path) -> Path:
    """x [batch, 1] -> x + s, where s comes from max(x) rounds of a 96x96 matmul: work grows with the content."""
    w = helper.make_tensor("wv", TensorProto.FLOAT, [96, 96], (np.eye(96) * 0.5).astype(np.float32).ravel())
    body = helper.make_graph(
        [helper.make_node("Constant", [], ["w"], value=w), helper.make_node("MatMul", ["y_in", "w"], ["mm"]),
         helper.make_node("Tanh", ["mm"], ["y_out"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("y_in", TensorProto.FLOAT, [96, 96])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("y_out", TensorProto.FLOAT, [96, 96])])
    nodes = [
        helper.make_node("ReduceMax", ["x"], ["xmax"], keepdims=0),
        helper.make_node("Cast", ["xmax"], ["trips"], to=TensorProto.INT64),
        helper.make_node("Constant", [], ["cond"], value=helper.make_tensor("c", TensorProto.BOOL, [], [True])),
        helper.make_node("Constant", [], ["y0"], value=helper.make_tensor("y", TensorProto.FLOAT, [96, 96],
                                                                          np.ones(96 * 96, np.float32))),
        helper.make_node("Loop", ["trips", "cond", "y0"], ["y_last"], body=body),
        helper.make_node("ReduceSum", ["y_last"], ["s"], keepdims=0),
        helper.make_node("Add", ["x", "s"], ["out"]),
    ]
    graph = helper.make_graph(nodes, "early_exit", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", 1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


def test_inputs_span_the_latency_distribution(tmp_path: Path) -> None:
    model = early_exit_model(tmp_path / "early_exit.onnx")
    light, mixed = tmp_path / "light.npz", tmp_path / "mixed.npz"
    np.savez(light, x=np.full((4, 1), 2.0, np.float32))
    np.savez(mixed, x=np.array([[2.0], [400.0], [2.0], [400.0]], np.float32))  # half the inputs 200x the work
    out = {}
    for name, inputs in (("light", light), ("mixed", mixed)):
        out[name] = tmp_path / f"{name}.json"
        r = run_cli("profile", "measure", model, *MEASURE, "--inputs", inputs, "--out", out[name])
        assert r.returncode == 0, r.stderr
    lo = load_profile(out["light"]).latency_quantiles_us("cpu", 1, 1, 0, 1)
    hi = load_profile(out["mixed"]).latency_quantiles_us("cpu", 1, 1, 0, 1)
    assert lo is not None and hi is not None
    # the light inputs' typical run is far below the heavy half's slowest: the spread comes from the inputs (their
    # median, not their slowest run: one stall of a loaded host made a light run as slow as a heavy one)
    assert hi[1][-1] > 5 * float(np.interp(0.5, lo[0], lo[1])) and hi[1][0] < hi[1][-1] / 5
    prov = load_profile(out["mixed"]).provenance
    assert prov["input_samples"] == 4 and "--inputs" in prov["method"]


@pytest.mark.parametrize("arrays, message", [
    ({"y": np.zeros((2, 1), np.float32)}, "missing x"),
    ({"x": np.zeros((2, 1), np.float64)}, "is float64, the model takes float32"),
    ({"x": np.zeros((2, 3), np.float32)}, "expected [samples, 1]"),
    ({"x": np.zeros((0, 1), np.float32)}, "no samples"),
])
def test_bad_input_sets_are_one_line_errors(tmp_path: Path, arrays: dict, message: str) -> None:
    model = early_exit_model(tmp_path / "early_exit.onnx")
    np.savez(tmp_path / "bad.npz", **arrays)
    r = run_cli("profile", "measure", model, *MEASURE, "--inputs", tmp_path / "bad.npz", "--out", tmp_path / "p.json")
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_an_input_file_that_is_not_npz_is_a_one_line_error(tmp_path: Path) -> None:
    model = early_exit_model(tmp_path / "early_exit.onnx")
    (tmp_path / "x.npz").write_text("not numpy")
    r = run_cli("profile", "measure", model, *MEASURE, "--inputs", tmp_path / "x.npz", "--out", tmp_path / "p.json")
    assert r.returncode == 2 and "not a NumPy .npz file" in r.stderr and "Traceback" not in r.stderr, r.stderr
