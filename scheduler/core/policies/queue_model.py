"""Bookkeeping for the policies without reservations: outstanding batches and predicted free time per vGPU."""

from __future__ import annotations

from scheduler.core.api import StageAssignment
from scheduler.core.probe import ReservationState
from scheduler.core.topology import Topology


class VGpuQueues:
    """What a reservation-free policy knows of each vGPU: batches sent and not yet reported, and a
    predicted time it frees (from the profile, corrected by reports)."""

    def __init__(self, topology: Topology) -> None:
        self.compiled = ReservationState(topology)  # only for its compiled pipelines and active pools
        self.server = {v: vg.server for v, vg in topology.vgpus.items()}
        self.outstanding = {v: 0 for v in topology.vgpus}
        self.busy_until = {v: 0.0 for v in topology.vgpus}
        self.live: dict[int, list[StageAssignment]] = {}

    def sent(self, dispatch_id: int, stages: list[StageAssignment]) -> None:
        self.live[dispatch_id] = stages
        for a in stages:
            self.outstanding[a.vgpu] += 1
            self.busy_until[a.vgpu] = max(self.busy_until[a.vgpu], a.end_us)

    def reported(self, dispatch_id: int, stage: int, end_us: float) -> StageAssignment | None:
        """Account a finished stage; returns its assignment (None when unknown or already reported)."""
        stages = self.live.get(dispatch_id)
        if stages is None:
            return None
        i = next((j for j, x in enumerate(stages) if x.stage == stage), None)
        if i is None:
            return None
        a = stages[i]
        stages = stages[:i] + stages[i + 1:]
        if stages:
            self.live[dispatch_id] = stages
        else:
            del self.live[dispatch_id]
        v = a.vgpu
        self.outstanding[v] = max(0, self.outstanding[v] - 1)
        if self.outstanding[v] == 0:
            self.busy_until[v] = end_us
        else:
            self.busy_until[v] += end_us - a.end_us  # the queue behind it moves with it
        return a

    def release(self, dispatch_id: int, now_us: float) -> None:
        """An abandoned dispatch: its stages not yet reported will never run; the vGPUs' queues shrink by them."""
        for a in self.live.pop(dispatch_id, []):
            v = a.vgpu
            self.outstanding[v] = max(0, self.outstanding[v] - 1)
            if self.outstanding[v] == 0:
                self.busy_until[v] = min(self.busy_until[v], now_us)

    def set_up(self, vgpu: str, up: bool, now_us: float) -> None:
        self.compiled.set_vgpu_up(vgpu, up, now_us)
        if not up and vgpu in self.outstanding:
            self.outstanding[vgpu] = 0
            self.busy_until[vgpu] = now_us
