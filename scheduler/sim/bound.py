"""An upper bound on SLO attainment that no policy can beat: a fluid relaxation of a model's pipelines.

Each model's pipelines are relaxed into one work-conserving FIFO server whose rate is the sum over
pipelines of their bottleneck stage's capacity (pool size x the best batch / the time it holds a vGPU,
among the batch sizes the pipeline may use). A request can only meet its deadline if its bottleneck work
finishes within SLO - (the shortest time the stages before and after the bottleneck take at batch 1), so the
bound admits requests greedily under that test (optimal for unit jobs with one relative deadline)
and reports the admitted fraction. NIC transfers and batching delays are ignored: the bound is loose
but safe, and tells a workload that no plan-respecting policy can serve at 99% from a weak policy.
"""

from __future__ import annotations

from typing import Iterable

from scheduler.core.topology import Pipeline, Topology


def stage_capacity_rps(pool: int, latency_us: dict[int, float], max_batch: int) -> float:
    """Requests per second a pool can sustain at its most efficient usable batch size."""
    return max(pool * b / lat for b, lat in latency_us.items() if b <= max_batch and lat > 0) * 1e6


def pipeline_bound_terms(p: Pipeline) -> tuple[float, float]:
    """(bottleneck capacity in rps, latency of the other stages at batch 1 in µs)."""
    caps = [stage_capacity_rps(len(st.pool), st.hold_us(), p.batch) for st in p.stages]
    k = min(range(len(caps)), key=caps.__getitem__)
    others = sum(min(st.latency_us.values()) for j, st in enumerate(p.stages) if j != k)
    return caps[k], others


def model_bound_terms(topology: Topology, model: str) -> tuple[float, float]:
    """(capacity in rps summed over the model's pipelines, the loosest window in µs for bottleneck work)."""
    terms = [pipeline_bound_terms(p) for p in topology.pipelines[model]]
    capacity = sum(c for c, _ in terms)
    window = topology.slo_us[model] - min(o for _, o in terms)
    return capacity, window


def fluid_attainment(arrivals_us: Iterable[float], capacity_rps: float, window_us: float) -> float:
    """Fraction of requests a fluid FIFO server of ``capacity_rps`` can finish within ``window_us`` of
    arrival, admitting greedily (a request that cannot make it is not served and costs nothing)."""
    per_us = capacity_rps / 1e6
    backlog = 0.0  # requests of work not yet done
    last = 0.0
    n = ok = 0
    for t in arrivals_us:
        n += 1
        backlog = max(0.0, backlog - per_us * (t - last))
        last = t
        if (backlog + 1.0) / per_us <= window_us:
            backlog += 1.0
            ok += 1
    return ok / n if n else 1.0


def attainment_bound(topology: Topology, arrivals: Iterable[tuple[float, str]]) -> dict[str, float]:
    """Per model, the fluid upper bound on SLO attainment for ``arrivals`` ((time_us, model) sorted)."""
    times: dict[str, list[float]] = {m: [] for m in topology.pipelines}
    for t, m in arrivals:
        if m in times:
            times[m].append(t)
    out = {}
    for m, ts in times.items():
        cap, window = model_bound_terms(topology, m)
        out[m] = fluid_attainment(ts, cap, window)
    return out


def max_load_factor_bound(topology: Topology, trace, rates_rps: dict[str, float], duration_s: float, seed: int,
                          grid: float, lf_max: float, target: float = 0.99) -> dict[str, float]:
    """Per model, the largest load factor on the grid (every smaller one passing too) at which the fluid
    bound still reaches ``target`` attainment: no policy can sustain more on these arrivals."""
    from workloads.arrivals import mixed_arrivals

    best = {m: 0.0 for m in rates_rps}
    open_ = set(rates_rps)
    k = 1
    while open_ and k * grid <= lf_max + 1e-9:
        lf = round(k * grid, 6)
        arrivals = mixed_arrivals(trace, {m: lf * r for m, r in rates_rps.items()}, duration_s, seed)
        b = attainment_bound(topology, arrivals)
        for m in list(open_):
            if b[m] >= target:
                best[m] = lf
            else:
                open_.discard(m)
        k += 1
    return best
