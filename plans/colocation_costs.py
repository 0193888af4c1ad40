"""What co-location costs a partition: its memory pressure, its device memory, its slowdown next to the other
vGPUs on its physical GPU (profiling.interference), and the per-GPU memory check. Shared by the co-location
planner (planner.colocation.colocate) and the simulator (scheduler.sim), so both apply the same model."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from plans.plan_json import PartitionPlan, Plan
from plans.spec.planning_spec import ClusterSpec
from poolpipe_common.errors import InputError
from profiling.block_memory import pressure
from profiling.interference import InterferenceModel
from profiling.profile import Profile


def need_colocation_facts(profile: Profile, gpu_types: list[str]) -> None:
    """Co-location needs each profile's block memory and an interference model for each GPU type it may use."""
    if profile.memory is None:
        raise InputError(f"profile {profile.model} has no 'memory' (weights and activations per block), needed "
                         "to co-locate; measure it with 'poolpipe profile measure' or add the field")
    missing = [t for t in gpu_types if t in profile.timings and t not in profile.interference]
    if missing:
        raise InputError(f"profile {profile.model} has no interference model for {', '.join(missing)}, needed to "
                         "co-locate; fit one with 'poolpipe profile measure --co-run OTHER.onnx' on that GPU type")


def partition_pressure(profile: Profile, gpu: str, v: int, batch: int, first: int, end: int) -> float:
    """Memory pressure of blocks [first, end) at ``batch`` on a 1/v vGPU (at its profiled latency)."""
    assert profile.memory is not None
    return pressure(profile.memory.traffic_bytes(first, end, batch), profile.latency_us(gpu, v, batch, first, end),
                    gpu)


def partition_memory(profile: Profile, first: int, end: int, batch: int) -> int:
    assert profile.memory is not None
    return profile.memory.partition_bytes(first, end, batch)


@dataclass(frozen=True)
class Slot:
    """One vGPU of a plan on its physical GPU: what it runs and how it presses on memory."""

    gpu_id: str
    model: str
    pipeline: int
    partition: int
    v: int
    pressure: float
    memory_bytes: int
    interference: InterferenceModel


def plan_slots(plan: Plan) -> list[Slot]:
    """Every vGPU of a co-located plan (partitions with a placement)."""
    out = []
    for m in plan.models:
        prof = m.profile
        for j, pl in enumerate(m.pipelines):
            for k, p in enumerate(pl.partitions):
                if p.placement is None:
                    continue
                need_colocation_facts(prof, [p.gpu])
                pr = partition_pressure(prof, p.gpu, p.v, p.batch, *p.blocks)
                mem = partition_memory(prof, *p.blocks, p.batch)
                out += [Slot(g, m.name, j, k, p.v, pr, mem, prof.interference[p.gpu]) for g in p.placement]
    return out


def slot_slowdowns(slots: list[Slot]) -> list[float]:
    """Each slot's slowdown over its profiled latency with every co-runner on its GPU busy (the planner's bound)."""
    by_gpu: dict[str, list[int]] = defaultdict(list)
    for i, s in enumerate(slots):
        by_gpu[s.gpu_id].append(i)
    out = []
    for i, s in enumerate(slots):
        co = [(1.0, slots[q].pressure) for q in by_gpu[s.gpu_id] if q != i]
        out.append(s.interference.relative_slowdown(s.pressure, s.v, co))
    return out


def check_gpu_memory(slots: list[Slot], cluster: ClusterSpec) -> None:
    """Every physical GPU's vGPUs fit its memory and share one vGPU level; else a one-line InputError."""
    by_gpu: dict[str, list[Slot]] = defaultdict(list)
    for s in slots:
        by_gpu[s.gpu_id].append(s)
    for gid, ss in sorted(by_gpu.items()):
        gtype = gid.rsplit("-", 1)[0]
        levels = {s.v for s in ss}
        if len(levels) > 1 or len(ss) > ss[0].v:
            raise InputError(f"GPU {gid}: {len(ss)} vGPUs at levels {sorted(levels)}; a GPU split at level V holds "
                             "at most V vGPUs of that level")
        cap = cluster.memory_bytes(gtype)
        used = sum(s.memory_bytes for s in ss)
        if cap is not None and used > cap:
            what = ", ".join(f"{s.model}[{s.pipeline}.{s.partition}] {s.memory_bytes / 1e9:.2f} GB" for s in ss)
            raise InputError(f"GPU {gid} is over-full: its vGPUs need {used / 1e9:.2f} GB ({what}) but a {gtype} "
                             f"has {cap / 1e9:.0f} GB; use smaller batches or fewer vGPUs per GPU, or set "
                             f"cluster.gpu_memory_gb.{gtype}")


def with_placement(part: PartitionPlan, gpus: list[str], slowdown: float) -> PartitionPlan:
    from dataclasses import replace

    return replace(part, placement=tuple(gpus), slowdown=slowdown)
