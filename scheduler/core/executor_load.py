"""Whether the executor itself (the sidecar's event loop), rather than the vGPUs, is what limits the rate.

Each dispatch costs the executor about as much as several requests do (a stage call: building it, a gRPC
round trip, reading its answer), so a saturated executor keeps up only with fewer, fuller batches, even where
the vGPUs would serve every batch size at once. The executor reports how busy it was over each window; the
smoothed fraction turns the state on above ``on`` and off below ``off`` (holding batches lowers the load it
measures, so one threshold would flap). Smoothing keeps one busy window (a start-up, a collection, a stall of
the host) from holding batches for the seconds it takes to fall back below ``off``."""

from __future__ import annotations

from dataclasses import dataclass, field

SATURATED_ON = 0.9  # fraction of wall time the executor was busy
SATURATED_OFF = 0.5
SMOOTHING = 0.3  # weight of the newest window: about seven windows of a saturated loop turn the state on


@dataclass
class ExecutorLoad:
    on: float = SATURATED_ON
    off: float = SATURATED_OFF
    weight: float = SMOOTHING
    saturated: bool = field(default=False, init=False)
    busy: float = field(default=0.0, init=False)  # the smoothed busy fraction

    def __post_init__(self) -> None:
        if not 0.0 <= self.off < self.on <= 1.0:
            raise ValueError(f"executor load thresholds: need 0 <= off < on <= 1, got off={self.off} on={self.on}")
        if not 0.0 < self.weight <= 1.0:
            raise ValueError(f"executor load smoothing weight must be in (0, 1], got {self.weight}")

    def update(self, busy: float) -> bool:
        """Take the busy fraction of the last window; True when the saturated state changed."""
        self.busy += self.weight * (busy - self.busy)
        was = self.saturated
        if self.busy >= self.on:
            self.saturated = True
        elif self.busy <= self.off:
            self.saturated = False
        return self.saturated != was
