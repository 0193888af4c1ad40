"""One model's queue under Triton's batcher controls: a FIFO per priority level (1 first), each with its queue
policy (size limit, timeout and its action), read by the policies like a deque (``q[0]``, ``popleft``, ``len``).

Order, as Triton's PriorityQueue: level by level; inside a level its unexpired requests in arrival order, then
those whose DELAY timeout expired. A REJECT timeout drops the request with Triton's "Request timeout expired"; a
full level refuses a new request with "Exceeds maximum queue size"; a request whose deadline passed is dropped
like in any queue. The size limit counts client requests, as Triton's: a request's further rows
(``RequestRow.counted`` False) ride on its first.
"""

from __future__ import annotations

from collections import deque

from poolpipe_common.batcher import QUEUE_FULL, QUEUE_TIMEOUT, BatcherControls
from scheduler.core.api import Drop, RequestRow, StepResult


class _Level:
    __slots__ = ("queue", "delayed", "max_size", "delay", "next_expiry", "entries")

    def __init__(self, max_size: int, delay: bool) -> None:
        self.queue: deque[RequestRow] = deque()
        self.delayed: deque[RequestRow] = deque()
        self.max_size = max_size
        self.delay = delay
        self.next_expiry = float("inf")  # the earliest queue timeout among ``queue``
        self.entries = 0  # client requests queued (what max_size limits)

    def __len__(self) -> int:
        return len(self.queue) + len(self.delayed)


class PriorityQueue:
    """Requests of one model by priority level; see the module docstring."""

    __slots__ = ("levels", "_order", "_n")

    def __init__(self, controls: BatcherControls) -> None:
        n = controls.priority_levels
        self.levels = {lvl: _Level(controls.policy(lvl).max_queue_size, controls.policy(lvl).timeout_action == "DELAY")
                       for lvl in (range(1, n + 1) if n else (0,))}
        self._order = sorted(self.levels)
        self._n = 0

    def __len__(self) -> int:
        return self._n

    def __bool__(self) -> bool:
        return self._n > 0

    def __iter__(self):  # type: ignore[no-untyped-def]
        for lvl in self._order:
            level = self.levels[lvl]
            yield from level.queue
            yield from level.delayed

    def __getitem__(self, i: int) -> RequestRow:
        if i != 0:
            raise IndexError("a priority queue reads only its head")
        for lvl in self._order:
            level = self.levels[lvl]
            if level.queue:
                return level.queue[0]
            if level.delayed:
                return level.delayed[0]
        raise IndexError("empty queue")

    def offer(self, r: RequestRow) -> str | None:
        """Queue ``r`` at its level (``r.level``); Triton's refusal when that level is full."""
        level = self.levels.get(r.level)
        if level is None:  # not a level of this queue (the driver resolves levels): the lowest
            level = self.levels[self._order[-1]]
        if r.counted:
            if level.max_size and level.entries >= level.max_size:
                return QUEUE_FULL
            level.entries += 1
        level.queue.append(r)
        if r.expires_us is not None and r.expires_us < level.next_expiry:
            level.next_expiry = r.expires_us
        self._n += 1
        return None

    def append(self, r: RequestRow) -> None:
        self.offer(r)

    def popleft(self) -> RequestRow:
        for lvl in self._order:
            level = self.levels[lvl]
            if level.queue or level.delayed:
                return self._gone(level, level.queue.popleft() if level.queue else level.delayed.popleft())
        raise IndexError("pop from an empty queue")

    def next_expiry_us(self) -> float | None:
        """When the next queue timeout falls (to wake the driver then), or None."""
        t = min((lv.next_expiry for lv in self.levels.values()), default=float("inf"))
        return None if t == float("inf") else t

    def expire(self, now_us: float, result: StepResult) -> None:
        """Apply the queue timeouts due by ``now_us`` and drop the requests whose deadline passed."""
        for level in self.levels.values():
            if level.next_expiry <= now_us:
                self._timeouts(level, now_us, result)
            for q in (level.queue, level.delayed):
                while q and q[0].deadline_us <= now_us:
                    result.drops.append(Drop(self._gone(level, q.popleft()), "deadline passed while queued"))

    def _timeouts(self, level: _Level, now_us: float, result: StepResult) -> None:
        kept: deque[RequestRow] = deque()
        nxt = float("inf")
        for r in level.queue:
            if r.expires_us is None or r.expires_us > now_us:
                kept.append(r)
                if r.expires_us is not None and r.expires_us < nxt:
                    nxt = r.expires_us
            elif level.delay:
                level.delayed.append(r)
            else:
                result.drops.append(Drop(self._gone(level, r), QUEUE_TIMEOUT))
        level.queue = kept
        level.next_expiry = nxt

    def take_meeting(self, n: int, completion_us: float) -> list[RequestRow]:
        """Up to ``n`` requests in queue order whose deadline ``completion_us`` meets (a batch reserved to end then);
        the others stay for a later batch or to be shed."""
        out: list[RequestRow] = []
        for lvl in self._order:
            level = self.levels[lvl]
            for name in ("queue", "delayed"):
                q: deque[RequestRow] = getattr(level, name)
                if len(out) >= n or not q:
                    continue
                rest: deque[RequestRow] = deque()
                while q:
                    r = q.popleft()
                    if len(out) < n and r.deadline_us >= completion_us:
                        out.append(self._gone(level, r))
                    else:
                        rest.append(r)
                setattr(level, name, rest)
        return out

    def _gone(self, level: _Level, r: RequestRow) -> RequestRow:
        """Account ``r`` leaving ``level`` (dispatched or dropped)."""
        self._n -= 1
        if r.counted:
            level.entries -= 1
        return r
