"""ONNX graph helpers shared by cut-point search, profiling and cutting: loading, shapes, sub-graph extraction."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnx.utils
from onnx import helper

from poolpipe_common.errors import InputError


@dataclass(frozen=True)
class TensorSpec:
    """Name, numpy dtype and per-request shape (batch dimension removed; -1 where not static)."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]

    @property
    def static(self) -> bool:
        return all(d >= 0 for d in self.shape)

    @property
    def bytes_per_request(self) -> int:
        """Bytes of one request's slice of this tensor (needs a static shape)."""
        if not self.static:
            raise ValueError(f"tensor {self.name}: shape {list(self.shape)} is not static")
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


def load_onnx(path: str | Path) -> onnx.ModelProto:
    """Read and check an ONNX file; unreadable or corrupt files raise InputError naming the file."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"ONNX model {p} does not exist or is not a file")
    try:
        model = onnx.load(str(p))
        onnx.checker.check_model(model)
    except OSError as e:
        raise InputError(f"cannot read ONNX model {p}: {e.strerror or e}") from None
    except Exception as e:  # protobuf DecodeError, ValidationError: both mean "not a valid ONNX model"
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise InputError(f"{p} is not a valid ONNX model ({first[:200]})") from None
    if not model.graph.node:
        raise InputError(f"ONNX model {p} has an empty graph")
    return model


def with_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with inferred value_info for intermediate tensors (needed by the Extractor)."""
    try:
        return onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False, data_prop=True)
    except Exception:  # a model shape inference cannot handle is still usable without value_info
        return model


def initializer_names(graph: onnx.GraphProto) -> set[str]:
    return {t.name for t in graph.initializer} | {t.name for t in graph.sparse_initializer}


def graph_inputs(graph: onnx.GraphProto) -> list[str]:
    """Real inputs of a graph: declared inputs that are not initializers (old opsets list both)."""
    inits = initializer_names(graph)
    return [i.name for i in graph.input if i.name not in inits]


def tensor_spec(vi: onnx.ValueInfoProto) -> TensorSpec:
    """TensorSpec of a value_info whose first dimension is the batch."""
    tt = vi.type.tensor_type
    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type))
    dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim)
    return TensorSpec(vi.name, dtype, dims[1:])


def value_infos(model: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    """All value_infos of a (shape-inferred) model by name: graph inputs, outputs and intermediates."""
    g = model.graph
    return {vi.name: vi for vi in [*g.value_info, *g.input, *g.output]}


def check_self_contained(sub: onnx.ModelProto, what: str) -> None:
    """Every node input of ``sub`` is produced inside it, an initializer, or a graph input."""
    known = {i.name for i in sub.graph.input} | initializer_names(sub.graph) | {""}
    for node in sub.graph.node:
        for t in node.input:
            if t not in known:
                raise InputError(f"{what}: tensor {t!r} (input of node {node.name or node.op_type}) is "
                                 f"computed before the partition's inputs; the boundary tensors do not "
                                 f"cut the graph there")
        known.update(node.output)


def extract(extractor: onnx.utils.Extractor, inputs: list[str], outputs: list[str], what: str
            ) -> onnx.ModelProto:
    """Sub-model from ``inputs`` to ``outputs`` via onnx.utils.Extractor, checked to be self-contained."""
    missing = [t for t in [*inputs, *outputs] if t not in extractor.value_infos]
    if missing:
        raise InputError(f"{what}: tensor {missing[0]!r} is not in the model (or has no inferred type)")
    sub = extractor.extract_model(list(inputs), list(outputs))
    check_self_contained(sub, what)
    return sub
