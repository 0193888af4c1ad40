"""The device memory of each vGPU of a deployment, checked at generate time against its GPU and its MPS share.

A vGPU is one tritonserver: its CUDA context and memory pool, then per partition model one Python-backend
instance (a stub process with its own CUDA context, cuDNN/cuBLAS and the engine's workspace), the partition's
weights and its activations at the planned batch (profiling.block_memory). A GPU's vGPUs together must fit its
memory; a vGPU of a GPU split into V must fit 1/V of it, the pinned-memory limit the NVIDIA device plugin gives
each MPS replica (an unequal MPS share or a MIG instance: its share of the memory). Only GPU hosts are checked,
and only partitions whose profile records block memory (``profile measure`` does; imported reference data does
not, and ``unchecked`` names those).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence

from model_repository_gen.vgpu_env import Slot
from plans.plan_json import Plan
from poolpipe_common.errors import InputError
from profiling.block_memory import vgpu_overhead_bytes

GB = 1e9
StageKey = tuple[str, int, int]


def vgpu_bytes(plan: Plan, served: Sequence[StageKey]) -> tuple[int, list[str]] | None:
    """(device bytes of a vGPU serving these partitions, what they are), or None where a profile has no memory."""
    parts, total = [], vgpu_overhead_bytes(len(served))
    for name, j, k in served:
        m = plan.model(name)
        p = m.pipelines[j].partitions[k]
        if m.profile.memory is None:
            return None
        need = m.profile.memory.partition_bytes(*p.blocks, p.batch, context=0)
        total += need
        parts.append(f"{name} blocks [{p.blocks[0]}, {p.blocks[1]}) at batch {p.batch}: {need / GB:.2f} GB")
    return total, parts


def _limit(slot: Slot, capacity: float) -> tuple[float, str]:
    if slot.size is not None:
        return capacity * slot.size.share, f"a {slot.size.label} share"
    return capacity / slot.v, ("a whole" if slot.v == 1 else f"a 1/{slot.v} share (the MPS limit) of a")


def check_gpu_memory(plan: Plan, assignment: Mapping[StageKey, Sequence[Slot]]) -> list[str]:
    """InputError, in one line, for a vGPU over its share or a GPU over its memory; returns the partitions whose
    memory is unknown (not checked)."""
    served: dict[str, list[StageKey]] = defaultdict(list)
    slots: dict[str, Slot] = {}
    for key, pool in assignment.items():
        for s in pool:
            if s.host.on_gpu:
                served[s.id].append(key)
                slots[s.id] = s
    unchecked: set[str] = set()
    per_gpu: dict[tuple[str, int], float] = defaultdict(float)
    for vid, keys in sorted(served.items()):
        s = slots[vid]
        capacity = plan.cluster.memory_bytes(s.host.gpu_type)
        got = vgpu_bytes(plan, keys)
        if got is None or capacity is None:
            unchecked.update(k[0] for k in keys)
            continue
        need, parts = got
        limit, what = _limit(s, capacity)
        if need > limit:
            raise InputError(f"vGPU {vid} needs {need / GB:.2f} GB ({'; '.join(parts)}; tritonserver and "
                             f"{len(keys)} backend instance(s) {vgpu_overhead_bytes(len(keys)) / GB:.2f} GB) but "
                             f"{what} {s.host.gpu_type} has {limit / GB:.2f} GB; plan smaller batches or fewer vGPUs "
                             f"per GPU, or set cluster.gpu_memory_gb.{s.host.gpu_type}")
        per_gpu[(s.host.name, s.gpu_index)] += need
    for (host, gpu), need in sorted(per_gpu.items()):
        gtype = next(s.host.gpu_type for s in slots.values() if (s.host.name, s.gpu_index) == (host, gpu))
        capacity = plan.cluster.memory_bytes(gtype) or float("inf")
        if need > capacity:
            raise InputError(f"GPU {gpu} of host {host} is over-full: its vGPUs need {need / GB:.2f} GB but a {gtype} "
                             f"has {capacity / GB:.2f} GB; plan fewer or smaller vGPUs on it")
    return sorted(unchecked)
