"""Percentiles of the few hundred recent samples the live loop learns from, without numpy's per-call overhead (tens
of microseconds per call, on a request's path at low load)."""

from __future__ import annotations

from collections.abc import Iterable


def percentile(values: Iterable[float], q: float) -> float:
    """numpy's default (linear) percentile ``q`` (0-100) of ``values`` (not empty)."""
    v = sorted(values)
    pos = (len(v) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)
