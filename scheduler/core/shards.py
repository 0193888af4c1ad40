"""Sidecar shards: every pool's vGPUs split into N disjoint shares of whole physical GPUs, balanced by
planned throughput, so N sidecars each serve 1/N of the load with no shared state.

A vGPU of stage k of pipeline p carries ``throughput(p) / |pool(p, k)|`` of that stage's planned
throughput. Physical GPUs (all their vGPUs together) are dealt, largest first, to the share whose
resulting load, relative to each touched stage's total, stays lowest. A share serves a pipeline at the
throughput of its scarcest stage; pipelines it holds no vGPU of some stage of are dropped from it.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

from poolpipe_common.errors import InputError
from scheduler.core.topology import Pipeline, Topology

Dim = tuple[str, int]  # (pipeline id, stage index)


def gpu_weights(topology: Topology) -> tuple[dict[str, dict[Dim, float]], dict[Dim, float]]:
    """Physical GPU -> its planned throughput in each stage it serves, and each stage's total."""
    units: dict[str, dict[Dim, float]] = defaultdict(lambda: defaultdict(float))
    totals: dict[Dim, float] = defaultdict(float)
    for pipes in topology.pipelines.values():
        for p in pipes:
            for k, s in enumerate(p.stages):
                w = p.throughput_rps / len(s.pool)
                for v in s.pool:
                    vg = topology.vgpus[v]
                    units[vg.gpu or vg.id][(p.id, k)] += w
                    totals[(p.id, k)] += w
    return units, totals


def split_vgpus(topology: Topology, n: int) -> list[frozenset[str]]:
    """N disjoint shares of the vGPUs that together cover every vGPU of the topology once."""
    if n < 1:
        raise InputError(f"shards: expected N >= 1, got {n}")
    units, totals = gpu_weights(topology)
    def rel(gpu: str) -> float:
        return sum(w / totals[d] for d, w in units[gpu].items() if totals[d] > 0)

    loads: list[dict[Dim, float]] = [defaultdict(float) for _ in range(n)]
    owner: dict[str, int] = {}
    for gpu in sorted(units, key=lambda g: (-rel(g), g)):
        def after(s: int, gpu: str = gpu) -> tuple[float, float]:
            fr = [(loads[s][d] + w) / totals[d] for d, w in units[gpu].items() if totals[d] > 0]
            return (max(fr, default=0.0), sum(fr))
        best = min(range(n), key=lambda s: (after(s), s))
        owner[gpu] = best
        for d, w in units[gpu].items():
            loads[best][d] += w
    shares: list[set[str]] = [set() for _ in range(n)]
    for v in topology.vgpus.values():
        shares[owner.get(v.gpu or v.id, 0)].add(v.id)
    return [frozenset(s) for s in shares]


def share_pipeline(p: Pipeline, share: frozenset[str]) -> Pipeline | None:
    """The pipeline restricted to the share's vGPUs, at the throughput of its scarcest stage (None if a stage
    has no vGPU in the share)."""
    pools = [tuple(v for v in s.pool if v in share) for s in p.stages]
    if not all(pools):
        return None
    frac = min(len(a) / len(s.pool) for a, s in zip(pools, p.stages))
    return replace(p, stages=tuple(replace(s, pool=a) for s, a in zip(p.stages, pools)),
                   throughput_rps=p.throughput_rps * frac)


def shard_topology(topology: Topology, index: int, n: int) -> Topology:
    """Shard ``index`` of ``n`` (0-based): its vGPUs and the pipelines they complete; InputError if a model
    would have no complete pipeline in it (use fewer shards, or plan more GPUs per pool)."""
    if not 0 <= index < n:
        raise InputError(f"--shard {index}/{n}: expected 0 <= I < N")
    share = split_vgpus(topology, n)[index]
    pipelines = {}
    for model, pipes in topology.pipelines.items():
        kept = tuple(q for q in (share_pipeline(p, share) for p in pipes) if q is not None)
        if not kept:
            raise InputError(f"shard {index}/{n}: model {model} has no complete pipeline in this shard (a pool has "
                             f"fewer physical GPUs than shards); use fewer than {n} shards")
        pipelines[model] = kept
    return replace(topology, vgpus={k: v for k, v in topology.vgpus.items() if k in share}, pipelines=pipelines)


def model_throughput(topology: Topology) -> dict[str, float]:
    return {m: sum(p.throughput_rps for p in pipes) for m, pipes in topology.pipelines.items()}
