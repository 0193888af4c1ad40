"""Sidecar shards: every pool's vGPUs split into N disjoint shares of whole physical GPUs, balanced by
planned throughput, so N sidecars each serve 1/N of the load with no shared state.

A vGPU of stage k of pipeline p carries ``throughput(p) / |pool(p, k)|`` of that stage's planned
throughput. Physical GPUs (all their vGPUs together) are dealt, largest first, to the share whose
resulting load, relative to each touched stage's total, stays lowest; then pairs of GPUs swap shares
while that raises the least-served (share, model) and keeps every stage within one GPU of its 1/N.
A share serves a pipeline at the throughput of its scarcest stage; pipelines it holds no vGPU of some
stage of are dropped from it.
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


def shard_units(topology: Topology, n: int) -> tuple[dict[str, tuple[str, ...]], dict[str, dict[Dim, float]],
                                                       dict[Dim, float]]:
    """What the split deals: physical GPUs, except that the GPUs of a pipeline too small to split (a stage on
    fewer GPUs than shares) stay together. Returns unit -> its GPUs, unit -> weight per stage, stage totals."""
    gpus, totals = gpu_weights(topology)
    parent = {g: g for g in gpus}

    def root(g: str) -> str:
        while parent[g] != g:
            parent[g] = parent[parent[g]]
            g = parent[g]
        return g

    for pipes in topology.pipelines.values():
        for p in pipes:
            on = [sorted({topology.vgpus[v].gpu or v for v in s.pool}) for s in p.stages]
            if min(len(x) for x in on) < n:
                mine = [g for x in on for g in x]
                for g in mine[1:]:
                    parent[root(g)] = root(mine[0])
    members: dict[str, list[str]] = defaultdict(list)
    for g in sorted(gpus):
        members[root(g)].append(g)
    weights: dict[str, dict[Dim, float]] = {}
    for u, gs in members.items():
        weights[u] = defaultdict(float)
        for g in gs:
            for d, w in gpus[g].items():
                weights[u][d] += w
    return {u: tuple(gs) for u, gs in members.items()}, weights, totals


class _Split:
    """An assignment of physical GPUs to shares, with each share's load per stage."""

    def __init__(self, topology: Topology, n: int) -> None:
        self.n = n
        self.members, self.units, self.totals = shard_units(topology, n)
        self.biggest = {d: max(w[d] for w in self.units.values() if d in w) for d in self.totals}
        self.pipes = [(m, p.id, p.throughput_rps, len(p.stages)) for m, ps in topology.pipelines.items() for p in ps]
        self.model_total = {m: sum(p.throughput_rps for p in ps) for m, ps in topology.pipelines.items()}
        self.loads: list[dict[Dim, float]] = [defaultdict(float) for _ in range(n)]
        self.owner: dict[str, int] = {}

    def put(self, gpu: str, share: int, sign: float = 1.0) -> None:
        if sign > 0:
            self.owner[gpu] = share
        for d, w in self.units[gpu].items():
            self.loads[share][d] += sign * w

    def move(self, gpu: str, share: int) -> None:
        self.put(gpu, self.owner[gpu], -1.0)
        self.put(gpu, share)

    def balanced(self, gpus: list[str]) -> bool:
        """Every stage the units touch: each share within one unit's worth of its 1/N of the stage's throughput."""
        dims = {d for g in gpus for d in self.units[g]}
        return all(abs(self.loads[s][d] - self.totals[d] / self.n) <= self.biggest[d] * (1 + 1e-9) + 1e-9
                   for d in dims for s in range(self.n))

    def served(self) -> list[float]:
        """Each (share, model)'s throughput as a fraction of its 1/N, ascending (to compare lexicographically)."""
        out: dict[tuple[int, str], float] = defaultdict(float)
        for s in range(self.n):
            for m, pid, rps, stages in self.pipes:
                frac = min(self.loads[s][(pid, k)] / self.totals[(pid, k)] for k in range(stages))
                out[(s, m)] += rps * frac * self.n / self.model_total[m] if self.model_total[m] else 1.0
        return sorted(out.values())

    def greedy(self) -> None:
        """Largest units first, each to the share whose load in the stages it serves stays lowest (ties: the
        share with the least load overall)."""
        def rel(g: str) -> float:
            return sum(w / self.totals[d] for d, w in self.units[g].items())

        def overall(s: int) -> float:
            return sum(x / self.totals[d] for d, x in self.loads[s].items())

        for g in sorted(self.units, key=lambda g: (-rel(g), g)):
            def after(s: int, g: str = g) -> float:
                return max(((self.loads[s][d] + w) / self.totals[d] for d, w in self.units[g].items()), default=0.0)
            self.put(g, min(range(self.n), key=lambda s: (after(s), overall(s), s)))

    def improve(self, max_tries: int = 40_000) -> None:
        """Move single GPUs, and swap pairs, between shares while that raises the least-served (share, model)
        and keeps every stage balanced: pipelines too small to split (a stage on fewer GPUs than shares) even
        out elsewhere."""
        gpus = sorted(self.units)
        self.best, self.tries, better = self.served(), 0, True
        while better and self.tries < max_tries:
            better = False
            for i, a in enumerate(gpus):
                for s in range(self.n):
                    better |= self._try([(a, s)])
                for b in gpus[i + 1:]:
                    better |= self._try([(a, self.owner[b]), (b, self.owner[a])])

    def _try(self, moves: list[tuple[str, int]]) -> bool:
        """Apply the moves; keep them if balanced and better, else undo."""
        undo = [(g, self.owner[g]) for g, _ in moves]
        if all(self.owner[g] == s for g, s in moves):
            return False
        self.tries += 1
        for g, s in moves:
            self.move(g, s)
        got = self.served() if self.balanced([g for g, _ in moves]) else None
        if got is not None and got > self.best:
            self.best = got
            return True
        for g, s in reversed(undo):
            self.move(g, s)
        return False


def split_vgpus(topology: Topology, n: int) -> list[frozenset[str]]:
    """N disjoint shares of the vGPUs that together cover every vGPU of the topology once."""
    if n < 1:
        raise InputError(f"shards: expected N >= 1, got {n}")
    split = _Split(topology, n)
    split.greedy()
    if n > 1:
        split.improve()
    owner = {g: split.owner[u] for u, gs in split.members.items() for g in gs}
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
