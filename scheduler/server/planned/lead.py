"""The send-to-compute lead the live executor learns under load, beyond what calibration measured at idle.

Only stages sent to an idle server show it (a busy server's queue would count as lead). It is a high percentile
of the recent excesses, and "recent" is bounded in time as well as in count: what a burst taught (the servers'
and the sidecar's CPU shared by too much work) is forgotten ``horizon_us`` after the burst, once the newest
``LEAD_MIN_SAMPLES`` samples are calm ones, so the core's clock does not run ahead by a burst's lead (planning
everything later, shedding what it need not) once it has passed; at a low rate the newest samples are kept
whatever their age, so that the lead does not drop to nothing between samples.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from poolpipe_common.quantile import percentile

if TYPE_CHECKING:
    from scheduler.server.planned.stage_observers import StageRecord

LEAD_WINDOW = 256
LEAD_MIN_SAMPLES = 16
LEAD_EVERY = 8
LEAD_PERCENTILE = 90
LEAD_HORIZON_US = 2_000_000.0
# Between the every-LEAD_EVERY recomputations, a sample leaving the horizon recomputes at most this often: at a low
# rate nearly every sample prunes one, and a percentile per stage call was 5 % of the sidecar's busy time there
LEAD_PRUNED_EVERY_US = 100_000.0


class LeadLearner:
    """Excess lead samples (when, µs) of the last ``horizon_us``; ``observe`` returns a new lead when it changed."""

    def __init__(self, horizon_us: float = LEAD_HORIZON_US) -> None:
        self.horizon_us = horizon_us
        self.extra_us = 0.0
        self._excess: deque[tuple[float, float]] = deque(maxlen=LEAD_WINDOW)
        self._seen = 0
        self._computed_us = -float("inf")

    def observe(self, now_us: float, excess_us: float) -> float | None:
        """One idle-server stage's excess lead at ``now_us``; the new learned lead, or None when unchanged."""
        pruned = self._prune(now_us)
        self._excess.append((now_us, max(0.0, excess_us)))
        self._seen += 1
        if len(self._excess) < LEAD_MIN_SAMPLES:
            return None
        if self._seen % LEAD_EVERY and not (pruned and now_us - self._computed_us >= LEAD_PRUNED_EVERY_US):
            return None
        self._computed_us = now_us
        new = percentile([x for _, x in self._excess], LEAD_PERCENTILE)
        if new == self.extra_us:
            return None
        self.extra_us = new
        return new

    def _prune(self, now_us: float) -> bool:
        q, pruned = self._excess, False
        while len(q) > LEAD_MIN_SAMPLES and q[0][0] < now_us - self.horizon_us:
            q.popleft()
            pruned = True
        return pruned


class Leads:
    """Each stage's send-to-compute lead: as calibrated at idle (``calibrated``: pipeline -> stage -> batch -> µs),
    plus the excess learned under load, which goes to ``on_learned`` when it changes (the driver's clock leads by
    it too). A StageObserver: a stage sent to an idle server (the only kind it learns from: one that waited in the
    server's queue shows the server's turnaround between batches instead) shows the real lead."""

    def __init__(self, on_learned: Callable[[float], None]) -> None:
        self.calibrated: dict[str, list[dict[int, float]]] = {}
        self.extra_us = 0.0
        self.on_learned = on_learned
        self._learner = LeadLearner()

    def calibrated_us(self, pipeline: str, stage: int, batch: int) -> float:
        per_stage = self.calibrated.get(pipeline)
        return per_stage[stage].get(batch, 0.0) if per_stage is not None else 0.0

    def lead_us(self, pipeline: str, stage: int, batch: int) -> float:
        return self.calibrated_us(pipeline, stage, batch) + self.extra_us

    def stage_done(self, r: StageRecord) -> None:
        pipeline = r.dispatch.pipeline_id
        if not r.idle or pipeline not in self.calibrated:
            return
        t = r.timing
        new = self._learner.observe(t.recv_us, t.start_us - t.send_us - self.calibrated_us(pipeline, r.stage, r.batch))
        if new is not None:
            self.extra_us = new
            self.on_learned(new)
