"""Pending requests of one model ordered by deadline: O(log n) insertion, counts and prefix cuts by bisection."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable

from scheduler.core.api import RequestRow


class DeadlineQueue:
    """Requests sorted by deadline (ties in arrival order); ``deadlines`` is the sorted key list."""

    __slots__ = ("deadlines", "requests")

    def __init__(self) -> None:
        self.deadlines: list[float] = []
        self.requests: list[RequestRow] = []

    def __len__(self) -> int:
        return len(self.deadlines)

    def append(self, r: RequestRow) -> None:
        """Insert ``r`` at its deadline's place (the name of a queue's insertion in QueueingPolicy)."""
        i = bisect_right(self.deadlines, r.deadline_us)
        self.deadlines.insert(i, r.deadline_us)
        self.requests.insert(i, r)

    def offer(self, r: RequestRow) -> str | None:
        """Queue ``r`` (never refused: the policies that keep this order honour no batcher controls)."""
        self.append(r)
        return None

    def first_at_or_after(self, t: float) -> int:
        """Index of the first request whose deadline is >= t (len when none)."""
        return bisect_left(self.deadlines, t)

    def pop_before(self, t: float) -> list[RequestRow]:
        """Remove and return the requests whose deadline is < t."""
        k = bisect_left(self.deadlines, t)
        gone = self.requests[:k]
        del self.deadlines[:k], self.requests[:k]
        return gone

    def take(self, indices: Iterable[int]) -> list[RequestRow]:
        """Remove the requests at ``indices``; returned in deadline order."""
        picked = sorted(set(indices))
        out = [self.requests[i] for i in picked]
        for i in reversed(picked):
            del self.deadlines[i], self.requests[i]
        return out
