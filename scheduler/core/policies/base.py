"""What every policy shares: per-model FIFO queues, dispatch ids, expiry drops and decision counters."""

from __future__ import annotations

from collections import deque

from scheduler.core.api import Drop, Request, StepResult
from scheduler.core.topology import Topology

EPS_US = 0.5  # timing slack below which "wait until t" means "now"


class QueueingPolicy:
    """Base of the policies: requests wait in one FIFO per model until a policy dispatches or drops them."""

    name = "base"

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self.queues: dict[str, deque[Request]] = {m: self.new_queue() for m in topology.pipelines}
        self._next_dispatch = 1
        self._unknown: list[Request] = []

    @staticmethod
    def new_queue() -> deque[Request]:
        """One model's queue (FIFO here; a policy may keep another order behind ``append`` and ``len``)."""
        return deque()

    @property
    def probe_calls(self) -> int:
        """probe() calls so far (0 for policies that do not probe reservations)."""
        return 0

    def release(self, dispatch_id: int, now_us: float) -> None:
        """An abandoned dispatch gives back what it holds (nothing, unless a policy keeps books of dispatches)."""

    def queue_lengths(self) -> dict[str, int]:
        return {m: len(q) for m, q in self.queues.items()}

    def new_dispatch_id(self) -> int:
        i = self._next_dispatch
        self._next_dispatch += 1
        return i

    def enqueue(self, request: Request) -> None:
        q = self.queues.get(request.model)
        if q is None:
            self._unknown.append(request)
        else:
            q.append(request)

    def take_unknown(self, result: StepResult) -> None:
        for r in self._unknown:
            result.drops.append(Drop(r, f"model {r.model!r} is not served by this topology"))
        self._unknown.clear()

    @staticmethod
    def drop_expired(q: deque[Request], now_us: float, result: StepResult) -> None:
        """Requests whose deadline has passed can only fail: answer them now."""
        while q and q[0].deadline_us <= now_us:
            result.drops.append(Drop(q.popleft(), "deadline passed while queued"))

    @staticmethod
    def take(q: deque[Request], n: int) -> list[Request]:
        return [q.popleft() for _ in range(n)]
