"""Model zoo, cut points, pre-partitioning and cutting: partitions chained together reproduce the full model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from model_repository_gen.cut import (
    FP32_ATOL,
    cut_partition,
    fp16_tolerance,
    partition_io,
)
from poolpipe_common.errors import InputError
from profiling.cutpoints import find_cut_points
from profiling.prepartition import group_segments, prepartition
from profiling.profile import Block, DeviceTiming, Profile
from profiling.zoo import ZOO_MODELS, build_zoo_model


@pytest.fixture(scope="module")
def zoo(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("zoo")
    return {name: build_zoo_model(name, d / f"{name}.onnx") for name in ZOO_MODELS}


def _session(model: onnx.ModelProto | Path) -> ort.InferenceSession:
    src = str(model) if isinstance(model, Path) else model.SerializeToString()
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    return ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])


def _input(path: Path, batch: int = 2) -> np.ndarray:
    shape = _session(path).get_inputs()[0].shape
    return np.random.RandomState(7).randn(batch, *shape[1:]).astype(np.float32)


def _profile(name: str, input_tensors, boundaries: list[tuple[str, ...]]) -> Profile:
    """A profile whose blocks end at ``boundaries`` (timings are irrelevant for cutting)."""
    blocks = tuple(Block(f"block{i}", 0, b) for i, b in enumerate(boundaries))
    return Profile(name, blocks, {"cpu": {1: DeviceTiming((1,), np.zeros((len(blocks), 1)))}},
                   None, tuple(input_tensors))


def _chain(path: Path, prof: Profile, x: np.ndarray, fp16: bool = False) -> np.ndarray:
    feeds = {"input": x}
    for i in range(prof.num_blocks):
        s = _session(cut_partition(path, prof, i, i + 1, fp16))
        outs = s.run(None, {i.name: feeds[i.name] for i in s.get_inputs()})
        feeds = dict(zip([o.name for o in s.get_outputs()], outs))
    (y,) = feeds.values()
    return y


def test_zoo_models_are_valid_and_deterministic(zoo, tmp_path):
    for name, path in zoo.items():
        m = onnx.load(str(path))
        onnx.checker.check_model(m, full_check=True)
        inp, out = m.graph.input[0], m.graph.output[0]
        assert inp.name == "input" and inp.type.tensor_type.shape.dim[0].dim_param == "batch"
        assert out.name == ("mask" if name == "segnet" else "logits")
        assert out.type.tensor_type.shape.dim[0].dim_param == "batch"
        x = _input(path, 3)
        y = _session(path).run(None, {"input": x})[0]
        assert y.shape[0] == 3 and np.all(np.isfinite(y)) and np.std(y) > 1e-3
        again = build_zoo_model(name, tmp_path / f"{name}.onnx", seed=0)
        assert again.read_bytes() == path.read_bytes()
    ops = {n: {node.op_type for node in onnx.load(str(p)).graph.node} for n, p in zoo.items()}
    assert "Add" in ops["resnet"]
    assert any(node.attribute and any(a.name == "group" and a.i > 1 for a in node.attribute)
               for node in onnx.load(str(zoo["mobilenet"])).graph.node)
    assert {"ConvTranspose", "Resize", "Concat"} <= ops["segnet"]


def test_every_cut_point_splits_into_chaining_partitions(zoo):
    """Each single-tensor cut point gives two partitions that reproduce the model (fp32, <= 1e-5)."""
    for name, path in zoo.items():
        model = onnx.load(str(path))
        cuts = find_cut_points(model)
        assert len(cuts.cuts) >= 3, name
        x = _input(path)
        ref = _session(path).run(None, {"input": x})[0]
        for c in cuts.cuts:
            assert len(c.tensors) == 1
            prof = _profile(name, cuts.inputs, [c.tensors, cuts.outputs])
            assert np.max(np.abs(_chain(path, prof, x) - ref)) <= FP32_ATOL, (name, c)


def test_residual_skip_edges_block_cuts_inside_blocks(zoo):
    model = onnx.load(str(zoo["resnet"]))
    single = {c.tensors for c in find_cut_points(model).cuts}
    inside = "/stage1/block0/conv1/relu_output_0"  # spanned by the identity skip edge of block0
    assert all(inside not in t for t in single)
    assert ("/stem/conv/relu_output_0",) in single and ("/stage1/block0/relu_output_0",) in single
    double = {c.tensors for c in find_cut_points(model, max_tensors=2).cuts}
    assert ("/stem/conv/relu_output_0", inside) in double
    # the U-Net keeps encoder features alive until the decoder: no single-tensor cut in between
    seg = find_cut_points(onnx.load(str(zoo["segnet"])))
    assert not any("enc2" in t or "mid" in t for c in seg.cuts for t in c.tensors)


def test_group_segments_balances_and_keeps_blocks_non_empty():
    assert group_segments([1, 1, 1, 1, 1, 1], 3) == [(0, 2), (2, 4), (4, 6)]
    assert group_segments([10, 1, 1, 1, 1, 10], 2) == [(0, 3), (3, 6)]
    assert group_segments([100, 1, 1], 3) == [(0, 1), (1, 2), (2, 3)]
    assert group_segments([0, 0, 0], 2) == [(0, 2), (2, 3)]  # no timings: still N non-empty blocks
    with pytest.raises(InputError, match="3 segments"):
        group_segments([1, 1, 1], 4)


@pytest.mark.parametrize("n_blocks", [2, 4])
def test_prepartition_blocks_chain_in_fp32_and_fp16(zoo, n_blocks):
    for name, path in zoo.items():
        pp = prepartition(path, n_blocks, threads=1, repeats=3, warmup=1)
        assert len(pp.blocks) == n_blocks
        assert all(b.segments[1] > b.segments[0] for b in pp.blocks)
        assert pp.blocks[-1].output_tensors == (("mask",) if name == "segnet" else ("logits",))
        assert all(t > 0 for t in pp.segment_times_us)
        prof = _profile(name, pp.input_tensors, [b.output_tensors for b in pp.blocks])
        x = _input(path)
        ref = _session(path).run(None, {"input": x})[0]
        assert np.max(np.abs(_chain(path, prof, x) - ref)) <= FP32_ATOL
        err16 = np.max(np.abs(_chain(path, prof, x, fp16=True) - ref))
        assert err16 <= fp16_tolerance(ref), (name, err16)


def test_fp16_partition_io_types_and_whole_range(zoo):
    path = zoo["resnet"]
    pp = prepartition(path, 3, threads=1, repeats=2, warmup=1)
    prof = _profile("resnet", pp.input_tensors, [b.output_tensors for b in pp.blocks])
    ins, outs = partition_io(cut_partition(path, prof, 0, 1, fp16_boundaries=True))
    assert [(t.name, t.datatype, t.shape) for t in ins] == [("input", "FP32", (3, 112, 112))]
    assert [t.datatype for t in outs] == ["FP16"] and outs[0].name == pp.blocks[0].output_tensors[0]
    ins, outs = partition_io(cut_partition(path, prof, 1, 3, fp16_boundaries=True))
    assert ins[0].datatype == "FP16" and ins[0].name == pp.blocks[0].output_tensors[0]
    assert [(t.name, t.datatype, t.shape) for t in outs] == [("logits", "FP32", (10,))]
    ins, outs = partition_io(cut_partition(path, prof, 1, 2))
    assert ins[0].datatype == "FP32" and all(d > 0 for d in ins[0].shape)
    whole = cut_partition(path, prof, 0, 3, fp16_boundaries=True)
    x = _input(path)
    y = _session(whole).run(None, {"input": x})[0]
    assert np.max(np.abs(y - _session(path).run(None, {"input": x})[0])) <= FP32_ATOL


def test_cut_errors_name_the_problem(zoo, tmp_path):
    path = zoo["resnet"]
    prof = _profile("resnet", ("input",), [("/stage1/block0/relu_output_0",), ("logits",)])
    with pytest.raises(InputError, match=r"block range \[1, 3\)"):
        cut_partition(path, prof, 1, 3)
    bad = _profile("resnet", ("input",), [("no_such_tensor",), ("logits",)])
    with pytest.raises(InputError, match="no_such_tensor"):
        cut_partition(path, bad, 0, 1)
    inside = _profile("resnet", ("input",), [("/stage1/block0/conv1/relu_output_0",), ("logits",)])
    with pytest.raises(InputError, match="do not cut the graph"):
        cut_partition(path, inside, 1, 2)
    corrupt = tmp_path / "corrupt.onnx"
    corrupt.write_bytes(b"not an onnx file at all")
    with pytest.raises(InputError, match="not a valid ONNX model"):
        cut_partition(corrupt, prof, 0, 1)
    with pytest.raises(InputError, match="cannot read ONNX model"):
        cut_partition(tmp_path / "missing.onnx", prof, 0, 1)
