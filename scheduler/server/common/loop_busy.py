"""How busy the event loop is: the fraction of wall time it was not waiting for I/O.

On asyncio's selector loop the wait is the selector's ``select`` call, timed here (once per loop, whoever
samples it); a loop that is runnable but waits for a core counts as busy, which is what saturation means for the
requests behind it. Other loops (uvloop) fall back to the CPU time of the loop's thread."""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from typing import Any

from prometheus_client import Counter

log = logging.getLogger("poolpipe.sidecar.loop")

SAMPLE_EVERY_S = 0.1  # the window one busy fraction covers
# A longer window is not a reading: the loop stepped nothing for that long (idle), or it covers start-up work
MAX_WINDOW_S = 1.0
# One pass of the loop (from a select's return to the next select) this long is a stall: every request that comes in
# meanwhile waits for it (a promise check's 50 ms of closed form on the loop made requests late)
STALL_S = 0.01
STALL_LOG_EVERY_S = 60.0  # the log tells of stalls at most this often; the counter has them all


class _SelectTimer:
    """Wraps a selector loop's ``select``: adds up the time spent in it and counts the passes between two selects
    that took STALL_S or longer."""

    def __init__(self, selector: Any) -> None:
        self.idle_s = 0.0
        self.stalls = 0
        self.longest_stall_s = 0.0
        self._returned: float | None = None  # the pass that installs the timer is start-up work, not a stall
        select = selector.select

        def timed(timeout: float | None = None) -> Any:
            t = time.perf_counter()
            if self._returned is not None and t - self._returned >= STALL_S:
                self.stalls += 1
                self.longest_stall_s = max(self.longest_stall_s, t - self._returned)
            try:
                return select(timeout)
            finally:
                self._returned = time.perf_counter()
                self.idle_s += self._returned - t

        selector.select = timed


_TIMERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _SelectTimer] = weakref.WeakKeyDictionary()


def _timer(loop: asyncio.AbstractEventLoop) -> _SelectTimer | None:
    timer = _TIMERS.get(loop)
    if timer is None:
        selector = getattr(loop, "_selector", None)
        if not callable(getattr(selector, "select", None)):
            return None
        timer = _TIMERS[loop] = _SelectTimer(selector)
    return timer


class LoopBusy:
    """Samples the busy fraction of ``loop`` (the running one by default) since this sampler's last sample."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._timer = _timer(loop or asyncio.get_running_loop())
        self._last_wall = time.perf_counter()
        self._last_idle = self._timer.idle_s if self._timer else 0.0
        self._last_cpu = time.thread_time()
        self._last_stalls = self._timer.stalls if self._timer else 0

    def stalls(self) -> tuple[int, float]:
        """The stalls since the last call and the longest of them in seconds (the longest since any sampler asked);
        (0, 0.0) on loops whose select cannot be timed."""
        if self._timer is None:
            return 0, 0.0
        n, self._last_stalls = self._timer.stalls - self._last_stalls, self._timer.stalls
        longest, self._timer.longest_stall_s = self._timer.longest_stall_s, 0.0
        return n, longest

    def due(self) -> bool:
        return time.perf_counter() - self._last_wall >= SAMPLE_EVERY_S

    def sample(self) -> float | None:
        """The busy fraction since the last sample, in [0, 1]; None when that was more than MAX_WINDOW_S ago."""
        wall = time.perf_counter()
        span = max(wall - self._last_wall, 1e-9)
        if self._timer is not None:
            busy = 1.0 - (self._timer.idle_s - self._last_idle) / span
            self._last_idle = self._timer.idle_s
        else:
            cpu = time.thread_time()
            busy = (cpu - self._last_cpu) / span
            self._last_cpu = cpu
        self._last_wall = wall
        return None if span > MAX_WINDOW_S else min(1.0, max(0.0, busy))


class StallLog:
    """Counts the loop's stalls (LoopBusy.stalls) and logs them, at most once per STALL_LOG_EVERY_S."""

    def __init__(self, counter: Counter) -> None:
        self.counter = counter
        self._logged = -STALL_LOG_EVERY_S

    def add(self, stalls: int, longest_s: float) -> None:
        if stalls <= 0:
            return
        self.counter.inc(stalls)
        if (now := time.monotonic()) - self._logged >= STALL_LOG_EVERY_S:
            self._logged = now
            log.warning("event=loop_stall stalls=%d longest_ms=%.1f (the event loop ran without waiting for I/O; "
                        "requests that came in meanwhile waited: find the work with py-spy dump --pid PID)", stalls,
                        longest_s * 1e3)
