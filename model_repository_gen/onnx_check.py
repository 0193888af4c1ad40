"""Whether an ONNX file given to ``generate`` is the model the plan's profile was measured on: the boundary
tensors the plan cuts at exist, and the input and those boundaries have the profiled sizes (an ONNX exported
at another input size would otherwise deploy quietly with tensors of other sizes than planned)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from plans.plan_json import ModelPlan
from poolpipe_common.errors import InputError
from profiling.onnx_graph import with_shapes


def bytes_per_request(model: onnx.ModelProto) -> dict[str, int]:
    """Tensor name -> bytes of one request's slice, for every tensor with a static shape after the batch dim."""
    g = with_shapes(model).graph
    out: dict[str, int] = {}
    for vi in [*g.input, *g.value_info, *g.output]:
        t = vi.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else -1 for d in t.shape.dim][1:]
        if not t.HasField("shape") or not t.elem_type or any(d < 0 for d in dims):
            continue
        try:
            itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(t.elem_type)).itemsize
        except (KeyError, TypeError):
            continue
        out[vi.name] = int(np.prod(dims, dtype=np.int64)) * itemsize
    return out


def _check_size(what: str, names: tuple[str, ...], sizes: dict[str, int], profiled: int | None, model: str,
                onnx_path: Path) -> None:
    if profiled is None or not all(n in sizes for n in names):
        return
    got = sum(sizes[n] for n in names)
    if got != profiled:
        tensors = ", ".join(repr(n) for n in names)
        raise InputError(f"--onnx {model}={onnx_path}: {what} {tensors} is {got} bytes per request, but the "
                         f"profile of {model} was measured with {profiled}; pass the ONNX file that was profiled "
                         "(the same input size), or profile this one")


def check_onnx_matches_profile(m: ModelPlan, onnx_path: Path, model: onnx.ModelProto) -> None:
    """InputError when ``model`` is not the model ``m``'s profile describes (tensor names or sizes differ)."""
    prof = m.profile
    graph = model.graph
    known = {vi.name for vi in graph.input} | {t for n in graph.node for t in n.output}
    cuts = sorted({p.blocks[0] for pl in m.pipelines for p in pl.partitions if p.blocks[0] > 0})
    for cut in cuts:
        names = prof.blocks[cut - 1].output_tensors
        if not names:
            raise InputError(f"plan model {m.name}: its profile has no tensor names at the boundary after block "
                             f"{cut - 1}; measure the profile with 'poolpipe profile measure' on {onnx_path}")
        missing = [t for t in names if t not in known]
        if missing:
            raise InputError(f"plan model {m.name}: the plan cuts after block {cut - 1} of {prof.num_blocks} at "
                             f"tensor(s) {missing}, which {onnx_path} does not have; the plan's profile was "
                             f"measured on another model (or more blocks than {onnx_path} has)")
    sizes = bytes_per_request(model)
    initializers = {t.name for t in graph.initializer}
    inputs = prof.input_tensors or tuple(vi.name for vi in graph.input if vi.name not in initializers)
    _check_size("input", tuple(inputs), sizes, prof.input_bytes, m.name, onnx_path)
    for cut in cuts:
        b = prof.blocks[cut - 1]
        _check_size(f"the boundary after block {cut - 1}", b.output_tensors or (), sizes, b.output_bytes, m.name,
                    onnx_path)
