"""The batch log (`serve --batch-log FILE`): one JSON line per executed stage with its measured compute
interval, for timelines such as the demo's and for comparing the live run with the simulator; and where a batch's
time goes beyond compute: its first request's arrival, the compute start the scheduler reserved, when the stage's
input was at hand, sent, and its answer received (all time.monotonic() seconds, like the compute interval)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from scheduler.core.api import Dispatch, StageAssignment
from scheduler.server.planned.stage_io import StageTiming

if TYPE_CHECKING:
    from scheduler.server.planned.stage_observers import StageRecord


class BatchLog:
    def __init__(self, path: Path) -> None:
        self._f = open(path, "a", buffering=1)

    def stage(self, d: Dispatch, a: StageAssignment, batch: int, t: StageTiming, arrival_us: float) -> None:
        """One line: ``a``, the stage's assignment as it ran (its reserved start, when ``d`` reserves)."""
        stage, vgpu = a.stage, a.vgpu
        reserved = a.start_us if d.reserved else None
        self._f.write(json.dumps({"dispatch": d.id, "model": d.model, "pipeline": d.pipeline_id, "stage": stage,
                                  "vgpu": vgpu, "batch": batch, "start_s": t.start_us / 1e6, "end_s": t.end_us / 1e6,
                                  "arrival_s": arrival_us / 1e6,
                                  "reserved_start_s": None if reserved is None else reserved / 1e6,
                                  "ready_s": t.ready_us / 1e6, "sent_s": t.send_us / 1e6,
                                  "received_s": t.recv_us / 1e6}) + "\n")

    def stage_done(self, r: StageRecord) -> None:
        """A StageObserver: the stage's line, with its first request's arrival."""
        self.stage(r.dispatch, r.assignment, r.batch, r.timing, min(s.call.arrival_us for s in r.live))

    def close(self) -> None:
        self._f.close()
