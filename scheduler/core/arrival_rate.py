"""Recent arrival rate per model, from the arrival times the core sees (no clock of its own).

The policy uses it to decide whether waiting can fill a batch: holding a lone request until the last
moment its deadline allows only pays when more requests are expected before then.
"""

from __future__ import annotations

from collections import deque


class ArrivalRate:
    """Arrivals per µs over the last ``window`` arrivals that lie within ``horizon_us`` of the newest.

    A stream silent for ``stale_after`` of its own mean gaps has stopped (a Poisson stream stays that silent
    with probability e^-stale_after): a closed-loop client that waits for its answer before sending the next
    request shows a high rate that holding its request would never see, so the rate is then 0.
    """

    def __init__(self, window: int = 32, horizon_us: float = 2_000_000.0, stale_after: float = 5.0) -> None:
        self.window = window
        self.horizon_us = horizon_us
        self.stale_after = stale_after
        self._times: deque[float] = deque(maxlen=window)

    def arrived(self, t_us: float) -> None:
        self._times.append(t_us)

    def per_us(self, now_us: float) -> float:
        """0 when fewer than two arrivals are recent or the stream is stale; else (arrivals - 1) over their
        time span (at least the time since the newest, so a rate decays when arrivals stop)."""
        gap = self._mean_gap(now_us)
        if gap is None:
            return 0.0
        times = self._times
        return (len(times) - 1) / max(times[-1] - times[0], now_us - times[-1], 1.0)

    def stale_at_us(self, now_us: float) -> float:
        """When the stream counts as stopped if nothing arrives before (inf while no rate is known)."""
        gap = self._mean_gap(now_us)
        return float("inf") if gap is None else self._times[-1] + self.stale_after * gap

    def _mean_gap(self, now_us: float) -> float | None:
        """The mean gap between the recent arrivals; None with fewer than two or once the stream is stale."""
        times = self._times
        while times and times[0] < now_us - self.horizon_us:
            times.popleft()
        if len(times) < 2:
            return None
        gap = max(times[-1] - times[0], 1.0) / (len(times) - 1)
        # the same sum stale_at_us returns: ``now - last >= k * gap`` can be false at the instant ``last + k * gap``
        # rounds to, and a core that waits until the stream is stale would be woken there again and again
        return None if now_us >= times[-1] + self.stale_after * gap else gap
