"""The stand-in for a policy that failed (scheduler.core.driver.Driver.retire): it decides nothing and refuses every
request, so that the batches a retired driver still has in flight complete without the failed policy."""

from __future__ import annotations

from typing import Any

from scheduler.core.api import RequestRow, StepResult

POLICY_FAILED = "the scheduling policy failed"  # why a retired driver refuses a request (a retry)


class RetiredPolicy:
    name = "retired"
    probe_calls = 0

    def enqueue(self, request: RequestRow) -> str | None:
        return POLICY_FAILED

    def step(self, now_us: float) -> StepResult:
        return StepResult()

    def report(self, *args: Any) -> None: ...

    def advance(self, *args: Any) -> None: ...

    def release(self, *args: Any) -> None: ...

    def set_vgpu_up(self, *args: Any) -> None: ...

    def set_executor_saturated(self, *args: Any) -> None: ...

    def queue_lengths(self) -> dict[str, int]:
        return {}
