"""GPU memory facts of a profile's blocks, and what a partition needs and how hard it presses on memory.

Per block: ``weight_bytes`` (its ONNX initializers) and ``activation_bytes`` (per request: the largest
set of tensors one of its nodes reads and writes at once, i.e. the peak live activations). A partition of
blocks [first, end) at batch b on one vGPU (one Triton process) needs

    context + sum(weights) + b * max(activations)

bytes of device memory (InSS's m_i(b_i), section 3.2); ``context`` is the per-process CUDA/framework
overhead. Its memory *pressure*, the bandwidth proxy of the interference model (profiling.interference), is
the bytes it touches per second, sum(weights) + b * sum(activations), over the device's memory bandwidth.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from poolpipe_common.documents import check_fields
from poolpipe_common.errors import InputError

MEMORY_FIELDS = ("weight_bytes", "activation_bytes", "source")
GIB = 1 << 30

# Device memory capacity (GB) and bandwidth (GB/s) by GPU type, from the vendors' data sheets. V100 comes
# in 16 and 32 GB: the default is 16, give cluster.gpu_memory_gb {V100: 32} for the larger card. "cpu" is
# this machine's host memory bandwidth order of magnitude (the co-run profiler's pressure unit).
DEVICE_MEMORY_GB = {"L4": 24.0, "T4": 16.0, "P4": 8.0, "V100": 16.0, "V100-32": 32.0, "A100": 40.0, "H100": 80.0}
DEVICE_BANDWIDTH_GBS = {"L4": 300.0, "T4": 320.0, "P4": 192.0, "V100": 900.0, "V100-32": 900.0, "A100": 1555.0,
                        "H100": 3350.0, "cpu": 20.0}
DEFAULT_BANDWIDTH_GBS = 300.0
CONTEXT_BYTES = 512 << 20  # CUDA context + ONNX Runtime/TensorRT workspace of one Triton process (about 0.5 GiB)


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
