"""Optional latency distributions in a profile: per block and batch size, the solo latency at fixed quantile levels.

A model whose latency depends on its input (dynamic shapes, early exit, NMS that grows with the objects)
is described by more than a median. Inside one ``devices.<type>.<V>`` entry a profile may add::

    "latency_quantiles": {"levels": [0.0, 0.25, 0.5, 0.75, 1.0],       # increasing, within [0, 1]
                          "latency_us": [[[...one per level...],      # block 0, first batch size
                                          ...one per batch size...],
                                         ...one per block...]}

Each innermost list is non-decreasing: the block's latency at those quantiles of the inputs (a piecewise-
linear quantile function, i.e. a histogram with one bin between consecutive levels). A partition's
distribution adds its blocks' quantiles level by level: one input drives every block, so the blocks are
slow or fast together (comonotone), not independently. Where no distribution exists everything uses the
median table ``latency_us``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from poolpipe_common.documents import check_fields, need
from poolpipe_common.errors import InputError

MIN_LEVELS = 2
QUANTILES_FIELDS = ("levels", "latency_us")  # a timing entry's latency_quantiles


@dataclass(frozen=True)
class LatencyQuantiles:
    """Quantiles of every block's latency at the profiled batch sizes of one (device type, vGPU level)."""

    levels: tuple[float, ...]
    latency_us: np.ndarray  # shape (num_blocks, num_batch_sizes, len(levels)), non-decreasing along the last axis

    def partition(self, batch_index: int, first: int, end: int, floor_us: float) -> np.ndarray:
        """Quantiles of blocks [first, end) together at one batch size, each block at least ``floor_us``."""
        return np.maximum(self.latency_us[first:end, batch_index, :], floor_us).sum(axis=0)

    def scaled(self, k: float) -> "LatencyQuantiles":
        return LatencyQuantiles(self.levels, self.latency_us * k)

    def to_dict(self) -> dict[str, Any]:
        return {"levels": list(self.levels),
                "latency_us": [[[float(x) for x in q] for q in row] for row in self.latency_us]}


def quantiles_from_dict(raw: Any, num_blocks: int, num_batches: int, where: str) -> LatencyQuantiles:
    """Validate a ``latency_quantiles`` entry against the profile's blocks and batch sizes."""
    check_fields(raw, QUANTILES_FIELDS, where)
    levels = need(raw, "levels", where)
    try:
        lv = np.asarray(levels, dtype=float)
    except (TypeError, ValueError):
        raise InputError(f"{where}.levels: expected a list of numbers within [0, 1], got {levels!r}") from None
    if (lv.ndim != 1 or len(lv) < MIN_LEVELS or not np.all(np.isfinite(lv)) or lv[0] < 0 or lv[-1] > 1
            or np.any(np.diff(lv) <= 0)):
        raise InputError(f"{where}.levels: expected at least {MIN_LEVELS} strictly increasing numbers within "
                         f"[0, 1] (e.g. [0, 0.5, 1]), got {levels!r}")
    lat = need(raw, "latency_us", where)
    try:
        arr = np.asarray(lat, dtype=float)
    except (TypeError, ValueError):
        raise InputError(f"{where}.latency_us: expected a numeric array blocks x batch sizes x levels") from None
    want = (num_blocks, num_batches, len(lv))
    if arr.shape != want:
        raise InputError(f"{where}.latency_us: shape {list(arr.shape)} but the profile has {num_blocks} blocks, "
                         f"{num_batches} batch sizes and {len(lv)} levels (expected {list(want)})")
    if not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise InputError(f"{where}.latency_us: latencies must be finite and non-negative")
    bad = np.argwhere(np.diff(arr, axis=2) < 0)
    if len(bad):
        b, k, _ = (int(x) for x in bad[0])
        raise InputError(f"{where}.latency_us[{b}][{k}]: quantiles must not decrease as the level grows, got "
                         f"{[float(x) for x in arr[b, k]]}")
    return LatencyQuantiles(tuple(float(x) for x in lv), arr)


def quantiles_from_samples(samples_us: list[list[list[float]]], levels: tuple[float, ...]) -> LatencyQuantiles:
    """Quantiles from raw measurements: samples_us[block][batch index] is that block's latencies (µs)."""
    arr = np.array([[np.quantile(np.asarray(s, dtype=float), levels) for s in row] for row in samples_us])
    return LatencyQuantiles(tuple(levels), arr)


def two_mode_multipliers(levels: tuple[float, ...], long_share: float = 0.5, ratio: float = 4.0, cv: float = 0.1,
                         seed: int = 0) -> np.ndarray:
    """Quantiles (at ``levels``) of a two-mode latency, relative to its median: a mix of short requests and
    ``long_share`` long ones ``ratio`` times slower, each mode normal with coefficient of variation ``cv``
    (Orloj's synthetic bimodal setup). Deterministic per ``seed``."""
    if not (0 < long_share < 1 and ratio > 1 and 0 <= cv < 0.3):
        raise ValueError(f"two-mode latency: need 0 < long_share < 1, ratio > 1, 0 <= cv < 0.3; got "
                         f"{long_share}, {ratio}, {cv}")
    rng = np.random.default_rng(seed)
    n = 200_000
    mode = np.where(rng.random(n) < long_share, ratio, 1.0)
    x = np.maximum(mode * (1.0 + cv * rng.standard_normal(n)), 0.05)
    return np.quantile(x, levels) / np.median(x)


def with_multipliers(timing_us: np.ndarray, levels: tuple[float, ...], multipliers: np.ndarray) -> LatencyQuantiles:
    """A distribution for a median table (blocks x batch sizes): every block's latency times ``multipliers``
    at ``levels`` (one input makes every block slow or fast alike)."""
    return LatencyQuantiles(tuple(levels), timing_us[:, :, None] * np.asarray(multipliers)[None, None, :])
