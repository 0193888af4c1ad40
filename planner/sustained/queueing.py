"""Queueing-aware capacity of a pooled pipeline: the highest request rate at which its tail latency still fits.

A pooled pipeline's nominal throughput is the rate at which its busiest pool is always busy; at that rate
every batch waits without bound. What a cluster sustains at 99 % SLO attainment is lower, by how long
batches wait in each pool, which falls with the pool's size (many small vGPUs queue less than one big one
at equal capacity) and with the slack the SLO leaves over the pipeline's latency. This module estimates it
with closed forms, cheap enough to rank every candidate plan: batches form from the arrivals (b - 1 mean
inter-arrival gaps), wait in each pool of c vGPUs with deterministic service (the Erlang-C probability of
waiting with the heavy-traffic decay of a G/D/c queue), then run for the pipeline's latency plus the
per-stage costs the sidecar adds. A model's pipelines queue as one pool (the driver sends each batch to
whichever frees first).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

TARGET = 0.99  # SLO attainment a sustained rate keeps
SCAN_STEPS = 400  # the sustainable rate is found to 1/SCAN_STEPS of the capacity


@dataclass(frozen=True)
class PoolTerms:
    """One partition's pool: how many vGPUs serve it and how long one batch occupies one of them."""

    vgpus: int
    service_us: float


@dataclass(frozen=True)
class PipelineTerms:
    """A pipeline as the queueing estimate sees it."""

    batch: int
    pools: tuple[PoolTerms, ...]
    latency_us: float  # one batch through every stage with no waiting (compute, transfers, per-stage costs)

    def capacity_rps(self) -> float:
        return min(p.vgpus * self.batch / p.service_us for p in self.pools) * 1e6


def erlang_c(c: int, a: float) -> float:
    """Probability that an arrival waits in an M/M/c queue offered ``a`` Erlangs (1 when a >= c)."""
    if a >= c:
        return 1.0
    b = 1.0
    for k in range(1, c + 1):
        b = a * b / (k + a * b)
    rho = a / c
    return b / (1.0 - rho * (1.0 - b))


def wait_tail(pool: PoolTerms, batches_per_us: float, arrival_scv: float) -> tuple[float, float]:
    """(P(wait), decay rate theta) of a batch's wait for a vGPU of ``pool``: P(W > t) ~ C(c, a) exp(-theta t) with
    theta = 2 (c mu - lambda) / (ca^2 + cs^2) and deterministic service (cs^2 = 0); theta 0 when overloaded."""
    mu = 1.0 / pool.service_us
    if batches_per_us / mu >= pool.vgpus:
        return 1.0, 0.0
    theta = 2.0 * (pool.vgpus * mu - batches_per_us) / max(arrival_scv, 1e-6)
    return erlang_c(pool.vgpus, batches_per_us / mu), theta


def wait_quantile_us(pool: PoolTerms, batches_per_us: float, q: float, arrival_scv: float) -> float:
    """The q-quantile of that wait."""
    if batches_per_us <= 0:
        return 0.0
    p_wait, theta = wait_tail(pool, batches_per_us, arrival_scv)
    if theta == 0.0:
        return math.inf
    return 0.0 if p_wait <= 1.0 - q else math.log(p_wait / (1.0 - q)) / theta


def wait_mean_us(pool: PoolTerms, batches_per_us: float, arrival_scv: float) -> float:
    """The mean of that wait, C(c, a) / theta."""
    if batches_per_us <= 0:
        return 0.0
    p_wait, theta = wait_tail(pool, batches_per_us, arrival_scv)
    return math.inf if theta == 0.0 else p_wait / theta


def tail_latency_us(p: PipelineTerms, model_rps: float, q: float = TARGET, arrival_scv: float = 1.0) -> float:
    """Estimated q-quantile of a request's latency through ``p`` when it is offered ``model_rps``: batch forming
    + the waits (the slowest pool's tail, the others' means) + the pipeline's latency."""
    per_us = model_rps / 1e6
    batches = per_us / p.batch
    scv = arrival_scv / p.batch  # b arrivals per batch smooth the batch stream
    tails = [wait_quantile_us(pool, batches, q, scv) for pool in p.pools]
    worst = max(range(len(tails)), key=tails.__getitem__)
    others = sum(wait_mean_us(pool, batches, scv) for k, pool in enumerate(p.pools) if k != worst)
    # The driver holds a partial batch only while the pools could not keep up without it, and never past the
    # first request's deadline: batches form in their mean time, (b - 1) gaps, not in a tail quantile of it.
    forming = (p.batch - 1) / per_us if per_us > 0 else 0.0
    return p.latency_us + forming + tails[worst] + others


def pipeline_sustainable_rps(p: PipelineTerms, slo_us: float, q: float = TARGET, arrival_scv: float = 1.0) -> float:
    """The largest rate (req/s) one pipeline takes with its estimated q-quantile latency within ``slo_us``.

    Scanned down from its capacity rather than bisected: at low rates the driver dispatches partial batches, so
    the closed form's forming term (full batches) only holds near the capacity, where the answer lies."""
    if p.latency_us > slo_us:
        return 0.0
    capacity = p.capacity_rps()
    for i in range(1, SCAN_STEPS + 1):
        rps = capacity * (1.0 - i / SCAN_STEPS)
        if rps > 0 and tail_latency_us(p, rps, q, arrival_scv) <= slo_us:
            return rps
    return 0.0


def pooled(pipelines: list[PipelineTerms]) -> PipelineTerms:
    """A model's pipelines as one: the driver sends each batch to whichever pipeline frees first, so their
    bottleneck pools queue as one pool of all their vGPUs (at the capacity-weighted service time), behind the
    capacity-weighted latency, with the smallest batch any of them forms."""
    caps = [p.capacity_rps() for p in pipelines]
    total = sum(caps)
    necks = [min(p.pools, key=lambda x: x.vgpus / x.service_us) for p in pipelines]
    vgpus = sum(n.vgpus for n in necks)
    service = vgpus / sum(n.vgpus / n.service_us for n in necks)
    latency = sum(c * p.latency_us for c, p in zip(caps, pipelines)) / total
    return PipelineTerms(min(p.batch for p in pipelines), (PoolTerms(vgpus, service),), latency)


def sustainable_rps(pipelines: list[PipelineTerms], slo_us: float, q: float = TARGET,
                    arrival_scv: float = 1.0) -> float:
    """A model's sustainable rate: its pipelines that fit the SLO at all, pooled (:func:`pooled`)."""
    usable = [p for p in pipelines if p.latency_us <= slo_us and p.capacity_rps() > 0]
    if not usable:
        return 0.0
    # one pipeline keeps every pool of its own (the other pools' waits count too); pooling keeps only bottlenecks
    one = usable[0] if len(usable) == 1 else pooled(usable)
    return pipeline_sustainable_rps(one, slo_us, q, arrival_scv)
