"""Interference between co-located vGPUs in the simulator: the planner's model (plans.colocation_costs) applied to
each batch, given what else runs on its physical GPU when it starts.

A co-runner counts with utilisation 1 while it is computing at the batch's start, else with its busy fraction
so far (the chance it starts during the batch). The batch's latency is the profile's times the model's
slowdown for those co-runners; the stage tables already hold the profile's times the slowdown the planner
allowed for, so the executor scales them by actual / planned.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from plans.colocation_costs import partition_pressure
from plans.plan_json import Plan
from profiling.interference import InterferenceModel
from scheduler.sim.placement import placed_vgpus


@dataclass(frozen=True)
class _VgpuFacts:
    gpu: str
    v: int
    pressure: float
    planned: float  # slowdown already in the stage's latency table
    model: InterferenceModel


class CoRunInterference:
    """Per-batch slowdown factors for the vGPUs of a co-located plan."""

    def __init__(self, facts: dict[str, _VgpuFacts]) -> None:
        self.facts = facts
        peers: dict[str, list[str]] = defaultdict(list)
        for vid, f in facts.items():
            peers[f.gpu].append(vid)
        self.corunners = {vid: [q for q in peers[f.gpu] if q != vid] for vid, f in facts.items()}
        self.total_slowdown = 0.0  # sum of actual slowdowns applied (for the mean)
        self.batches = 0

    def factor(self, vgpu: str, start_us: float, vfree: dict[str, float], busy: dict[str, float]) -> float:
        """Multiplier of the stage table's latency for a batch starting on ``vgpu`` at ``start_us``."""
        f = self.facts.get(vgpu)
        if f is None:
            return 1.0
        co = []
        for q in self.corunners[vgpu]:
            u = 1.0 if vfree[q] > start_us else min(1.0, busy[q] / start_us) if start_us > 0 else 0.0
            co.append((u, self.facts[q].pressure))
        actual = f.model.relative_slowdown(f.pressure, f.v, co)
        self.total_slowdown += actual
        self.batches += 1
        return actual / f.planned

    @property
    def mean_slowdown(self) -> float:
        return self.total_slowdown / self.batches if self.batches else 1.0


def interference_of(plan: Plan) -> CoRunInterference | None:
    """The interference of a co-located plan's vGPUs (None for a plan without placements)."""
    placed = placed_vgpus(plan)
    if not placed:
        return None
    facts = {}
    for m in plan.models:
        for j, pl in enumerate(m.pipelines):
            for k, part in enumerate(pl.partitions):
                pr = partition_pressure(m.profile, part.gpu, part.v, part.batch, *part.blocks)
                for vg in placed.get((m.name, j, k), []):
                    facts[vg.id] = _VgpuFacts(vg.gpu, part.v, pr, part.slowdown, m.profile.interference[part.gpu])
    return CoRunInterference(facts)
