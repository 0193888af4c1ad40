"""What each kind of stage call costs while serving, by its size: the mean lead (sent -> compute starts, on idle
servers only: a busy server's queue is not a serving cost) and tail (compute end -> answer back) of the calls of each
pipeline stage and batch size, with the profiled bytes they carry and the rate the sidecar served. ``serve
--overheads-out`` writes them under ``calibration``; ``poolpipe calibrate`` fits the cost model to them
(poolpipe_common.cost_fit)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from model_repository_gen.manifest import Manifest

if TYPE_CHECKING:
    from scheduler.server.planned.stage_observers import StageRecord

MIN_CALLS = 8  # a kind of call seen fewer times says too little of its cost to be fitted


@dataclass
class _Kind:
    sent_bytes: float
    back_bytes: float
    calls: int = 0
    tail_us: float = 0.0
    idle_calls: int = 0
    lead_us: float = 0.0


def call_bytes_of(manifest: Manifest) -> dict[str, list[tuple[int, int]]]:
    """pipeline id -> per stage, the profiled bytes per request its call sends and gets back."""
    profiles = {m.name: m.profile for m in manifest.plan.models}
    return {p.id: [profiles[m.name].call_bytes(*s.blocks) if m.name in profiles else (0, 0) for s in p.stages]
            for m in manifest.models for p in m.pipelines}


class CallCosts:
    """A StageObserver: per (pipeline, stage, batch), the calls' mean lead and tail; and the rate served (rows
    entering their first stage per second between the first and the last such call)."""

    def __init__(self, call_bytes: dict[str, list[tuple[int, int]]]) -> None:
        self.call_bytes = call_bytes
        self.kinds: dict[tuple[str, int, int], _Kind] = {}
        self.rows = 0
        self.first_us: float | None = None
        self.last_us = 0.0

    def stage_done(self, r: StageRecord) -> None:
        pid, k, b, t = r.dispatch.pipeline_id, r.stage, r.batch, r.timing
        sent, back = self.call_bytes[pid][k] if pid in self.call_bytes else (0, 0)
        kind = self.kinds.setdefault((pid, k, b), _Kind(sent * b, back * b))
        kind.calls += 1
        kind.tail_us += max(0.0, t.recv_us - t.end_us)
        if r.idle:
            kind.idle_calls += 1
            kind.lead_us += max(0.0, t.start_us - t.send_us)
        if k == 0:
            self.rows += b
            if self.first_us is None:
                self.first_us = t.send_us
            self.last_us = t.send_us

    def served_rps(self) -> float:
        span = self.last_us - (self.first_us or 0.0)
        return self.rows / (span / 1e6) if self.first_us is not None and span > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """What ``calibration`` holds in an overheads file: the rate served and each kind of call seen enough."""
        points = [{"pipeline": pid, "stage": k, "batch": b, "sent_bytes": c.sent_bytes, "back_bytes": c.back_bytes,
                   "calls": c.calls, "tail_us": c.tail_us / c.calls,
                   "lead_us": c.lead_us / c.idle_calls if c.idle_calls >= MIN_CALLS else None}
                  for (pid, k, b), c in sorted(self.kinds.items()) if c.calls >= MIN_CALLS]
        return {"served_rps": self.served_rps(), "points": points}
