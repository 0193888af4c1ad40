"""An asyncio selector whose timed waits end when they should, for the sidecar's timers.

Why: asyncio waits for its next timer in ``epoll_wait``, whose timeout is whole milliseconds. The selector rounds
the wait up to the next millisecond, the kernel may end it a little early, and the loop then waits another
rounded-up millisecond: on this project's machines a 12.4 ms ``asyncio.sleep`` ended 1.8 ms late (median). The
sidecar's executor sends each stage at its reserved start less the stage's lead, and its scheduler wakes for a
batch's latest start: every such timer was late by that much, so each cross-host hop of an idle pipeline cost
about 1.5 ms more than its reservation, time the scheduler and the simulator never planned.

How: a ``timerfd`` (nanosecond timeouts, CLOCK_MONOTONIC like the loop's clock) sits in the epoll set; each wait
with a timeout arms it for that timeout, so ``epoll_wait`` returns when it fires. Waits without a timeout and
polls (timeout 0, a busy loop) arm nothing, and disarm nothing either: the timerfd is edge-triggered, so an expiry
wakes one wait and is then forgotten (never read; arming again clears it), and a timer armed for an earlier wait
that fires during a later one ends that wait once, early, which the loop takes as a wake-up with nothing due. A
disarm per untimed wait cost a syscall through ctypes on most loop iterations (a profile of the sidecar at low
load: 3.5 % of its event loop's busy samples). Linux only (timerfd through libc); elsewhere :func:`selector`
returns None and the loop keeps asyncio's own selector.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import math
import os
import select
import selectors
import sys

CLOCK_MONOTONIC = 1
TFD_NONBLOCK = os.O_NONBLOCK
TFD_CLOEXEC = os.O_CLOEXEC


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.timerfd_create.argtypes = (ctypes.c_int, ctypes.c_int)
        libc.timerfd_settime.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.POINTER(_Itimerspec),
                                         ctypes.POINTER(_Itimerspec))
    except (OSError, AttributeError):
        return None
    return libc


class TimerfdEpollSelector(selectors.EpollSelector):
    """An EpollSelector whose ``select(timeout)`` returns within tens of microseconds of ``timeout`` (a timerfd in
    its epoll set), not up to two milliseconds late."""

    def __init__(self, libc: ctypes.CDLL) -> None:
        super().__init__()
        self._libc = libc
        self._tfd = libc.timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC)
        if self._tfd < 0:
            err = ctypes.get_errno()
            super().close()
            raise OSError(err, f"timerfd_create: {os.strerror(err)}")
        # not in the key map: select() never reports it; edge-triggered: an unread expiry does not end later waits
        self._selector.register(self._tfd, select.EPOLLIN | select.EPOLLET)
        self._spec = _Itimerspec()

    def _arm(self, timeout: float) -> None:
        sec = math.floor(timeout)
        self._spec.it_value.tv_sec = sec
        self._spec.it_value.tv_nsec = max(int((timeout - sec) * 1e9), 1)  # 0 would disarm it
        self._libc.timerfd_settime(self._tfd, 0, ctypes.byref(self._spec), None)

    def select(self, timeout: float | None = None) -> list:
        if timeout is not None and timeout > 0:
            self._arm(timeout)  # re-arming also clears an expiry not yet read
        return super().select(timeout)

    def close(self) -> None:
        if self._tfd >= 0:
            os.close(self._tfd)
            self._tfd = -1
        super().close()


def selector() -> selectors.BaseSelector | None:
    """A TimerfdEpollSelector where the platform has timerfd (Linux), else None."""
    libc = _libc()
    if libc is None:
        return None
    try:
        return TimerfdEpollSelector(libc)
    except OSError:
        return None
