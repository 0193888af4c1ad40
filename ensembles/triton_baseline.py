"""The Triton-only baseline: what a Triton user runs today, with the same partition backend as poolpipe.

(a) :func:`write_whole_model` — the whole model in one server behind Triton's dynamic batcher
(preferred batch sizes, max queue delay); (b) :func:`write_partition_ensemble` — the model cut at
block boundaries into partition models chained by a Triton ensemble (``ensemble_scheduling``),
optionally with the dynamic batcher on each partition. Both write into a model repository (one
repository may hold both); :func:`start_baseline` starts a tritonserver on it. Benchmarks compare
these against poolpipe's sidecar.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path

import onnx

from model_repository_gen import triton_config as tc
from model_repository_gen.cut import cut_partition, partition_io
from model_repository_gen.generate import partition_model_name
from poolpipe_common.errors import InputError
from profiling.onnx_graph import load_onnx
from profiling.profile import Profile
from runtime.tritonserver import TritonProcess


def write_whole_model(repository: Path, onnx_path: Path, name: str, max_batch_size: int,
                      batching: tc.DynamicBatching = tc.DynamicBatching(),
                      kind: str = "KIND_CPU", gpu: int | None = None,
                      settings: tc.BackendSettings = tc.BackendSettings()) -> Path:
    """The full ONNX model as one Triton model with the dynamic batcher; returns its model directory."""
    ins, outs = partition_io(load_onnx(onnx_path))
    cfg = tc.partition_config(name, ins, outs, max_batch_size, kind, gpu, settings, batching)
    return tc.write_model(Path(repository), cfg, Path(onnx_path))


def write_partition_ensemble(repository: Path, onnx_path: Path, profile: Profile, cuts: Sequence[int], name: str,
                             max_batch_size: int, batching: tc.DynamicBatching | None = None,
                             kind: str = "KIND_CPU", gpu: int | None = None,
                             settings: tc.BackendSettings = tc.BackendSettings(),
                             fp16_boundaries: bool = False) -> Path:
    """Partition models cut after blocks ``cuts`` (e.g. [1, 3]) + an ensemble ``name`` chaining them.

    Tensor names at the boundaries are the ONNX names (the cut keeps them), so each step maps its
    inputs and outputs to ensemble tensors of the same name. Returns the ensemble's model directory.
    """
    bounds = [0, *sorted(set(cuts)), profile.num_blocks]
    if any(not 0 < c < profile.num_blocks for c in cuts):
        raise InputError(f"cuts {list(cuts)}: each must lie in 1..{profile.num_blocks - 1} "
                         f"(profile {profile.model} has {profile.num_blocks} blocks)")
    full_in, full_out = partition_io(load_onnx(onnx_path))
    steps = []
    with tempfile.TemporaryDirectory() as tmp:
        for first, end in zip(bounds, bounds[1:]):
            sub = cut_partition(Path(onnx_path), profile, first, end, fp16_boundaries)
            pname = partition_model_name(profile.model, first, end)
            f = Path(tmp) / f"{pname}.onnx"  # one file each: write_model hard-links it into the repository
            onnx.save(sub, str(f))
            ins, outs = partition_io(sub)
            tc.write_model(Path(repository), tc.partition_config(pname, ins, outs, max_batch_size, kind, gpu,
                                                                 settings, batching), f)
            steps.append((pname, {t.name: t.name for t in ins}, {t.name: t.name for t in outs}))
    cfg = tc.ensemble_config(name, full_in, full_out, max_batch_size, steps)
    return tc.write_model(Path(repository), cfg)


def start_baseline(repository: Path, log_path: Path | None = None, env: dict[str, str] | None = None,
                   timeout_s: float = 120.0) -> TritonProcess:
    """A started tritonserver on loopback serving ``repository`` (stop it with ``.stop()`` or ``with``)."""
    return TritonProcess(Path(repository), env=env or {}, log_path=log_path, name="triton-baseline"
                         ).start(timeout_s)
