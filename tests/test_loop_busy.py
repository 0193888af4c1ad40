"""scheduler/server/common/loop_busy.py: the event loop's busy fraction, its stalls (counted and logged), and the
driver's saturated state it feeds (the ppipe policy holds fuller batches while the sidecar's loop is saturated)."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
from prometheus_client import CollectorRegistry, Counter

from scheduler.core import make_scheduler
from scheduler.core.driver import Driver
from scheduler.server.common.loop_busy import MAX_WINDOW_S, STALL_S, LoopBusy, StallLog
from tests.test_sched_core import one_stage


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_a_loop_that_computes_is_busy_and_one_that_waits_is_not():
    async def main() -> tuple[float, float, float]:
        busy = LoopBusy()
        await asyncio.sleep(0.2)  # waiting in the selector
        idle = busy.sample()
        _spin(0.2)  # holding the loop
        spun = busy.sample()
        again = LoopBusy()  # a second sampler of the same loop (a reloaded plan) reads the same selector
        await asyncio.sleep(0.05)
        _spin(0.15)
        return idle, spun, again.sample()

    idle, spun, mixed = asyncio.run(main())
    assert idle < 0.3 and spun > 0.9 and 0.5 < mixed < 0.95


def test_a_window_longer_than_a_second_is_not_a_reading():
    """Start-up work or a loop that stepped nothing for that long says nothing about saturation."""

    async def main() -> tuple[float | None, float | None]:
        busy = LoopBusy()
        _spin(0.05)
        await asyncio.sleep(MAX_WINDOW_S + 0.1)
        first = busy.sample()
        _spin(0.1)
        return first, busy.sample()

    first, second = asyncio.run(main())
    assert first is None and second is not None and second > 0.9


def test_a_pass_of_the_loop_that_holds_it_is_a_stall_counted_and_logged_once_a_minute(
        caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> list[tuple[int, float]]:
        busy = LoopBusy()
        await asyncio.sleep(0)
        time.sleep(3 * STALL_S)  # one callback holding the loop (as 50 ms of closed form did)
        await asyncio.sleep(0)
        first = busy.stalls()
        time.sleep(2 * STALL_S)
        await asyncio.sleep(0)
        time.sleep(4 * STALL_S)
        await asyncio.sleep(0)
        return [first, busy.stalls(), busy.stalls()]

    counter = Counter("stalls", "stalls", registry=(registry := CollectorRegistry()))
    log = StallLog(counter)
    caplog.set_level(logging.WARNING, "poolpipe.sidecar.loop")
    reads = asyncio.run(main())
    for n, longest in reads:
        log.add(n, longest)
    (n1, l1), (n2, l2), (n3, l3) = reads
    assert n1 >= 1 and l1 >= 3 * STALL_S and n2 >= 2 and l2 >= 4 * STALL_S and (n3, l3) == (0, 0.0)
    assert registry.get_sample_value("stalls_total") == n1 + n2
    lines = [r.getMessage() for r in caplog.records if "event=loop_stall" in r.getMessage()]
    assert len(lines) == 1 and f"stalls={n1} " in lines[0] and "py-spy dump" in lines[0]


def test_the_driver_tells_the_policy_when_its_executor_saturates_and_recovers():
    topo = one_stage({1: 10.0, 2: 15.0}, 2, 10_000.0)
    policy = make_scheduler("ppipe", topo)
    drv = Driver(policy, topo, executor=None, callers=None)  # type: ignore[arg-type]  # no dispatch reaches it here
    assert not any(drv.executor_busy(0.7) for _ in range(20)) and not policy.executor_saturated
    assert [drv.executor_busy(0.95) for _ in range(20)].count(True) == 1  # changed once: the caller steps again
    assert policy.executor_saturated
    assert not any(drv.executor_busy(0.6) for _ in range(20))  # not yet: holding lowers the load measured
    assert policy.executor_saturated
    assert [drv.executor_busy(0.3) for _ in range(20)].count(True) == 1 and not policy.executor_saturated
