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
