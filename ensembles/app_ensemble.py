"""The Triton-only baseline of an application: its DAG as a Triton ensemble (``ensemble_scheduling``) over the whole
models, each behind Triton's dynamic batcher, as a Triton user would deploy it.

Fan-out: a Triton ensemble hands tensors from step to step as they are and cannot turn an upstream row's N items
into N rows of the downstream model's batch. So a module reached with R > 1 rows per app row runs as its whole
model wrapped in two Reshape nodes: its inputs arrive per app row ([R_upstream, N, *S] or [R, *S]) and are
flattened into R rows of the batch; its outputs are folded back to [R, *T] per app row. The dynamic batcher then
batches app requests (each R rows), not single items as the sidecar does.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ensembles.triton_baseline import write_whole_model
from model_repository_gen import triton_config as tc
from model_repository_gen.app_manifest import ApplicationInfo
from model_repository_gen.manifest import ModelInfo
from poolpipe_common.errors import InputError
from profiling.onnx_graph import load_onnx


def _rename(graph: onnx.GraphProto, old: str, new: str) -> None:
    for node in graph.node:
        node.input[:] = [new if x == old else x for x in node.input]
        node.output[:] = [new if x == old else x for x in node.output]


def _set_shape(vi: onnx.ValueInfoProto, dims: list[int | str]) -> None:
    shape = vi.type.tensor_type.shape
    del shape.dim[:]
    for d in dims:
        dim = shape.dim.add()
        if isinstance(d, str):
            dim.dim_param = d
        else:
            dim.dim_value = d


def rows_wrapper(model: onnx.ModelProto, inputs: Mapping[str, tuple[int, ...]], rows: int) -> onnx.ModelProto:
    """``model`` taking each input per outer row with shape ``inputs[name]`` (R rows' worth, flattened into its
    batch) and answering each output as [rows, *shape] per outer row."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    for vi in g.input:
        if vi.name not in inputs:
            continue
        inner = [d.dim_value for d in vi.type.tensor_type.shape.dim][1:]
        _rename(g, vi.name, vi.name + "__rows")
        g.initializer.append(numpy_helper.from_array(np.array([-1, *inner], np.int64), vi.name + "__flat"))
        g.node.insert(0, helper.make_node("Reshape", [vi.name, vi.name + "__flat"], [vi.name + "__rows"]))
        _set_shape(vi, ["batch", *inputs[vi.name]])
    for vi in g.output:
        inner = [d.dim_value for d in vi.type.tensor_type.shape.dim][1:]
        _rename(g, vi.name, vi.name + "__rows")
        g.initializer.append(numpy_helper.from_array(np.array([-1, rows, *inner], np.int64), vi.name + "__fold"))
        g.node.append(helper.make_node("Reshape", [vi.name + "__rows", vi.name + "__fold"], [vi.name]))
        _set_shape(vi, ["batch", rows, *inner])
    onnx.checker.check_model(m)
    return m


def write_app_ensemble(repository: Path, app: ApplicationInfo, models: Mapping[str, ModelInfo],
                       onnx_paths: Mapping[str, Path], batching: tc.DynamicBatching = tc.DynamicBatching(),
                       kind: str = "KIND_CPU", settings: tc.BackendSettings = tc.BackendSettings()) -> Path:
    """Per module ``<app>__<module>`` (its whole model, wrapped where it runs several rows per app row) with the
    dynamic batcher, and the ensemble ``<app>`` chaining them; returns the ensemble's model directory."""
    missing = [m.model for m in app.modules if m.model not in onnx_paths]
    if missing:
        raise InputError(f"application {app.name!r}: no ONNX file for model(s) {', '.join(missing)}")

    def tensor(module: str, name: str) -> str:
        sink = next((t.spec.name for t in app.outputs if (t.module, t.tensor) == (module, name)), None)
        return sink or f"{module}__{name}"

    steps = []
    with tempfile.TemporaryDirectory() as tmp:
        for mod in app.modules:
            step = f"{app.name}__{mod.name}"
            path = Path(onnx_paths[mod.model])
            in_map: dict[str, str] = {}
            if not app.incoming(mod.name):
                in_map = {t.tensor: t.spec.name for t in app.inputs}
            outer: dict[str, tuple[int, ...]] = {}
            for e in app.incoming(mod.name):
                up = app.module(e.src)
                for out, inp in e.tensors:
                    in_map[inp] = tensor(e.src, out)
                    spec = next(t for t in models[up.model].outputs if t.name == out)
                    outer[inp] = (up.rows, *spec.shape) if up.rows > 1 else spec.shape
            if mod.rows > 1:
                path = Path(tmp) / f"{step}.onnx"
                onnx.save(rows_wrapper(load_onnx(onnx_paths[mod.model]), outer, mod.rows), str(path))
            write_whole_model(repository, path, step, app.max_batch_size, batching, kind, settings=settings)
            used = {o for e in app.edges if e.src == mod.name for o, _ in e.tensors}
            used |= {t.tensor for t in app.outputs if t.module == mod.name}
            steps.append((step, in_map, {o: tensor(mod.name, o) for o in sorted(used)}))
    cfg = tc.ensemble_config(app.name, [t.spec for t in app.inputs], [t.spec for t in app.outputs],
                             app.max_batch_size, steps)
    return tc.write_model(Path(repository), cfg)
