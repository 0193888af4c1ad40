"""Per-resource reservation tables: sorted, non-overlapping busy intervals [start, end) with owner keys.

One table per vGPU and per NIC direction. The queries the policies need are "earliest slot at or
after t of length d that is free on all of these tables" and "reserve"; feedback correction moves or
trims an interval to what was measured, pushing later intervals back if it overran.
Owner keys are ints (see ``owner_key``) so that tables stay plain lists and lookups stay cheap.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from typing import Sequence

COMPUTE, TRANSFER = 0, 1
# Overlap ``reserve`` tolerates (µs): times are floats on a monotonic clock in µs, whose ulp after days of
# uptime is 1e-5..1e-3 µs; arithmetic on them can end a slot that ulp past where the next one starts.
OVERLAP_TOLERANCE_US = 0.01


def owner_key(dispatch_id: int, stage: int, kind: int = COMPUTE) -> int:
    """A unique int per (dispatch, stage, compute|transfer) interval."""
    return (dispatch_id << 8) | (stage << 1) | kind


class ResourceTable:
    """Busy intervals of one resource, sorted by start; intervals never overlap (ends are sorted too)."""

    __slots__ = ("name", "starts", "ends", "owners")

    def __init__(self, name: str = "") -> None:
        self.name = name
        self.starts: list[float] = []
        self.ends: list[float] = []
        self.owners: list[int] = []

    def __len__(self) -> int:
        return len(self.starts)

    def intervals(self) -> list[tuple[float, float, int]]:
        return list(zip(self.starts, self.ends, self.owners))

    def earliest(self, t: float, d: float) -> float:
        """Earliest s >= t such that [s, s + d) overlaps no interval of this table."""
        ends = self.ends
        i = bisect_right(ends, t)
        n = len(ends)
        if i == n:
            return t
        starts = self.starts
        while i < n and starts[i] < t + d:
            t = ends[i]
            i += 1
        return t

    def reserve(self, s: float, e: float, owner: int) -> None:
        """Insert [s, e); the caller found it free (checked: a clash is a bug in the caller)."""
        if e <= s:
            return
        i = bisect_left(self.starts, s)
        tol = OVERLAP_TOLERANCE_US
        if (i > 0 and self.ends[i - 1] > s + tol) or (i < len(self.starts) and self.starts[i] < e - tol):
            raise ValueError(f"reservation [{s:.1f}, {e:.1f}) on {self.name} overlaps an existing one")
        self.starts.insert(i, s)
        self.ends.insert(i, e)
        self.owners.insert(i, owner)

    def find(self, owner: int) -> int:
        """Index of the interval held by ``owner``, or -1 (tables are short: a linear scan)."""
        try:
            return self.owners.index(owner)
        except ValueError:
            return -1

    def remove_at(self, i: int) -> None:
        del self.starts[i], self.ends[i], self.owners[i]

    def release(self, owner: int) -> bool:
        i = self.find(owner)
        if i < 0:
            return False
        self.remove_at(i)
        return True

    def release_from(self, t: float) -> list[int]:
        """Drop every interval that starts at or after t; returns their owners."""
        i = bisect_left(self.starts, t)
        gone = self.owners[i:]
        del self.starts[i:], self.ends[i:], self.owners[i:]
        return gone

    def correct(self, owner: int, start: float, end: float) -> bool:
        """Make ``owner``'s interval the measured [start, end): trim an earlier neighbour that would
        overlap it (it must have finished), and push later intervals back if this one overran.
        Returns False when the table already said exactly that (nothing changed)."""
        i = self.find(owner)
        if i >= 0:
            if self.starts[i] == start and self.ends[i] == end:
                return False
            self.remove_at(i)
        if end <= start:
            return True
        i = bisect_left(self.starts, start)
        if i > 0 and self.ends[i - 1] > start:
            self.ends[i - 1] = max(self.starts[i - 1], start)
            if self.ends[i - 1] <= self.starts[i - 1]:
                self.remove_at(i - 1)
                i -= 1
        self.starts.insert(i, start)
        self.ends.insert(i, end)
        self.owners.insert(i, owner)
        starts, ends = self.starts, self.ends
        for j in range(i + 1, len(starts)):
            shift = ends[j - 1] - starts[j]
            if shift <= 0:
                break
            starts[j] += shift
            ends[j] += shift
        return True

    def prune(self, now: float) -> None:
        """Forget intervals that ended at or before ``now``."""
        k = bisect_right(self.ends, now)
        if k:
            del self.starts[:k], self.ends[:k], self.owners[:k]


def earliest_common(tables: Sequence[ResourceTable], t: float, d: float) -> float:
    """Earliest s >= t such that [s, s + d) is free on every table (fixed point of per-table slots)."""
    if len(tables) == 1:
        return tables[0].earliest(t, d)
    while True:
        moved = False
        for tab in tables:
            s = tab.earliest(t, d)
            if s != t:
                t = s
                moved = True
        if not moved:
            return t

