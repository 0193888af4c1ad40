"""The sidecar's event loop choice (POOLPIPE_EVENT_LOOP): asyncio by default, uvloop on request, a clear error."""

from __future__ import annotations

import asyncio

import pytest

from scheduler.server.common import event_loop


async def _loop_type() -> str:
    return type(asyncio.get_running_loop()).__module__


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
