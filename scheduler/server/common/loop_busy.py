"""How busy the event loop is: the fraction of wall time it was not waiting for I/O.

On asyncio's selector loop the wait is the selector's ``select`` call, timed here (once per loop, whoever
samples it); a loop that is runnable but waits for a core counts as busy, which is what saturation means for the
requests behind it. Other loops (uvloop) fall back to the CPU time of the loop's thread."""

from __future__ import annotations

import asyncio
import time
import weakref
from typing import Any

SAMPLE_EVERY_S = 0.1  # the window one busy fraction covers
# A longer window is not a reading: the loop stepped nothing for that long (idle), or it covers start-up work
MAX_WINDOW_S = 1.0


class _SelectTimer:
    """Wraps a selector loop's ``select`` and adds up the time spent in it."""

    def __init__(self, selector: Any) -> None:
        self.idle_s = 0.0
        select = selector.select

        def timed(timeout: float | None = None) -> Any:
            t = time.perf_counter()
            try:
                return select(timeout)
            finally:
                self.idle_s += time.perf_counter() - t

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
