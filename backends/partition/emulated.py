"""An emulated device: holds each batch for its profiled latency and returns tensors computed from the inputs.

``poolpipe generate`` copies this file beside ``model.py`` for hosts with ``device: emulated``; the
partition backend then runs an :class:`EmulatedDevice` instead of an engine. Everything but the GPU's
compute is real (requests, tensors, hops, Triton); the compute is a sleep, which costs no CPU.

Outputs prove the path a request took: per request (row), a CRC-32 digest of the head of each input
row (up to ``DIGEST_HEAD_BYTES``), seeded with the stage index, is written into the first four
elements of every output row as four values 0..255 (exact in every datatype); the rest is zeros.
A chain of emulated stages therefore carries a checksum forward that depends on the client's input
and on every stage having run, in order; :func:`emulated_outputs` recomputes it for a test.
Imports nothing of the project (it runs inside tritonserver).
"""

from __future__ import annotations

import json
import math
import time
import zlib
from collections.abc import Mapping, Sequence

import numpy as np

DIGEST_HEAD_BYTES = 65536  # bytes of each input row that enter the digest (bounds the CPU spent per request)
DIGEST_ELEMENTS = 4  # leading elements of each output row that carry the digest, one byte each


def parse_latency_table(text: str) -> dict[int, float]:
    """``{"1": 830.5, "2": 1500}`` (batch -> µs, JSON) -> {1: 830.5, 2: 1500.0}; ValueError naming the fault."""
    try:
        raw = json.loads(text)
    except (TypeError, ValueError):
        raise ValueError(f"emulated_latency_us={text!r} is not JSON (batch -> latency in µs)") from None
    if not isinstance(raw, dict) or not raw:
        raise ValueError(f"emulated_latency_us={text!r}: expected a non-empty object batch -> latency in µs")
    table = {}
    for b, us in raw.items():
        try:
            batch = int(b)
        except ValueError:
            raise ValueError(f"emulated_latency_us: batch {b!r} is not an integer") from None
        if batch < 1 or isinstance(us, bool) or not isinstance(us, (int, float)) or not 0 <= us < math.inf:
            raise ValueError(f"emulated_latency_us: batch {b} -> {us!r}; expected batch >= 1 and a latency >= 0")
        table[batch] = float(us)
    return table


def parse_quantile_table(text: str) -> tuple[list[float], dict[int, list[float]]] | None:
    """``{"levels": [0, 0.5, 1], "latency_us": {"1": [700, 830, 2400], ...}}`` (JSON; empty: none) -> (levels,
    batch -> latencies at those levels): a variable-latency partition's distribution; ValueError naming the fault."""
    if not text:
        return None
    try:
        raw = json.loads(text)
        levels = [float(x) for x in raw["levels"]]
        table = {int(b): [float(x) for x in q] for b, q in raw["latency_us"].items()}
    except (TypeError, ValueError, KeyError, AttributeError):
        raise ValueError(f"emulated_latency_quantiles_us={text[:200]!r}: expected JSON "
                         '{"levels": [...], "latency_us": {"<batch>": [one latency per level], ...}}') from None
    if len(levels) < 2 or any(b <= a for a, b in zip(levels, levels[1:])) or levels[0] < 0 or levels[-1] > 1:
        raise ValueError(f"emulated_latency_quantiles_us: levels {levels} must increase strictly within [0, 1]")
    for b, q in table.items():
        if (b < 1 or len(q) != len(levels) or any(y < x for x, y in zip(q, q[1:])) or q[0] < 0
                or not math.isfinite(q[-1])):
            raise ValueError(f"emulated_latency_quantiles_us: batch {b} needs {len(levels)} non-decreasing latencies "
                             f">= 0, got {q}")
    return (levels, table) if table else None


def latency_at(table: Mapping[int, float], batch: int) -> float:
    """Latency (µs) at ``batch``: the profiled value, else linear between the neighbouring profiled batches;
    below the smallest, proportional to the batch; above the largest, the last segment's slope (or
    proportional with one point), never less than the largest profiled latency."""
    if batch in table:
        return table[batch]
    sizes = sorted(table)
    lo, hi = sizes[0], sizes[-1]
    if batch < lo:
        return table[lo] * batch / lo
    if batch > hi:
        if len(sizes) == 1:
            return table[hi] * batch / hi
        prev = sizes[-2]
        slope = max((table[hi] - table[prev]) / (hi - prev), 0.0)
        return table[hi] + slope * (batch - hi)
    below = max(b for b in sizes if b < batch)
    above = min(b for b in sizes if b > batch)
    return table[below] + (table[above] - table[below]) * (batch - below) / (above - below)


def row_digests(inputs: Sequence[np.ndarray], stage: int) -> list[int]:
    """One CRC-32 per request: the stage index, then the head of each input's row, in input order."""
    seed = zlib.crc32(f"poolpipe-stage-{stage}".encode())
    flat = [np.ascontiguousarray(x).reshape(x.shape[0], -1).view(np.uint8) for x in inputs]
    out = []
    for i in range(inputs[0].shape[0]):
        d = seed
        for x in flat:
            d = zlib.crc32(x[i, :DIGEST_HEAD_BYTES], d)
        out.append(d)
    return out


