"""Where a plan's unequal-size vGPUs sit: its ``gpu_splits`` opened GPU by GPU, each partition's vGPUs taken
from the slots of its size in plan order. The simulator's placement and ``poolpipe generate`` both use it
(the unequally split GPUs of a type come first: ordinals 0..n-1, the equal-level GPUs after them)."""

from __future__ import annotations

from dataclasses import dataclass

from plans.plan_json import Plan
from plans.spec.vgpu_sizes import mig_layout
from poolpipe_common.errors import InputError

StageKey = tuple[str, int, int]  # (model, pipeline index, stage index)


@dataclass(frozen=True)
class SizedSlot:
    """One unequal vGPU: slot ``slot`` of the ``gpu``-th unequally split GPU of its type."""

    gpu: int
    slot: int
    label: str
    share: float
    mig_start: int | None = None  # first memory slice of its MIG placement (None under MPS)

    @property
    def mps_percent(self) -> int:
        return round(self.share * 100)


def split_gpu_counts(plan: Plan) -> dict[str, int]:
    """GPUs of each type that the plan splits unequally."""
    return {t: sum(e["gpus"] for e in entries) for t, entries in (plan.gpu_splits or {}).items()}


def _free_slots(plan: Plan) -> dict[str, dict[str, list[SizedSlot]]]:
    out: dict[str, dict[str, list[SizedSlot]]] = {}
    sizes = plan.cluster.vgpu_sizes or {}
    for gpu, entries in (plan.gpu_splits or {}).items():
        if gpu not in sizes:
            raise InputError(f"plan gpu_splits: {gpu} has no vgpu_sizes in the plan's cluster")
        splits, free, ordinal = sizes[gpu], out.setdefault(gpu, {}), 0
        for e in entries:
            labels = tuple(e["vgpus"])
            try:
                sz = [splits.size(lb) for lb in labels]
            except KeyError as err:
                raise InputError(f"plan gpu_splits.{gpu}: unknown size {err} (sizes: "
                                 f"{', '.join(s.label for s in splits.sizes)})") from None
            starts = [None] * len(sz)
            if splits.kind == "mig":
                lay = mig_layout(tuple(s.mig_slices or 0 for s in sz))
                if lay is None:
                    raise InputError(f"plan gpu_splits.{gpu}: {list(labels)} is not a valid MIG geometry")
                starts = [st for _, st in lay]
            for _ in range(e["gpus"]):
                for i, (s, st) in enumerate(zip(sz, starts)):
                    free.setdefault(s.label, []).append(SizedSlot(ordinal, i, s.label, s.share, st))
                ordinal += 1
    return out


def sized_slots(plan: Plan) -> dict[StageKey, list[SizedSlot]]:
    """The slots of every partition on an unequal size; InputError when gpu_splits do not hold them."""
    free = _free_slots(plan)
    out: dict[StageKey, list[SizedSlot]] = {}
    for m in plan.models:
        for j, pl in enumerate(m.pipelines):
            for k, p in enumerate(pl.partitions):
                if p.size is None:
                    continue
                pool = free.get(p.gpu, {}).get(p.size, [])
                if len(pool) < p.num_vgpus:
                    raise InputError(f"plan: {m.name} pipeline {j} needs {p.num_vgpus} {p.gpu} {p.size} vGPU(s) but "
                                     f"gpu_splits leave {len(pool)}")
                out[(m.name, j, k)] = [pool.pop(0) for _ in range(p.num_vgpus)]
    return out
