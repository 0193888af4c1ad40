"""Latency and sustained load of several endpoints measured side by side: each system in turn, in short turns, so
that the host's speed drifting over seconds and minutes weighs on all of them alike (benchmarks/sidecar.py).

Why turns: one 2 s window per system in a row moved a 0.2 ms difference between two of them by as much again on
this 2-core host (the pass-through's added p50 read +0.43 ms in one window, +0.14 to +0.20 ms in alternating ones).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import tritonclient.grpc.aio as grpcaio
from tritonclient.utils import InferenceServerException


@dataclass
class LoadResult:
    """An open-loop run's outcome: how many were sent, answered within the SLO, failed, and the latencies (s)."""

    rate_rps: float
    sent: int
    ok_in_slo: int
    errors: int
    latencies_s: list[float] = field(default_factory=list)

    @property
    def attainment(self) -> float:
        return self.ok_in_slo / max(self.sent, 1)

    @property
    def p50_ms(self) -> float:
        return _percentile_ms(self.latencies_s, 50)

    @property
    def p99_ms(self) -> float:
        return _percentile_ms(self.latencies_s, 99)

    def merged(self, other: "LoadResult") -> "LoadResult":
        return LoadResult(self.rate_rps, self.sent + other.sent, self.ok_in_slo + other.ok_in_slo,
                          self.errors + other.errors, self.latencies_s + other.latencies_s)


def _percentile_ms(lat: Sequence[float], q: float) -> float:
    return float(np.percentile(lat, q) * 1e3) if len(lat) else float("nan")


async def poisson_load(url: str, model: str, inputs: list, rate_rps: float, duration_s: float, slo_s: float,
                       seed: int = 0) -> LoadResult:
    """Open-loop Poisson arrivals; a request counts when answered correctly within the SLO."""
    client, rng = grpcaio.InferenceServerClient(url), np.random.default_rng(seed)
    lat: list[float] = []
    tasks, errors = [], 0

    async def one() -> None:
        nonlocal errors
        t0 = time.perf_counter()
        try:
            await client.infer(model, inputs, client_timeout=max(4 * slo_s, 2.0))
            lat.append(time.perf_counter() - t0)
        except InferenceServerException:
            errors += 1

    start = t_next = time.perf_counter()
    while t_next - start < duration_s:
        if (delay := t_next - time.perf_counter()) > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(one()))
        t_next += rng.exponential(1.0 / rate_rps)
    await asyncio.gather(*tasks)
    await client.close()
    return LoadResult(rate_rps, len(tasks), sum(x <= slo_s for x in lat), errors, lat)


def poisson_in_turns(targets: Sequence[tuple[str, str]], model: str, inputs: list, rate_rps: float,
                     duration_s: float, slo_s: float, turns: int = 3, seed: int = 0) -> dict[str, LoadResult]:
    """``duration_s`` of Poisson load at ``rate_rps`` on each (label, url), in ``turns`` turns per target (the
    order rotating from turn to turn); each target's turns merged into one result."""
    out: dict[str, LoadResult] = {}
    for turn in range(turns):
        for label, url in rotated(targets, turn):
            r = asyncio.run(poisson_load(url, model, inputs, rate_rps, duration_s / turns, slo_s, seed=seed + turn))
            out[label] = out[label].merged(r) if label in out else r
    return out


async def one_at_a_time_in_turns(targets: Sequence[tuple[str, str]], model: str, inputs: list, duration_s: float,
                                 block: int = 25, warmup: int = 20) -> dict[str, list[float]]:
    """One request at a time, ``block`` to each (label, url) in turn (the order rotating), until each target has
    had about ``duration_s``; each target's latencies (s). One client per target, kept open, warmed first."""
    clients = {label: grpcaio.InferenceServerClient(url) for label, url in targets}
    lat: dict[str, list[float]] = {label: [] for label, _ in targets}
    try:
        for client in clients.values():
            for _ in range(warmup):
                await client.infer(model, inputs, client_timeout=10)
        turn = 0
        while min(map(sum, lat.values())) < duration_s:  # once per turn
            for label, _ in rotated(targets, turn):
                for _ in range(block):
                    t = time.perf_counter()
                    await clients[label].infer(model, inputs, client_timeout=10)
                    lat[label].append(time.perf_counter() - t)
            turn += 1
    finally:
        for client in clients.values():
            await client.close()
    return lat


def rotated(items: Sequence, k: int) -> list:
    """``items`` rotated left by ``k`` (turn k of a rotating order)."""
    k %= max(len(items), 1)
    return [*items[k:], *items[:k]]


def highest_sustained(targets: list[tuple[str, str]], model: str, inputs: list, rates: list[float],
                      duration_s: float, slo_s: float) -> dict[str, float]:
    """Walk up the ladder of rates with every (label, url) target at each rate in turn, so that the host's speed
    drifting over minutes (seen here: 2x between runs) weighs on both alike; each target's highest rate with >= 99 %
    attainment (a target stops after two misses)."""
    best, misses = {label: 0.0 for label, _ in targets}, {label: 0 for label, _ in targets}
    for _, url in targets:
        asyncio.run(poisson_load(url, model, inputs, 20, 2.0, slo_s))  # warm-up (the sidecar learns its margin)
    for r in rates:
        for label, url in targets:
            if misses[label] == 2:
                continue
            res = asyncio.run(poisson_load(url, model, inputs, r, duration_s, slo_s, seed=int(r)))
            print(f"  {label:<22} {r:7.1f} rps: attainment {res.attainment * 100:6.2f} %  p50 {res.p50_ms:7.1f} ms  "
                  f"p99 {res.p99_ms:7.1f} ms  errors {res.errors}", flush=True)
            if res.attainment >= 0.99:
                best[label], misses[label] = r, 0
            else:
                misses[label] += 1
        if all(m == 2 for m in misses.values()):
            break
    return best
