"""Queueing-aware capacity of a pooled pipeline: the highest request rate at which 99 % of requests still meet the SLO.

A pooled pipeline's nominal throughput is the rate at which its busiest pool is always busy. What a cluster sustains
at 99 % SLO attainment is lower, by how long batches wait in each pool, which falls with the pool's size (many small
vGPUs queue less than one big one at equal capacity) and with the slack the SLO leaves over the pipeline's latency.
The sidecar sheds a request that can no longer meet its deadline instead of queueing it, so a pool is a queue whose
customers leave when their wait would exceed the slack (a finite dam), not one whose waits grow without bound: the
share of requests it misses is P(W > d) of the unbounded queue, thinned by the work the shed ones never add; a
request waits in every pool of its pipeline, so each pool's share counts (``miss_fraction``). Batches form from the
arrivals (b - 1 mean inter-arrival gaps) and wait in each pool of c vGPUs with deterministic service (Erlang-C's
probability of waiting with the heavy-traffic decay of a G/D/c queue), then run for the pipeline's latency plus the
per-stage costs the sidecar adds. A model's pipelines queue as one pool (the driver sends each batch to whichever
frees first), each request with the slack of the pipeline it lands on. Checked against the simulator on every
candidate plan of a grid (benchmarks/closed_form.py; tests/test_sustained.py holds it to a band).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

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


def decay_rate(pool: PoolTerms, batches_per_us: float, arrival_scv: float) -> float:
    """theta = 2 (c mu - lambda) / (ca^2 + cs^2) with deterministic service (cs^2 = 0): the heavy-traffic decay of
    P(W > t); negative when overloaded."""
    return 2.0 * (pool.vgpus / pool.service_us - batches_per_us) / max(arrival_scv, 1e-6)


def wait_tail(pool: PoolTerms, batches_per_us: float, arrival_scv: float) -> tuple[float, float]:
    """(P(wait), decay rate theta) of a batch's wait for a vGPU of ``pool``: P(W > t) ~ C(c, a) exp(-theta t);
    theta 0 when overloaded."""
    a = batches_per_us * pool.service_us
    if a >= pool.vgpus:
        return 1.0, 0.0
    return erlang_c(pool.vgpus, a), decay_rate(pool, batches_per_us, arrival_scv)


def wait_mean_us(pool: PoolTerms, batches_per_us: float, arrival_scv: float) -> float:
    """The mean of that wait, C(c, a) / theta."""
    if batches_per_us <= 0:
        return 0.0
    p_wait, theta = wait_tail(pool, batches_per_us, arrival_scv)
    return math.inf if theta == 0.0 else p_wait / theta


def shed_fraction(pool: PoolTerms, batches_per_us: float, slack_us: float, arrival_scv: float) -> float:
    """The share of batches a pool sheds when each leaves whose wait would exceed ``slack_us``: with P = P(W > d)
    of the unbounded queue and rho its load, (1 - rho) P / (1 - rho P) (exact for M/M/1 with impatience that knows
    its wait; it holds past rho = 1, where at least 1 - 1/rho is shed)."""
    if slack_us < 0:
        return 1.0
    if batches_per_us <= 0:
        return 0.0
    a = batches_per_us * pool.service_us
    rho = a / pool.vgpus
    if abs(1.0 - rho) < 1e-9:  # the formula's 0 / 0: its limit
        return 1.0 / (1.0 + 2.0 * pool.vgpus * slack_us / pool.service_us / max(arrival_scv, 1e-6))
    beyond = erlang_c(pool.vgpus, a) * math.exp(min(700.0, -decay_rate(pool, batches_per_us, arrival_scv) * slack_us))
    return min(1.0, max(0.0, (1.0 - rho) * beyond / (1.0 - rho * beyond)))


def miss_fraction(p: PipelineTerms, model_rps: float, slo_us: float, arrival_scv: float = 1.0) -> float:
    """The estimated share of requests offered at ``model_rps`` that miss ``slo_us`` through ``p``: shed by any of
    its pools, each given the slack the SLO leaves over the latency, batch forming and the other pools' mean waits
    (the driver reserves every stage of a request before it sends the first, so a wait anywhere sheds it)."""
    per_us = model_rps / 1e6
    if per_us <= 0:
        return 0.0
    batches = per_us / p.batch
    scv = arrival_scv / p.batch  # b arrivals per batch smooth the batch stream
    means = [wait_mean_us(pool, batches, scv) for pool in p.pools]
    waits = sum(means)
    if math.isinf(waits):
        return 1.0
    # The driver holds a partial batch only while the pools could not keep up without it, and never past the
    # first request's deadline: batches form in their mean time, (b - 1) gaps, not in a tail quantile of it.
    slack = slo_us - p.latency_us - (p.batch - 1) / per_us
    kept = 1.0
    for pool, mean in zip(p.pools, means):
        kept *= 1.0 - shed_fraction(pool, batches, slack - (waits - mean), scv)
    return 1.0 - kept


def _largest_rate(capacity_rps: float, misses: Callable[[float], float], q: float) -> float:
    """The largest rate below ``capacity_rps`` (to 1/SCAN_STEPS of it) whose ``misses`` stay within 1 - q. Scanned
    down rather than bisected: at low rates the driver dispatches partial batches, so the forming term (full
    batches) only holds near the capacity, where the answer lies."""
    for i in range(1, SCAN_STEPS + 1):
        rps = capacity_rps * (1.0 - i / SCAN_STEPS)
        if rps > 0 and misses(rps) <= 1.0 - q:
            return rps
    return 0.0


def pipeline_sustainable_rps(p: PipelineTerms, slo_us: float, q: float = TARGET, arrival_scv: float = 1.0) -> float:
    """The largest rate (req/s) one pipeline takes with at most 1 - q of its requests missing ``slo_us``."""
    if p.latency_us > slo_us:
        return 0.0
    return _largest_rate(p.capacity_rps(), lambda rps: miss_fraction(p, rps, slo_us, arrival_scv), q)


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
    """A model's sustainable rate: its pipelines that fit the SLO at all, queueing as one pool (:func:`pooled`),
    each request with the slack of the pipeline it lands on (in proportion to their capacities): a pipeline near
    the SLO sheds more than the pool's mean latency says."""
    usable = [p for p in pipelines if p.latency_us <= slo_us and p.capacity_rps() > 0]
    if not usable:
        return 0.0
    if len(usable) == 1:  # one pipeline keeps every pool of its own (the other pools' waits count too)
        return pipeline_sustainable_rps(usable[0], slo_us, q, arrival_scv)
    one = pooled(usable)
    caps = [p.capacity_rps() for p in usable]
    shares = [(c / sum(caps), replace(one, latency_us=p.latency_us)) for c, p in zip(caps, usable)]
    return _largest_rate(one.capacity_rps(), lambda rps: sum(
        s * miss_fraction(v, rps, slo_us, arrival_scv) for s, v in shares), q)
