"""What the live executor adds beyond the profiled compute, measured while serving, so that `poolpipe
simulate --overheads FILE` runs the shared driver with the sidecar's own costs and predicts its result."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from poolpipe_common.overheads import Overheads


@dataclass
class _Mean:
    total: float = 0.0
    n: int = 0

    def add(self, x: float) -> None:
        self.total += x
        self.n += 1

    def value(self, default: float = 0.0) -> float:
        return self.total / self.n if self.n else default


@dataclass
class OverheadMeter:
    """Running means of lead (calibrated), tail (compute end -> response), wake lateness and slowdown."""

    lead: _Mean = field(default_factory=_Mean)
    tail: _Mean = field(default_factory=_Mean)
    wake_late: _Mean = field(default_factory=_Mean)
    slowdown: _Mean = field(default_factory=_Mean)
    extra_lead_us: float = 0.0
    front_us: float = 0.0  # not measured here: serve --front-us, written so the simulator and planner use it too

    def calibrated(self, lead_us: float) -> None:
        self.lead.add(lead_us)

    def stage(self, planned_us: float, start_us: float, end_us: float, recv_us: float) -> None:
        self.tail.add(max(0.0, recv_us - end_us))
        if planned_us > 0:
            self.slowdown.add((end_us - start_us) / planned_us)

    def woke(self, late_us: float) -> None:
        self.wake_late.add(max(0.0, late_us))

    def learned_lead(self, extra_us: float) -> None:
        """The executor's lead under load exceeds the calibrated one by ``extra_us``."""
        self.extra_lead_us = extra_us

    def overheads(self) -> Overheads:
        lead = self.lead.value() + self.extra_lead_us
        return Overheads(lead, self.tail.value(), self.wake_late.value(), self.slowdown.value(1.0), self.front_us)

    def write(self, path: Path) -> None:
        doc = self.overheads().to_dict()
        doc["source"] = {"stages": self.tail.n, "wake_ups": self.wake_late.n}
        path.write_text(json.dumps(doc, indent=1) + "\n")
