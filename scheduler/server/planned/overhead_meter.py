"""What the live executor adds beyond the profiled compute, measured while serving, so that `poolpipe
simulate --overheads FILE` runs the shared driver with the sidecar's own costs and predicts its result.

Each cost is summarised as the median of its means over windows of stage calls, not one mean over the run: a host
stall of tens of milliseconds across a few hundred calls is an episode, not what every stage costs, and one such
stall while serving the run a plan's costs come from (on a shared 2-core host) raised the mean lead 1.8x and the
mean tail 3.4x, and the planner promised 0.87 of what the same plan then held."""

from __future__ import annotations

import json
import statistics
from collections import defaultdict, deque
from collections.abc import Hashable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from poolpipe_common.overheads import Overheads, front_quantiles

WINDOW = 256  # samples per window of a windowed cost (about a second of stage calls at a few hundred req/s)
# Stage calls measured before a re-plan takes the sidecar's own costs over the serving plan's: one full window
# (before it a cost is a running mean, which one host stall moves; a re-plan comes minutes into serving anyway)
MIN_STAGES_FOR_COSTS = WINDOW
# The calls whose lead and tail give their spread about the mean (Overheads.lead_shape): the latest this many, so
# that a long run's file describes the rate it served last and holds the meter's memory bounded
SHAPE_CALLS = 50_000


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
class _WindowedMean:
    """Means of consecutive windows of ``window`` samples; the value is their median (the running mean until the
    first window is full)."""

    window: int = WINDOW
    _means: list[float] = field(default_factory=list)
    _current: _Mean = field(default_factory=_Mean)

    @property
    def n(self) -> int:
        return len(self._means) * self.window + self._current.n

    def add(self, x: float) -> None:
        self._current.add(x)
        if self._current.n == self.window:
            self._means.append(self._current.value())
            self._current = _Mean()

    def value(self, default: float = 0.0) -> float:
        return statistics.median(self._means) if self._means else self._current.value(default)

    def recent(self, windows: int, default: float = 0.0) -> float:
        """The median of the last ``windows`` windows' means (the running mean until the first is full)."""
        return statistics.median(self._means[-windows:]) if self._means else self._current.value(default)


@dataclass
class OverheadMeter:
    """Windowed lead (calibrated, and as learned under load), tail (compute end -> response), wake lateness and
    slowdown."""

    lead: _Mean = field(default_factory=_Mean)
    tail: _WindowedMean = field(default_factory=_WindowedMean)
    wake_late: _WindowedMean = field(default_factory=_WindowedMean)
    slowdown: _WindowedMean = field(default_factory=_WindowedMean)
    extra_lead: _WindowedMean = field(default_factory=_WindowedMean)
    extra_lead_us: float = 0.0  # the learned lead now, sampled once per stage into extra_lead
    front_us: float = 0.0  # not measured here: serve --front-us, written so the simulator and planner use it too
    # the latest calls' (kind, lead, tail): a kind is a (pipeline, stage, batch), whose calls have one mean
    calls: deque = field(default_factory=lambda: deque(maxlen=SHAPE_CALLS))

    def calibrated(self, lead_us: float) -> None:
        self.lead.add(lead_us)

    def stage(self, planned_us: float, start_us: float, end_us: float, recv_us: float) -> None:
        self.tail.add(max(0.0, recv_us - end_us))
        self.extra_lead.add(self.extra_lead_us)
        if planned_us > 0:
            self.slowdown.add((end_us - start_us) / planned_us)

    def call(self, kind: Hashable, lead_us: float, tail_us: float) -> None:
        """One stage call's lead (sent, or its vGPU free if later, to its compute start) and tail."""
        self.calls.append((kind, max(0.0, lead_us), max(0.0, tail_us)))

    def shapes(self) -> dict[str, tuple[float, ...]]:
        """Overheads.lead_shape and tail_shape: each call's lead and tail over its kind's mean (none before a
        window of calls); computed when asked, not per call."""
        if len(self.calls) < WINDOW:
            return {}
        by_kind: dict[Hashable, list[tuple[float, float]]] = defaultdict(list)
        for kind, lead, tail in self.calls:
            by_kind[kind].append((lead, tail))
        out = {}
        for i, name in enumerate(("lead_shape", "tail_shape")):
            ratios = [x[i] / m for xs in by_kind.values() if (m := float(np.mean([x[i] for x in xs]))) > 0
                      for x in xs]
            if ratios:
                out[name] = front_quantiles(ratios)
        return out

    def woke(self, late_us: float) -> None:
        self.wake_late.add(max(0.0, late_us))

    def learned_lead(self, extra_us: float) -> None:
        """The executor's lead under load exceeds the calibrated one by ``extra_us`` from now on."""
        self.extra_lead_us = extra_us

    def overheads(self) -> Overheads:
        lead = self.lead.value() + self.extra_lead.value(self.extra_lead_us)
        return Overheads(lead, self.tail.value(), self.wake_late.value(), self.slowdown.value(1.0), self.front_us)

    @property
    def stages(self) -> int:
        """Stage calls measured so far."""
        return self.tail.n

    def measured_costs(self) -> dict[str, float]:
        """The per-stage costs measured so far, as Overheads fields (lead, tail, wake lateness, slowdown), for a
        re-plan to plan with; empty before MIN_STAGES_FOR_COSTS stage calls (the way outside the sidecar's clock is
        not measured here: the plan's stays)."""
        if self.stages < MIN_STAGES_FOR_COSTS:
            return {}
        o = self.overheads()
        return {"lead_us": o.lead_us, "tail_us": o.tail_us, "wake_late_us": o.wake_late_us, "slowdown": o.slowdown}

    def recent_costs(self, windows: int) -> dict[str, float]:
        """The per-stage costs of the last ``windows`` windows of stage calls (what a stage costs at the rate served
        now, where measured_costs is the run's), as Overheads fields; empty before MIN_STAGES_FOR_COSTS."""
        if self.stages < MIN_STAGES_FOR_COSTS:
            return {}
        return {"lead_us": self.lead.value() + self.extra_lead.recent(windows, self.extra_lead_us),
                "tail_us": self.tail.recent(windows), "wake_late_us": self.wake_late.recent(windows),
                "slowdown": self.slowdown.recent(windows, 1.0)}

    def write(self, path: Path, calibration: dict | None = None) -> None:
        """The costs as an overheads file (``calibration``: the calls by size, scheduler.server.planned.call_costs)."""
        doc = replace(self.overheads(), **self.shapes()).to_dict()
        doc["source"] = {"stages": self.stages, "wake_ups": self.wake_late.n}
        if calibration is not None:
            doc["calibration"] = calibration
        path.write_text(json.dumps(doc, indent=1) + "\n")
