"""Synthetic placement of a plan onto a cluster: vGPUs on physical GPUs, GPUs on servers behind one NIC.

The simulator uses this (the live sidecar builds its Topology from manifest.json instead). Each GPU
type fills servers of ``cluster.gpus_per_server[type]`` GPUs; a GPU split at level V hosts V vGPUs
of one level, and partitions are packed onto GPUs in plan order (consecutive partitions of one type
land on the same servers where they fit, as a real deployment would try to). A co-located plan
(planner.colocation.colocate) names each vGPU's physical GPU itself; its vGPUs go exactly there, and each stage's
latency table is the profile's times the slowdown the planner allowed for (scheduler.sim.interference
applies the actual one per batch).
"""

from __future__ import annotations

from plans.plan_json import Plan
from plans.split_slots import sized_slots, split_gpu_counts
from scheduler.core.latency_dist import QuantileDist
from scheduler.core.topology import Pipeline, Stage, Topology, VGpu


def vgpu_id(gpu_type: str, gpu_index: int, slot: int) -> str:
    return f"{gpu_type}-{gpu_index}:{slot}"


class _GpuAllocator:
    """Hands out vGPU slots of one GPU type, opening a new physical GPU when the level changes or it is full."""

    def __init__(self, gpu_type: str, per_server: int, first_gpu: int = 0) -> None:
        self.gpu_type = gpu_type
        self.per_server = per_server
        self.next_gpu = first_gpu
        self.open: dict[int, tuple[int, int]] = {}  # level V -> (gpu index, next free slot)

    def take(self, v: int) -> VGpu:
        gpu, slot = self.open.get(v, (-1, v))
        if slot >= v:
            gpu, slot = self.next_gpu, 0
            self.next_gpu += 1
        self.open[v] = (gpu, slot + 1)
        return VGpu(vgpu_id(self.gpu_type, gpu, slot), self.gpu_type, v,
                    f"{self.gpu_type}-srv{gpu // self.per_server}", f"{self.gpu_type}-{gpu}")


def placed_vgpus(plan: Plan) -> dict[tuple[str, int, int], list[VGpu]]:
    """The vGPUs of every partition of a co-located plan, (model, pipeline, partition) -> its pool, on the
    physical GPUs the plan names (slots numbered per GPU in plan order); {} for other plans."""
    out: dict[tuple[str, int, int], list[VGpu]] = {}
    slots: dict[str, int] = {}
    for m in plan.models:
        for j, pl in enumerate(m.pipelines):
            for k, part in enumerate(pl.partitions):
                if part.placement is None:
                    continue
                per = plan.cluster.gpus_per_server.get(part.gpu, 1)
                pool = []
                for g in part.placement:
                    slot = slots.get(g, 0)
                    slots[g] = slot + 1
                    idx = int(g.rsplit("-", 1)[1])
                    pool.append(VGpu(f"{g}:{slot}", part.gpu, part.v, f"{part.gpu}-srv{idx // per}", g))
                out[(m.name, j, k)] = pool
    return out


def topology_from_plan(plan: Plan) -> Topology:
    """Place every partition's vGPUs and build each model's pooled pipelines with latency tables."""
    cluster = plan.cluster
    split = split_gpu_counts(plan)  # unequally split GPUs (plans.split_slots) come first
    sized = sized_slots(plan)
    allocs = {t: _GpuAllocator(t, cluster.gpus_per_server.get(t, 1), split.get(t, 0)) for t in cluster.gpus}
    vgpus: dict[str, VGpu] = {}
    pipelines: dict[str, tuple[Pipeline, ...]] = {}
    placed = placed_vgpus(plan)
    for m in plan.models:
        prof = m.profile
        pipes = []
        for j, pl in enumerate(m.pipelines):
            stages = []
            for k, part in enumerate(pl.partitions):
                alloc = allocs.setdefault(part.gpu, _GpuAllocator(part.gpu, cluster.gpus_per_server.get(part.gpu, 1)))
                pool = []
                for i in range(part.num_vgpus):
                    if (m.name, j, k) in placed:  # co-located: where the plan put it
                        vg = placed[(m.name, j, k)][i]
                    elif part.size is not None:  # an unequal share: its slot of an unequally split GPU
                        s = sized[(m.name, j, k)][i]
                        vg = VGpu(vgpu_id(part.gpu, s.gpu, s.slot), part.gpu, max(1, round(1 / s.share)),
                                  f"{part.gpu}-srv{s.gpu // alloc.per_server}", f"{part.gpu}-{s.gpu}")
                    else:
                        vg = alloc.take(part.v)
                    vgpus[vg.id] = vg
                    pool.append(vg.id)
                first, end = part.blocks
                dev, v = part.timing_device, part.v
                lat = {b: prof.latency_us(dev, v, b, first, end) * part.slowdown
                       for b in prof.batch_sizes(dev, v) if b <= pl.batch}
                in_bytes = prof.boundary_bytes(first) if first > 0 else 0
                qs = {b: prof.latency_quantiles_us(dev, v, b, first, end) for b in lat}
                dist = {b: QuantileDist(*q) for b, q in qs.items() if q is not None} or None
                stages.append(Stage((first, end), tuple(pool), lat, in_bytes, dist,
                                    call_bytes=prof.call_bytes(first, end)))
            pipes.append(Pipeline(f"{m.name}/{j}", m.name, pl.batch, tuple(stages), pl.throughput_rps))
        pipelines[m.name] = tuple(pipes)
    return Topology(vgpus, pipelines, {m.name: m.slo_us for m in plan.models}, cluster.bandwidth_gbps,
                    dict(cluster.gpus))
