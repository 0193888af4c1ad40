"""scheduler/server/common/loop_busy.py: the event loop's busy fraction, and the driver's saturated state it
feeds (the ppipe policy holds fuller batches while the sidecar's loop is saturated)."""

from __future__ import annotations

import asyncio
import time

from scheduler.core import make_scheduler
from scheduler.core.driver import Driver
from scheduler.server.common.loop_busy import LoopBusy
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


def test_the_driver_tells_the_policy_when_its_executor_saturates_and_recovers():
    topo = one_stage({1: 10.0, 2: 15.0}, 2, 10_000.0)
    policy = make_scheduler("ppipe", topo)
    drv = Driver(policy, topo, executor=None)  # type: ignore[arg-type]  # no dispatch reaches it here
    assert not drv.executor_busy(0.7) and not policy.executor_saturated
    assert drv.executor_busy(0.95) and policy.executor_saturated  # changed: the caller steps again
    assert not drv.executor_busy(0.6) and policy.executor_saturated  # not yet: holding lowers the load measured
    assert drv.executor_busy(0.4) and not policy.executor_saturated
