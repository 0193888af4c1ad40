"""One model's queue without Triton's batcher controls: arrival order, with the same interface as PriorityQueue
(``offer``, ``expire``, ``take_meeting``, ``next_expiry_us``), so the policies read either without asking which."""

from __future__ import annotations

from collections import deque

from scheduler.core.api import Drop, RequestRow, StepResult


class FifoQueue(deque):
    """Requests in arrival order; no size limit and no queue timeouts."""

    def offer(self, r: RequestRow) -> str | None:
        """Queue ``r``; never refused (a reason would say why, as PriorityQueue's full level does)."""
        self.append(r)
        return None

    def expire(self, now_us: float, result: StepResult) -> None:
        """Requests whose deadline has passed can only fail: dropped now."""
        while self and self[0].deadline_us <= now_us:
            result.drops.append(Drop(self.popleft(), "deadline passed while queued"))

    def take_meeting(self, n: int, completion_us: float) -> list[RequestRow]:
        """The head: up to ``n`` requests (in arrival order, the head's deadline is the earliest)."""
        return [self.popleft() for _ in range(min(n, len(self)))]

    @staticmethod
    def next_expiry_us() -> float | None:
        return None
