"""The scheduler core's Topology of a real deployment, read from manifest.json."""

from __future__ import annotations

from model_repository_gen.manifest import Manifest, StageInfo
from profiling.profile import Profile
from scheduler.core.latency_dist import QuantileDist
from scheduler.core.topology import Pipeline, Stage, Topology, VGpu


def topology_from_manifest(manifest: Manifest,
                           extra_us: dict[str, list[dict[int, float]]] | None = None) -> Topology:
    """vGPUs sit behind their host's NIC; stage latency tables as profiled, up to the pipeline's batch, plus
    ``extra_us[pipeline id][stage][batch]`` where given (the tail the sidecar measured on top: the stage's hop,
    which the next stage and the answer wait for and the vGPU does not)."""
    extra_us = extra_us or {}
    profiles = {m.name: m.profile for m in manifest.plan.models}
    vgpus = {g.id: VGpu(g.id, g.gpu_type, g.v, g.host, f"{g.host}-gpu{g.gpu_index}") for g in manifest.vgpus}
    pipelines = {}
    for m in manifest.models:
        pipes = []
        for p in m.pipelines:
            extra = extra_us.get(p.id, [])
            stages = []
            for k, s in enumerate(p.stages):
                hop = {b: (extra[k].get(b, 0.0) if k < len(extra) else 0.0) for b in s.latency_us if b <= p.batch}
                stages.append(Stage(s.blocks, s.vgpus, {b: s.latency_us[b] + h for b, h in hop.items()},
                                    0 if k == 0 else s.network_bytes_per_request(),
                                    _distributions(profiles.get(m.name), s, p.batch, hop), hop,
                                    _call_bytes(profiles.get(m.name), s)))
            pipes.append(Pipeline(p.id, m.name, p.batch, tuple(stages), p.throughput_rps))
        pipelines[m.name] = tuple(pipes)
    gpu_counts: dict[str, int] = {}
    for h in manifest.hosts:
        gpu_counts[h.gpu_type] = gpu_counts.get(h.gpu_type, 0) + h.gpus
    bandwidth = min((h.bandwidth_gbps for h in manifest.hosts), default=10.0)
    return Topology(vgpus, pipelines, {m.name: m.slo_us for m in manifest.models}, bandwidth, gpu_counts,
                    {m.name: m.dynamic_batching for m in manifest.models if m.dynamic_batching.active})


def _call_bytes(profile: Profile | None, s: StageInfo) -> tuple[int, int]:
    """The profiled bytes per request the stage's call sends and gets back (what the cost model counts)."""
    return profile.call_bytes(*s.blocks) if profile is not None else (0, 0)


def _distributions(profile: Profile | None, s: StageInfo, batch: int,
                   extra: dict[int, float]) -> dict[int, QuantileDist] | None:
    """The stage's latency distribution per batch size where the profile has one (shifted like the medians)."""
    if profile is None or s.gpu_type not in profile.timings or s.v not in profile.timings[s.gpu_type]:
        return None
    out = {}
    for b in s.latency_us:
        if b <= batch and b in profile.batch_sizes(s.gpu_type, s.v):
            q = profile.latency_quantiles_us(s.gpu_type, s.v, b, *s.blocks)
            if q is not None:
                out[b] = QuantileDist(*q).shifted(extra.get(b, 0.0))
    return out or None
