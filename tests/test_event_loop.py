"""The sidecar's event loop choice (POOLPIPE_EVENT_LOOP): asyncio by default, uvloop on request, a clear error."""

from __future__ import annotations

import asyncio
import selectors
import socket
import threading
import time

import pytest

from scheduler.server.common import event_loop, precise_timers


async def _loop_type() -> str:
    return type(asyncio.get_running_loop()).__module__


async def _timer_lateness_ms(wait_s: float, n: int) -> list[float]:
    late = []
    for _ in range(n):
        t = time.monotonic()
        await asyncio.sleep(wait_s)
        late.append((time.monotonic() - t - wait_s) * 1e3)
    return late


@pytest.mark.skipif(precise_timers.selector() is None, reason="no timerfd on this platform")
def test_the_sidecars_loop_ends_timed_waits_on_time_where_asyncios_own_ends_them_late() -> None:
    """The loop serve runs (event_loop.run) wakes for a timer within a fraction of a millisecond; asyncio's own
    epoll selector rounds each wait up to whole milliseconds (about 1.8 ms late for 12.4 ms waits here)."""
    ours = sorted(event_loop.run(_timer_lateness_ms(0.0124, 30)))
    theirs = sorted(asyncio.run(_timer_lateness_ms(0.0124, 30)))
    assert min(ours) >= 0.0  # never early: a send must not run ahead of its reservation
    assert ours[len(ours) // 2] < 0.6, ours
    assert ours[len(ours) // 2] < theirs[len(theirs) // 2]


@pytest.mark.skipif(precise_timers.selector() is None, reason="no timerfd on this platform")
def test_a_fired_timer_does_not_end_the_waits_after_it() -> None:
    """The timerfd's expiry is never read (edge-triggered): a wait without a timeout after it still waits for I/O."""
    sel = precise_timers.selector()
    r, w = socket.socketpair()
    try:
        sel.register(r, selectors.EVENT_READ)
        t = time.monotonic()
        assert sel.select(0.002) == [] and time.monotonic() - t >= 0.002
        threading.Timer(0.05, lambda: w.send(b"x")).start()
        t = time.monotonic()
        events = sel.select(None)
        assert time.monotonic() - t >= 0.04
        assert [key.fileobj for key, _ in events] == [r]
        assert sel.select(0) == [(sel.get_key(r), selectors.EVENT_READ)]  # a poll sees the socket, not the timer
    finally:
        sel.close()
        r.close()
        w.close()


def test_default_is_asyncio_and_bad_values_say_what_to_choose(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("POOLPIPE_EVENT_LOOP", raising=False)
    assert event_loop.loop_kind() == "asyncio"
    assert event_loop.run(_loop_type()).startswith("asyncio")
    monkeypatch.setenv("POOLPIPE_EVENT_LOOP", "tokio")
    with pytest.raises(ValueError, match="choose one of asyncio, uvloop"):
        event_loop.loop_kind()


def test_uvloop_on_request(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("uvloop", reason="uvloop is optional; without it the choice is refused (tested above)")
    monkeypatch.setenv("POOLPIPE_EVENT_LOOP", "uvloop")
    assert event_loop.run(_loop_type()).startswith("uvloop")


def test_freeze_heap_keeps_the_started_heap_from_full_collections_and_frees_a_reloads_cycles() -> None:
    import gc
    import weakref

    class Node:
        pass

    old = Node()
    old.self = old  # a cycle: only the cyclic collector frees it
    gone = weakref.ref(old)
    try:
        event_loop.freeze_heap()
        assert gc.get_freeze_count() > 0 and gone() is not None
        del old
        gc.collect()
        assert gone() is not None  # frozen: a full collection no longer walks (or frees) the started heap
        event_loop.freeze_heap()  # as after a reload: the old plan's cycles go, the rest is frozen again
        assert gone() is None and gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
