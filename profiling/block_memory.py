"""GPU memory facts of a profile's blocks, and what a partition needs and how hard it presses on memory.

Per block: ``weight_bytes`` (its ONNX initializers) and ``activation_bytes`` (per request: the largest
set of tensors one of its nodes reads and writes at once, i.e. the peak live activations). A partition of
blocks [first, end) at batch b on one vGPU (one Triton process) needs

    context + sum(weights) + b * max(activations)

bytes of device memory (InSS's m_i(b_i), section 3.2); ``context`` is what the vGPU's processes hold
besides: tritonserver's CUDA context and memory pool, and per Python-backend model instance (a stub
process of its own) one more CUDA context with cuDNN/cuBLAS and the engine's workspace
(``vgpu_overhead_bytes``). Its memory *pressure*, the bandwidth proxy of the interference model
(profiling.interference), is the bytes it touches per second, sum(weights) + b * sum(activations), over
the device's memory bandwidth.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from poolpipe_common.documents import check_fields
from poolpipe_common.errors import InputError
from profiling.gpu_types import GPU_TYPES

MEMORY_FIELDS = ("weight_bytes", "activation_bytes", "source")
GIB = 1 << 30

# Device memory capacity (GB) and bandwidth (GB/s) by GPU type, from the one table (profiling.gpu_types). V100
# comes in 16 and 32 GB: a 32 GB card is type V100-32 (or give cluster.gpu_memory_gb {V100: 32}). "cpu" is this
# machine's host memory bandwidth order of magnitude (the co-run profiler's pressure unit).
DEVICE_MEMORY_GB = {t.label: t.memory_gb for t in GPU_TYPES}
DEVICE_BANDWIDTH_GBS = {**{t.label: t.bandwidth_gbs for t in GPU_TYPES}, "cpu": 20.0}
DEFAULT_BANDWIDTH_GBS = 300.0
MIB = 1 << 20
# What one vGPU's processes hold on the device besides weights and activations. tritonserver: its CUDA context
# and its CUDA memory pool (--cuda-memory-pool-byte-size, 64 MiB by default). Each Python-backend model instance
# runs in a stub process of its own: one more CUDA context with cuDNN/cuBLAS loaded, and the engine's workspace
# (TensorRT's is capped at ENGINE_WORKSPACE_BYTES by profiling.engine_trt). `make gpu-check` compares them with
# what nvidia-smi shows per process.
SERVER_CONTEXT_BYTES = 256 * MIB + 64 * MIB
INSTANCE_CONTEXT_BYTES = 384 * MIB
ENGINE_WORKSPACE_BYTES = 256 * MIB


def vgpu_overhead_bytes(instances: int = 1) -> int:
    """Device memory of one tritonserver with ``instances`` Python-backend model instances, before weights and
    activations."""
    return SERVER_CONTEXT_BYTES + instances * (INSTANCE_CONTEXT_BYTES + ENGINE_WORKSPACE_BYTES)


CONTEXT_BYTES = vgpu_overhead_bytes(1)  # a vGPU serving one partition (one instance), the plan's unit


@dataclass(frozen=True)
class BlockMemory:
    weight_bytes: tuple[int, ...]
    activation_bytes: tuple[int, ...]  # per request
    source: str = ""

    def partition_bytes(self, first: int, end: int, batch: int, context: int = CONTEXT_BYTES) -> int:
        """Device memory of one vGPU process running blocks [first, end) at ``batch``."""
        return int(context + sum(self.weight_bytes[first:end]) + batch * max(self.activation_bytes[first:end]))

    def traffic_bytes(self, first: int, end: int, batch: int) -> int:
        """Bytes one batch of blocks [first, end) reads and writes (weights once, activations per request)."""
        return int(sum(self.weight_bytes[first:end]) + batch * sum(self.activation_bytes[first:end]))

    def to_dict(self) -> dict:
        return {"weight_bytes": list(self.weight_bytes), "activation_bytes": list(self.activation_bytes),
                "source": self.source}


def pressure(traffic_bytes: float, latency_us: float, device: str) -> float:
    """Fraction of the device's memory bandwidth a run of ``latency_us`` touching ``traffic_bytes`` uses."""
    bw = DEVICE_BANDWIDTH_GBS.get(device, DEFAULT_BANDWIDTH_GBS) * 1e9
    return float(traffic_bytes / (max(latency_us, 1e-3) * 1e-6) / bw)


def memory_from_dict(d: object, num_blocks: int, where: str) -> BlockMemory:
    check_fields(d, MEMORY_FIELDS, where)
    assert isinstance(d, dict)
    out = []
    for k in ("weight_bytes", "activation_bytes"):
        xs = d.get(k)
        if (not isinstance(xs, list) or len(xs) != num_blocks
                or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in xs)):
            raise InputError(f"{where}.{k}: expected {num_blocks} whole numbers of bytes >= 0 (one per block)")
        out.append(tuple(xs))
    src = d.get("source", "")
    if not isinstance(src, str):
        raise InputError(f"{where}.source: expected a string")
    return BlockMemory(out[0], out[1], src)


def _elem_bytes(vi: onnx.ValueInfoProto) -> int | None:
    """Bytes of one request's slice (the first dimension taken as the batch); None where not static."""
    t = vi.type.tensor_type
    if not t.HasField("shape") or t.elem_type == 0:
        return None
    dims = [d.dim_value if d.HasField("dim_value") else -1 for d in t.shape.dim]
    rest = dims[1:] if dims else []
    if any(x < 0 for x in rest):
        return None
    itemsize = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.elem_type)).itemsize
    return int(np.prod(rest, dtype=np.int64)) * itemsize


def block_memory_of(block: onnx.ModelProto) -> tuple[int, int]:
    """(weight bytes, peak per-request activation bytes) of one shape-inferred block sub-model."""
    g = block.graph
    inits = {t.name for t in g.initializer}
    weights = sum(int(np.prod(t.dims, dtype=np.int64)) * np.dtype(onnx.helper.tensor_dtype_to_np_dtype(
        t.data_type)).itemsize for t in g.initializer)
    infos = {vi.name: vi for vi in [*g.input, *g.output, *g.value_info]}
    sizes = {n: _elem_bytes(vi) for n, vi in infos.items()}
    peak = 0
    for node in g.node:
        live = [sizes.get(x) or 0 for x in [*node.input, *node.output] if x and x not in inits]
        peak = max(peak, sum(live))
    return int(weights), int(peak)


def memory_of_blocks(blocks: list[onnx.ModelProto], source: str) -> BlockMemory:
    facts = [block_memory_of(b) for b in blocks]
    return BlockMemory(tuple(w for w, _ in facts), tuple(a for _, a in facts), source)