def _stamp(y: np.ndarray, digests: Sequence[int], j: int) -> None:
    """Write output ``j``'s checksum of each row's digest into the row's first elements (the rest untouched)."""
    flat = y.reshape(len(digests), -1)
    n = min(DIGEST_ELEMENTS, flat.shape[1])
    for i, d in enumerate(digests):
        code = np.frombuffer(zlib.crc32(bytes([j]), d).to_bytes(4, "little"), np.uint8)[:n]
        flat[i, :n] = code & 1 if y.dtype == np.bool_ else code


def emulated_outputs(inputs: Sequence[np.ndarray], stage: int,
                     outputs: Sequence[tuple[np.dtype, Sequence[int]]]) -> list[np.ndarray]:
    """The outputs (dtype, dims without batch) of an emulated stage for ``inputs``: zeros, each row led by
    the digest of its input rows mixed with the output's index."""
    digests = row_digests(inputs, stage)
    result = []
    for j, (dtype, dims) in enumerate(outputs):
        y = np.zeros((len(digests), *dims), dtype=dtype)
        _stamp(y, digests, j)
        result.append(y)
    return result


class EmulatedDevice:
    """Stands in for an engine: ``run`` returns :func:`emulated_outputs` after holding the calling thread
    (asleep) for the profiled latency at the batch size, times lognormal noise of mean 1 if ``cv`` > 0.

    With ``quantiles`` (a variable-latency model) each request of a batch draws its level u uniformly and the
    batch is held for the distribution's latency at the largest u (a batch is padded to its longest request), at
    the nearest profiled batch size scaled to the batch by the median table."""

    def __init__(self, latency_us: Mapping[int, float], stage: int,
                 outputs: Sequence[tuple[str, np.dtype, Sequence[int]]], cv: float = 0.0, seed: int | None = None,
                 quantiles: tuple[Sequence[float], Mapping[int, Sequence[float]]] | None = None) -> None:
        if not latency_us:
            raise ValueError("emulated device: empty latency table")
        if stage < 0:
            raise ValueError(f"emulated_stage={stage} must be >= 0")
        if not 0.0 <= cv <= 10.0:
            raise ValueError(f"emulated_latency_cv={cv} must be within 0..10 (0 = no noise)")
        variable = [name for name, _, dims in outputs if any(int(d) < 1 for d in dims)]
        if variable:
            raise ValueError(f"emulated device: output(s) {variable} have variable dims; emulated outputs need "
                             "fixed shapes")
        self.latency_us = dict(latency_us)
        self.quantiles = quantiles
        self.stage = stage
        self.outputs = [name for name, _, _ in outputs]
        self.specs = [(np.dtype(dt), tuple(int(d) for d in dims)) for _, dt, dims in outputs]
        self.sigma = math.sqrt(math.log1p(cv * cv))
        self.rng = np.random.default_rng(seed)
        self.buffers: list[np.ndarray] = []  # one zeroed buffer per output, grown to the largest batch seen
        self.description = f"emulated device (stage {stage}, latency cv {cv:g})"

    def hold_us(self, batch: int) -> float:
        """How long a batch of ``batch`` requests holds the device (µs)."""
        us = latency_at(self.latency_us, batch)
        if self.quantiles is not None:
            levels, table = self.quantiles
            near = max((b for b in table if b <= batch), default=min(table))
            u = float(self.rng.random(batch).max())
            base = latency_at(self.latency_us, near)
            us = float(np.interp(u, levels, table[near])) * (us / base if base > 0 else 1.0)
        if self.sigma > 0:
            us *= float(self.rng.lognormal(-self.sigma * self.sigma / 2, self.sigma))
        return us

    def outputs_for(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """:func:`emulated_outputs` as views of buffers kept across calls (no allocation or zeroing per batch:
        only the checksum elements change). The views are valid until the next call, which is after the
        backend has sent them (Triton calls ``execute`` once at a time per instance)."""
        digests = row_digests(inputs, self.stage)
        batch = len(digests)
        if not self.buffers or self.buffers[0].shape[0] < batch:
            self.buffers = [np.zeros((batch, *dims), dtype=dtype) for dtype, dims in self.specs]
        outs = [buf[:batch] for buf in self.buffers]
        for j, y in enumerate(outs):
            _stamp(y, digests, j)
        return outs

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Outputs for ``inputs`` (config input order), returned when the hold since the call has passed."""
        start = time.monotonic()
        until = start + self.hold_us(inputs[0].shape[0]) / 1e6
        outs = self.outputs_for(inputs)
        left = until - time.monotonic()
        while left > 0:  # time.sleep may wake early on some systems; never spin
            time.sleep(left)
            left = until - time.monotonic()
        return outs
