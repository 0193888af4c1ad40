"""Work the sidecar hands to a child process, so that no CPU-bound step holds its event loop: the child dies with
its parent (even a SIGKILLed one), so none is left for a successor to trip over."""

from __future__ import annotations

import multiprocessing
import signal
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """This process gets ``sig`` when its parent dies (Linux: PR_SET_PDEATHSIG)."""
    try:
        import ctypes  # noqa: PLC0415

        ctypes.CDLL(None, use_errno=True).prctl(1, sig)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass  # not Linux: a pool's worker ends when it next reads from its closed queue


def _start_child(init: Callable[..., None] | None, args: tuple[Any, ...]) -> None:
    die_with_parent()
    if init is not None:
        init(*args)


def child_pool(init: Callable[..., None] | None = None, *args: Any) -> ProcessPoolExecutor:
    """One spawned worker process (no fork of a process that runs threads and an event loop) that runs ``init(*args)``
    once, then the calls submitted to it; shut it down with ``shutdown(cancel_futures=True)``."""
    return ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), initializer=_start_child,
                               initargs=(init, args))
