"""Cut an ONNX model into partition models at a profile's block boundaries (onnx.utils.Extractor).

Partition ``[first, end)`` holds blocks ``first .. end-1``. Its inputs are ``profile.input_tensors``
(the model's inputs) when ``first == 0``, else ``profile.blocks[first-1].output_tensors``; its
outputs are ``profile.blocks[end-1].output_tensors`` (the model's outputs for the last block).

Tensor names are stable: every partition input and output keeps the ONNX tensor name of the
boundary it carries, so the output of one partition has the same name as the input of the next
and the generator can name Triton inputs/outputs after them. With ``fp16_boundaries`` an internal
boundary (between two partitions) travels as FP16 under the same name: the producing partition
ends with ``Cast(to=FLOAT16)`` and the consuming one starts with ``Cast(to=FLOAT)``; inside a
partition the FP32 value is renamed ``<name>__fp32``. The model's own input and outputs keep their
dtypes. Chained FP16 partitions match the full model within ``FP16_RTOL`` (see ``fp16_tolerance``).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import numpy as np
import onnx
import onnx.utils
from onnx import TensorProto, helper

from poolpipe_common.errors import InputError
from poolpipe_common.tensors import TensorSpec
from profiling.onnx_graph import (
    extract,
    graph_inputs,
    load_onnx,
    tensor_spec,
    with_shapes,
)
from profiling.profile import Profile

FP32_ATOL = 1e-5   # chained fp32 partitions vs the full model: max abs difference
FP16_RTOL = 1e-2   # chained fp16-boundary partitions: max abs difference <= FP16_RTOL * max(1, max |y|)
FP32_SUFFIX = "__fp32"

_NP_TO_TRITON = {np.dtype(np.float32): "FP32", np.dtype(np.float16): "FP16", np.dtype(np.float64): "FP64",
                 np.dtype(np.int64): "INT64", np.dtype(np.int32): "INT32", np.dtype(np.int8): "INT8",
                 np.dtype(np.uint8): "UINT8", np.dtype(np.bool_): "BOOL"}


def fp16_tolerance(reference: np.ndarray) -> float:
    """Max abs difference allowed between fp16-boundary chained partitions and the full fp32 model."""
    return FP16_RTOL * max(1.0, float(np.max(np.abs(reference))))


@functools.lru_cache(maxsize=8)
def _extractor(path: str, mtime_ns: int, size: int) -> tuple[onnx.utils.Extractor, tuple[str, ...], tuple[str, ...]]:
    """Shape-inferred model wrapped in an Extractor; cached per file version (generators cut many times)."""
    model = with_shapes(load_onnx(path))
    return (onnx.utils.Extractor(model), tuple(graph_inputs(model.graph)),
            tuple(o.name for o in model.graph.output))


def _model_extractor(model_path: Path) -> tuple[onnx.utils.Extractor, tuple[str, ...], tuple[str, ...]]:
    try:
        st = os.stat(model_path)
    except OSError as e:
        raise InputError(f"cannot read ONNX model {model_path}: {e.strerror or e}") from None
    return _extractor(str(model_path), st.st_mtime_ns, st.st_size)


def partition_boundaries(profile: Profile, first: int, end: int,
                         model_inputs: tuple[str, ...] | None = None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Names of the tensors entering and leaving partition ``[first, end)`` of ``profile``."""
    if not 0 <= first < end <= profile.num_blocks:
        raise InputError(f"profile {profile.model}: block range [{first}, {end}) is not within "
                         f"0..{profile.num_blocks}")
    if first == 0:
        inputs = profile.input_tensors or model_inputs
    else:
        inputs = profile.blocks[first - 1].output_tensors
    outputs = profile.blocks[end - 1].output_tensors
    if not inputs or not outputs:
        raise InputError(f"profile {profile.model} has no tensor names at the boundaries of blocks "
                         f"[{first}, {end}); measure it with 'poolpipe profile measure' to cut the ONNX model")
    return tuple(inputs), tuple(outputs)


