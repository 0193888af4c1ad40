"""``poolpipe serve --shard I/N``: the part of a manifest one sidecar shard serves (scheduler/core/shards.py
decides the split; every shard computes the same split from the same manifest, so none shares state)."""

from __future__ import annotations

from dataclasses import replace

from model_repository_gen.manifest import Manifest
from poolpipe_common.errors import InputError
from scheduler.core.shards import shard_topology
from scheduler.server.planned.manifest_topology import topology_from_manifest


def parse_shard(text: str) -> tuple[int, int]:
    """``I/N`` -> (I, N) with 0 <= I < N."""
    i, sep, n = text.partition("/")
    if not sep or not i.isdigit() or not n.isdigit() or not 0 <= int(i) < int(n):
        raise InputError(f"--shard {text!r}: expected I/N with 0 <= I < N, e.g. 0/2 and 1/2 for two shards")
    return int(i), int(n)


def check_split(manifest: Manifest, n: int) -> None:
    """Every one of ``n`` shares must hold a complete pipeline of every model; else say how many shares fit."""
    def splits(k: int) -> bool:
        try:
            for i in range(k):
                manifest_shard(manifest, i, k)
        except InputError:
            return False
        return True

    if not splits(n):
        most = next((k for k in range(n - 1, 1, -1) if splits(k)), 1)
        raise InputError(f"--workers {n}: the plan cannot be split into {n} shares that each hold a complete "
                         f"pipeline of every model (a pool has fewer physical GPUs than workers); this plan "
                         f"supports at most {most} worker{'s' if most > 1 else ''}")


def manifest_shard(manifest: Manifest, index: int, n: int) -> Manifest:
    """The manifest with only shard ``index``'s vGPUs, each pipeline's pools cut to them (pipelines left without
    a stage dropped) at the shard's planned throughput."""
    if n == 1:
        return manifest
    topo = shard_topology(topology_from_manifest(manifest), index, n)
    kept = {p.id: p for pipes in topo.pipelines.values() for p in pipes}
    models = []
    for m in manifest.models:
        pipes = tuple(replace(p, throughput_rps=kept[p.id].throughput_rps,
                              stages=tuple(replace(s, vgpus=k.pool) for s, k in zip(p.stages, kept[p.id].stages)))
                      for p in m.pipelines if p.id in kept)
        models.append(replace(m, pipelines=pipes))
    used = {v for m in models for p in m.pipelines for s in p.stages for v in s.vgpus}
    return replace(manifest, vgpus=tuple(g for g in manifest.vgpus if g.id in used), models=tuple(models))
