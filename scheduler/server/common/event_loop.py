"""The sidecar's event loop: asyncio's own by default; ``POOLPIPE_EVENT_LOOP=uvloop`` runs it on uvloop (when
installed). uvloop did not measure reliably faster here: grpc.aio's own Cython code and its polling thread, not
the loop, take most of a request's time (docs/serving.md, "Where a request's time goes")."""

from __future__ import annotations

import asyncio
import gc
import os
from collections.abc import Coroutine
from typing import Any, TypeVar

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


def run(main: Coroutine[Any, Any, T], choice: str | None = None) -> T:
    """``asyncio.run(main)`` on the chosen loop."""
    if loop_kind(choice) == "uvloop":
        import uvloop  # noqa: PLC0415
        return uvloop.run(main)
    return asyncio.run(main)


def freeze_heap() -> None:
    """Move everything alive now (the started sidecar: modules, the plan, channels, metrics) out of the cyclic
    collector's reach. A full collection otherwise walks that whole heap on the event loop, a pause of tens of
    milliseconds every few seconds under load that answers a burst of requests late or sheds them. Called again
    after a reload: the old plan's objects are unfrozen first, so its cycles are collected once instead of kept
    for good, and the new plan's join the frozen heap."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()
