"""What every policy shares: per-model FIFO queues (a PriorityQueue where the model sets Triton's batcher
controls), dispatch ids, expiry drops and decision counters."""

from __future__ import annotations

from collections import deque

from scheduler.core.api import Drop, RequestRow, StageAssignment, StepResult
from scheduler.core.policies.fifo_queue import FifoQueue
from scheduler.core.policies.priority_queue import PriorityQueue
from scheduler.core.topology import Topology

ModelQueue = FifoQueue | PriorityQueue  # what the policies read a model's requests from
EPS_US = 0.5  # timing slack below which "wait until t" means "now"


class QueueingPolicy:
    """Base of the policies: requests wait in one FIFO per model until a policy dispatches or drops them."""

    name = "base"
    # whether the policy serves its model queues in queue order, so that priority levels and queue policies apply
    honours_batcher = True

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        controls = {m: c for m, c in topology.batcher.items() if c.active and m in topology.pipelines}
        if controls and not self.honours_batcher:
            raise ValueError(f"model {next(iter(controls))!r} sets batcher controls (priority levels, queue policy), "
                             f"which policy {self.name!r} does not honour: use ppipe, fifs or elsa")
        self.queues: dict[str, ModelQueue] = {
            m: PriorityQueue(controls[m]) if m in controls else self.new_queue()  # type: ignore[misc]
            for m in topology.pipelines}
        self._next_dispatch = 1
        self._unknown: list[RequestRow] = []
        self.executor_saturated = False  # the executor, not the vGPUs, limits the rate (set_executor_saturated)

    @staticmethod
    def new_queue() -> FifoQueue:
        """One model's queue (FIFO here; a policy may keep another order behind the same interface)."""
        return FifoQueue()

    @property
    def probe_calls(self) -> int:
        """probe() calls so far (0 for policies that do not probe reservations)."""
        return 0

    def release(self, dispatch_id: int, now_us: float) -> None:
        """An abandoned dispatch gives back what it holds (nothing, unless a policy keeps books of dispatches)."""

    def advance(self, dispatch_id: int, stage: int, ready_us: float) -> StageAssignment | None:
        """A stage's input is ready at ``ready_us``; policies that reserve ahead may move it earlier (None: kept)."""
        return None

    def queue_lengths(self) -> dict[str, int]:
        return {m: len(q) for m, q in self.queues.items()}

    def set_executor_saturated(self, saturated: bool) -> None:
        """The executor reached (or left) saturation (scheduler.core.executor_load); policies that hold partial
        batches may hold them for it too."""
        self.executor_saturated = saturated

    def new_dispatch_id(self) -> int:
        i = self._next_dispatch
        self._next_dispatch += 1
        return i

    def enqueue(self, request: RequestRow) -> str | None:
        q = self.queues.get(request.model)
        if q is None:
            self._unknown.append(request)
            return None
        return q.offer(request)

    def take_unknown(self, result: StepResult) -> None:
        for r in self._unknown:
            result.drops.append(Drop(r, f"model {r.model!r} is not served by this topology"))
        self._unknown.clear()

    @staticmethod
    def drop_expired(q: ModelQueue, now_us: float, result: StepResult) -> None:
        """Requests whose deadline has passed can only fail: answer them now (and apply the queue timeouts)."""
        q.expire(now_us, result)

    @staticmethod
    def take(q: deque[RequestRow], n: int) -> list[RequestRow]:
        return [q.popleft() for _ in range(n)]

    @staticmethod
    def take_meeting(q: ModelQueue, n: int, completion_us: float) -> list[RequestRow]:
        """A batch of up to ``n`` that completes at ``completion_us``: the head of a FIFO queue; from a priority
        queue, those of its first requests whose deadline that meets (a lower level's may be earlier)."""
        return q.take_meeting(n, completion_us)

    def queue_wake(self, wake: float | None) -> float | None:
        """``wake`` or, when sooner, the next queue timeout of any model (to apply it on time)."""
        for q in self.queues.values():
            if q:
                t = q.next_expiry_us()
                if t is not None and (wake is None or t < wake):
                    wake = t
        return wake
