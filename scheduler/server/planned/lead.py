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

from poolpipe_common.quantile import percentile

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
