"""Triton-facing tensor specs (name, datatype, shape without the batch dimension) of an ONNX graph's I/O."""

from __future__ import annotations

import onnx

from model_repository_gen.manifest import TensorSpec
from planner.errors import InputError

_DATATYPES = {
    onnx.TensorProto.FLOAT: "FP32", onnx.TensorProto.FLOAT16: "FP16", onnx.TensorProto.DOUBLE: "FP64",
    onnx.TensorProto.INT64: "INT64", onnx.TensorProto.INT32: "INT32", onnx.TensorProto.INT8: "INT8",
    onnx.TensorProto.UINT8: "UINT8", onnx.TensorProto.BOOL: "BOOL",
}


def _spec(vi: onnx.ValueInfoProto, where: str, allow_dynamic: bool) -> TensorSpec:
    tt = vi.type.tensor_type
    if tt.elem_type not in _DATATYPES:
        raise InputError(f"{where}: tensor {vi.name!r} has ONNX type "
                         f"{onnx.TensorProto.DataType.Name(tt.elem_type)}, which poolpipe cannot serve")
    dims = list(tt.shape.dim)
    if not dims:
        raise InputError(f"{where}: tensor {vi.name!r} has no batch dimension (rank 0)")
    shape = []
    for d in dims[1:]:
        if d.HasField("dim_value") and d.dim_value > 0:
            shape.append(int(d.dim_value))
        elif allow_dynamic:
            shape.append(-1)
        else:
            raise InputError(f"{where}: tensor {vi.name!r} has a dynamic non-batch dimension "
                             f"({d.dim_param or '?'}); export the model with a fixed input size")
    return TensorSpec(vi.name, _DATATYPES[tt.elem_type], tuple(shape))


def graph_io(model: onnx.ModelProto, where: str = "ONNX model", allow_dynamic: bool = False
             ) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    """(inputs, outputs) of the graph; initializers listed as inputs are skipped.

    Shapes come from the graph, completed by ONNX shape inference when a dimension is missing.
    """
    g = model.graph
    if any(not vi.type.tensor_type.HasField("shape") for vi in [*g.input, *g.output]):
        g = onnx.shape_inference.infer_shapes(model).graph
    inits = {t.name for t in g.initializer}
    ins = tuple(_spec(vi, where, allow_dynamic) for vi in g.input if vi.name not in inits)
    outs = tuple(_spec(vi, where, allow_dynamic) for vi in g.output)
    return ins, outs
