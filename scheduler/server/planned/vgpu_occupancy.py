"""How long a stage really holds its vGPU: its measured compute, and the server's turnaround to the next batch.

A Triton server does not start a queued batch the moment the one before it ends: it answers that one and hands
the next to its backend first (a millisecond or more on a Python backend under load). Reservations that count the
compute alone let the next batch's reservation start before the server can, and batches run late; the executor
reports each stage's compute extended by its vGPU's measured turnaround, so the core's tables hold what a batch
really takes from the vGPU.
"""

from __future__ import annotations

WEIGHT = 0.1  # of one back-to-back pair in a vGPU's smoothed turnaround


class VgpuOccupancy:
    """Per vGPU: the end of its last measured compute, and the smoothed turnaround between back-to-back batches
    (a batch sent before the one ahead of it ended waited in the server's queue: its start less that end)."""

    def __init__(self) -> None:
        self.last_end_us: dict[str, float] = {}
        self.turnaround_us: dict[str, float] = {}

    def measured(self, vgpu: str, send_us: float, start_us: float, end_us: float) -> bool:
        """A stage sent at ``send_us`` computed [start, end) on ``vgpu``; True when the vGPU was idle at the send
        (then the send-to-compute time is the server's lead, else it is part queueing)."""
        last = self.last_end_us.get(vgpu, float("-inf"))
        self.last_end_us[vgpu] = end_us
        if last < send_us:
            return True
        gap = max(0.0, start_us - last)
        prev = self.turnaround_us.get(vgpu)
        self.turnaround_us[vgpu] = gap if prev is None else prev + WEIGHT * (gap - prev)
        return False

    def held(self, vgpu: str, start_us: float, end_us: float) -> tuple[float, float]:
        """The interval a compute of [start, end) on ``vgpu`` keeps the vGPU from its next batch."""
        return start_us, end_us + self.turnaround_us.get(vgpu, 0.0)
