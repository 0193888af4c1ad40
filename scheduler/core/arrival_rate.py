"""Recent arrival rate per model, from the arrival times the core sees (no clock of its own).

The policy uses it to decide whether waiting can fill a batch: holding a lone request until the last
moment its deadline allows only pays when more requests are expected before then.
"""

from __future__ import annotations

from collections import deque


class ArrivalRate:
    """Arrivals per µs over the last ``window`` arrivals that lie within ``horizon_us`` of the newest."""

    def __init__(self, window: int = 32, horizon_us: float = 2_000_000.0) -> None:
        self.window = window
        self.horizon_us = horizon_us
        self._times: deque[float] = deque(maxlen=window)

    def arrived(self, t_us: float) -> None:
        self._times.append(t_us)

    def per_us(self, now_us: float) -> float:
        """0 when fewer than two arrivals are recent; else (arrivals - 1) over their time span (at least
        the time since the newest, so a rate decays when arrivals stop)."""
        times = self._times
        while times and times[0] < now_us - self.horizon_us:
            times.popleft()
        if len(times) < 2:
            return 0.0
        span = max(times[-1] - times[0], now_us - times[-1], 1.0)
        return (len(times) - 1) / span
