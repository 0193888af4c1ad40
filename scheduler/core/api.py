"""The interface between a scheduling policy and the driver that runs it (simulator or live sidecar).

Like vLLM's scheduler/engine split: the driver owns time and I/O; the policy owns decisions. The
driver calls ``enqueue`` on each arrival and ``step(now)`` after every event (arrival, completion,
or the wake-up time the last step asked for); it executes the returned dispatches, answers the
drops with an explicit error, and reports measured stage timings back with ``report``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass
class RequestRow:
    """One row of a client request, the unit the core batches and the executor runs, from the driver's ``submit``
    to its answer: the one name a row has from the front end to the core.

    The policy reads the first fields (on the core's clock); the driver and the executor the rest: which request
    the row belongs to (``call``: the sidecar's ``ClientCall``, the simulator's arrival; opaque here) and which of
    its rows it is, what it carries between the dispatches of a per-stage policy, the real deadline, the attempts
    and the client's terms. The driver enqueues a fresh copy under a new id each time (a retry, a hand-over to
    another driver); the copy keeps the call, the index and the carry."""

    id: int
    model: str
    arrival_us: float  # when it was (last) enqueued
    deadline_us: float  # absolute time by which the response must be complete (the driver's: less its margin)
    level: int = 0  # priority level (1 = highest; 0: the model has no levels), as Triton's batcher
    expires_us: float | None = None  # when its queue timeout falls (None: none), on the core's clock
    counted: bool = True  # counts towards max_queue_size (False: a further row of a client request already counted)
    call: Any = None  # the request it is a row of, whom the answer goes to (opaque to the core)
    index: int = 0  # which row of that request
    carry: Any = None  # its boundary tensors between the dispatches of a per-stage policy (``Dispatch.final`` False)
    due_us: float = math.inf  # the real deadline (the caller's; the core plans against deadline_us)
    attempts: int = 0  # how often it was enqueued: first, then per retry (a hand-over to another driver is none)
    priority: int = 0  # the request's ``priority`` parameter (0: the model's default level)
    timeout_us: int = 0  # its ``timeout`` parameter (a queue timeout, where the model's queue policy allows it)


@dataclass(frozen=True)
class StageAssignment:
    stage: int
    vgpu: str
    start_us: float  # reserved compute interval on the vGPU
    end_us: float
    # reserved NIC interval for the input transfer (None: same server or stage 0)
    transfer_start_us: float | None = None
    transfer_end_us: float | None = None


@dataclass
class Dispatch:
    id: int
    model: str
    pipeline_id: str
    requests: list[RequestRow]
    stages: list[StageAssignment]
    completion_us: float  # predicted
    # False: the batch continues in a later Dispatch of the same requests (per-stage policies such as
    # `reactive`); the driver reports the stages and does not complete the requests.
    final: bool = True
    # True: stage/transfer start times are reservations; an executor must not run ahead of them
    # (False: run as soon as the input and the vGPU are free, in arrival order).
    reserved: bool = True

    @property
    def batch(self) -> int:
        return len(self.requests)


@dataclass(frozen=True)
class Drop:
    request: RequestRow
    reason: str  # e.g. "deadline cannot be met"


@dataclass
class StepResult:
    dispatches: list[Dispatch] = field(default_factory=list)
    drops: list[Drop] = field(default_factory=list)
    wake_at_us: float | None = None  # call step() again at this time even if nothing happens


class Scheduler(Protocol):
    """A data-plane policy over one Topology (all models)."""

    def enqueue(self, request: RequestRow) -> str | None:
        """Queue ``request``; a reason when it is refused at once (its priority level's queue is full)."""

    def step(self, now_us: float) -> StepResult: ...

    def report(self, dispatch_id: int, stage: int, start_us: float, end_us: float) -> None:
        """Measured start/end of one stage of a dispatched batch (feedback correction)."""

    def advance(self, dispatch_id: int, stage: int, ready_us: float) -> StageAssignment | None:
        """The stage's input is ready at ``ready_us`` (the stages before it ran faster than reserved): a policy
        that reserves ahead moves the stage's reservation earlier when its vGPU is free; the new one, or None."""

    def release(self, dispatch_id: int, now_us: float) -> None:
        """The dispatch will not run on (every caller of its batch is gone): give back what it holds from
        ``now_us`` on (reservations, outstanding work); stages that already started keep theirs."""

    def set_vgpu_up(self, vgpu_id: str, up: bool, now_us: float) -> None:
        """Take a vGPU out of (or back into) service; its future reservations are released."""

    def queue_lengths(self) -> dict[str, int]:
        """Requests waiting per model (not yet dispatched)."""

    def set_executor_saturated(self, saturated: bool) -> None:
        """The executor (not the vGPUs) limits the rate, or no longer does (scheduler.core.executor_load)."""

    @property
    def probe_calls(self) -> int:
        """probe() calls so far (0 for policies that do not probe reservations)."""
