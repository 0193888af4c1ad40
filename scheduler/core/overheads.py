"""What a live executor adds beyond the profiled compute (the simulator's virtual executor can be given it)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

OVERHEADS_FORMAT = "poolpipe.overheads/1"


@dataclass(frozen=True)
class Overheads:
    """Per-stage costs a live executor has beyond the profiled compute (µs), and the driver's wake lateness.

    ``poolpipe serve --overheads-out FILE`` writes what the sidecar measured; ``poolpipe simulate
    --overheads FILE`` runs the shared driver with them, as the sidecar does."""

    lead_us: float = 0.0  # stage sent -> its compute starts (serialisation, the server's input copy)
    tail_us: float = 0.0  # compute end -> response back at the driver
    wake_late_us: float = 0.0  # mean (exponential) lateness of a requested wake-up
    slowdown: float = 1.0  # compute takes this times the profiled latency

    @classmethod
    def from_dict(cls, raw: dict[str, Any], where: str = "overheads") -> "Overheads":
        """Validated: known fields, non-negative times, slowdown > 0 (ValueError names the bad field)."""
        fields = ("lead_us", "tail_us", "wake_late_us", "slowdown")
        unknown = sorted(set(raw) - set(fields) - {"format", "source"})
        if unknown:
            raise ValueError(f"{where}: unknown field(s) {', '.join(unknown)} (known: {', '.join(fields)})")
        vals: dict[str, float] = {}
        for k in fields:
            if k in raw:
                try:
                    vals[k] = float(raw[k])
                except (TypeError, ValueError):
                    raise ValueError(f"{where}: {k} must be a number, got {raw[k]!r}") from None
                if not (vals[k] > 0 if k == "slowdown" else vals[k] >= 0) or math.isinf(vals[k]):
                    raise ValueError(f"{where}: {k} must be {'> 0' if k == 'slowdown' else '>= 0'}, got {raw[k]!r}")
        return cls(**vals)

    def to_dict(self) -> dict[str, Any]:
        return {"format": OVERHEADS_FORMAT, "lead_us": self.lead_us, "tail_us": self.tail_us,
                "wake_late_us": self.wake_late_us, "slowdown": self.slowdown}
