"""The batch log (`serve --batch-log FILE`): one JSON line per executed stage with its measured compute
interval, for timelines such as the demo's and for comparing the live run with the simulator."""

from __future__ import annotations

import json
from pathlib import Path

from scheduler.core.api import Dispatch


class BatchLog:
    def __init__(self, path: Path) -> None:
        self._f = open(path, "a", buffering=1)

    def stage(self, d: Dispatch, stage: int, vgpu: str, batch: int, start_us: float, end_us: float) -> None:
        self._f.write(json.dumps({"dispatch": d.id, "model": d.model, "pipeline": d.pipeline_id, "stage": stage,
                                  "vgpu": vgpu, "batch": batch, "start_s": start_us / 1e6,
                                  "end_s": end_us / 1e6}) + "\n")

    def close(self) -> None:
        self._f.close()