def _rename_uses(graph: onnx.GraphProto, old: str, new: str) -> None:
    for node in graph.node:
        for i, t in enumerate(node.input):
            if t == old:
                node.input[i] = new


def _add_fp16_boundaries(sub: onnx.ModelProto, cast_inputs: tuple[str, ...], cast_outputs: tuple[str, ...]
                         ) -> None:
    """Make the named graph inputs/outputs FP16 under the same names, with Casts to/from FP32 inside."""
    g = sub.graph
    casts_in = []
    for vi in g.input:
        if vi.name in cast_inputs and vi.type.tensor_type.elem_type == TensorProto.FLOAT:
            inner = vi.name + FP32_SUFFIX
            _rename_uses(g, vi.name, inner)
            for info in g.value_info:
                if info.name == vi.name:
                    info.name = inner
            vi.type.tensor_type.elem_type = TensorProto.FLOAT16
            casts_in.append(helper.make_node("Cast", [vi.name], [inner], name=f"{vi.name}/cast_from_fp16",
                                             to=TensorProto.FLOAT))
    casts_out = []
    for vi in g.output:
        if vi.name in cast_outputs and vi.type.tensor_type.elem_type == TensorProto.FLOAT:
            inner = vi.name + FP32_SUFFIX
            for node in g.node:
                for i, t in enumerate(node.output):
                    if t == vi.name:
                        node.output[i] = inner
            _rename_uses(g, vi.name, inner)
            for info in g.value_info:
                if info.name == vi.name:
                    info.name = inner
            vi.type.tensor_type.elem_type = TensorProto.FLOAT16
            casts_out.append(helper.make_node("Cast", [inner], [vi.name], name=f"{vi.name}/cast_to_fp16",
                                              to=TensorProto.FLOAT16))
    nodes = [*casts_in, *g.node, *casts_out]
    del g.node[:]
    g.node.extend(nodes)


def cut_partition(model_path: Path, profile: Profile, first: int, end: int,
                  fp16_boundaries: bool = False) -> onnx.ModelProto:
    """The partition model for blocks ``[first, end)``; see the module docstring for names and dtypes."""
    extractor, model_inputs, model_outputs = _model_extractor(Path(model_path))
    inputs, outputs = partition_boundaries(profile, first, end, model_inputs)
    if end == profile.num_blocks and set(outputs) != set(model_outputs):
        raise InputError(f"profile {profile.model}: the last block's output_tensors {list(outputs)} are not the "
                         f"outputs of {model_path} ({list(model_outputs)})")
    what = f"{model_path} blocks [{first}, {end})"
    sub = extract(extractor, list(inputs), list(outputs), what)
    sub.graph.name = f"{profile.model}_blocks_{first}_{end}"
    if fp16_boundaries:
        _add_fp16_boundaries(sub, inputs if first > 0 else (), outputs if end < profile.num_blocks else ())
    onnx.checker.check_model(sub)
    return sub


def triton_datatype(dtype: np.dtype) -> str:
    """KServe v2 / Triton datatype string of a numpy dtype."""
    try:
        return _NP_TO_TRITON[np.dtype(dtype)]
    except KeyError:
        raise InputError(f"tensor dtype {dtype} is not supported at partition boundaries") from None


def partition_io(partition: onnx.ModelProto) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """Inputs and outputs of a partition (or any model): names, Triton datatypes, shapes without batch."""
    def specs(vis) -> list[TensorSpec]:
        out = []
        for vi in vis:
            s = tensor_spec(vi)
            out.append(TensorSpec(s.name, triton_datatype(s.dtype), s.shape))
        return out
    inits = {t.name for t in partition.graph.initializer}
    return specs(vi for vi in partition.graph.input if vi.name not in inits), specs(partition.graph.output)
