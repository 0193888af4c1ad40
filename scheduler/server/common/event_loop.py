"""The sidecar's event loop: asyncio's own by default, on a selector whose timed waits end on time
(precise_timers: asyncio's epoll waits end up to 2 ms late, and the sidecar's sends and batch starts are timers);
``POOLPIPE_EVENT_LOOP=uvloop`` runs it on uvloop (when installed). uvloop did not measure reliably faster here:
grpc.aio's own Cython code and its polling thread, not the loop, take most of a request's time (docs/serving.md,
"Where a request's time goes"), and its timers have asyncio's millisecond resolution."""

from __future__ import annotations

import asyncio
import gc
import os
from collections.abc import Coroutine
from typing import Any, TypeVar

from scheduler.server.common import precise_timers

T = TypeVar("T")
CHOICES = ("asyncio", "uvloop")


def loop_kind(choice: str | None = None) -> str:
    """The loop ``choice`` names (default: $POOLPIPE_EVENT_LOOP, else asyncio); a ValueError says what is wrong."""
    kind = (choice or os.environ.get("POOLPIPE_EVENT_LOOP") or "asyncio").lower()
    if kind not in CHOICES:
        raise ValueError(f"POOLPIPE_EVENT_LOOP={kind}: choose one of {', '.join(CHOICES)}")
    if kind == "uvloop":
        try:
            import uvloop  # noqa: F401, PLC0415
        except ImportError:
            raise ValueError("POOLPIPE_EVENT_LOOP=uvloop but uvloop is not installed (pip install uvloop)") from None
    return kind


def new_loop() -> asyncio.AbstractEventLoop:
    """asyncio's loop on the precise-timer selector where the platform has one, else asyncio's default."""
    sel = precise_timers.selector()
    return asyncio.new_event_loop() if sel is None else asyncio.SelectorEventLoop(sel)


def run(main: Coroutine[Any, Any, T], choice: str | None = None) -> T:
    """``asyncio.run(main)`` on the chosen loop."""
    if loop_kind(choice) == "uvloop":
        import uvloop  # noqa: PLC0415
        return uvloop.run(main)
    with asyncio.Runner(loop_factory=new_loop) as runner:
        return runner.run(main)


def freeze_heap() -> None:
    """Move everything alive now (the started sidecar: modules, the plan, channels, metrics) out of the cyclic
    collector's reach. A full collection otherwise walks that whole heap on the event loop, a pause of tens of
    milliseconds every few seconds under load that answers a burst of requests late or sheds them. Called again
    after a reload: the old plan's objects are unfrozen first, so its cycles are collected once instead of kept
    for good, and the new plan's join the frozen heap."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()
