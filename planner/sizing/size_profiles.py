"""Timings of unequal vGPU sizes: a profile's per-size timings, measured or derived from its MPS levels.

A size is planned as a device of its own, ``<GPU>@<label>`` (e.g. ``L4@50%``, ``A100@3g.20gb``) at level 1.
A profile may carry that device directly (measured on the share: ``devices: {"L4@50%": {"1": ...}}``).
Where it does not, it is *derived* from the GPU type's measured MPS levels V (1/V of a GPU each): a
share s is treated as level 1/s; at a measured level its timings are used as they are; between two
measured levels each block's latency is interpolated linearly in the level; beyond the measured levels
the nearest level's latencies are scaled by level ratio (compute-bound scaling). Only batch sizes
profiled at every level used are kept. The plan's profile records how each size was obtained
(``provenance.vgpu_sizes``), so the plan report can say "derived".

For planning, each size also becomes a GPU type of the cluster (``expanded_cluster``) whose NIC share is in
proportion to its compute share (a 50 % vGPU gets half of its GPU's part of the server's NIC).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from plans.spec.planning_spec import ClusterSpec
from plans.spec.vgpu_sizes import VGpuSize, VGpuSizes
from profiling.profile import DeviceTiming, Profile

SEP = "@"


def sized_device(gpu: str, label: str) -> str:
    return f"{gpu}{SEP}{label}"


def split_device(device: str) -> tuple[str, str | None]:
    """('L4', '50%') for 'L4@50%'; ('L4', None) for a plain GPU type."""
    gpu, sep, label = device.partition(SEP)
    return (gpu, label) if sep else (device, None)


def _derived(levels: dict[int, DeviceTiming], share: float) -> tuple[DeviceTiming, str] | None:
    """The timing of a share from measured levels, and how it was derived (None without levels)."""
    if not levels:
        return None
    target = 1.0 / share
    measured = sorted(levels)
    exact = [v for v in measured if abs(v - target) < 1e-9]
    if exact:
        t = levels[exact[0]]
        return DeviceTiming(t.batch_sizes, t.latency_us.copy()), f"derived: MPS level V={exact[0]} as is"
    lo = [v for v in measured if v < target]
    hi = [v for v in measured if v > target]
    if lo and hi:
        a, b = levels[lo[-1]], levels[hi[0]]
        bs = tuple(x for x in a.batch_sizes if x in b.batch_sizes)
        if not bs:
            return None
        w = (target - lo[-1]) / (hi[0] - lo[-1])
        lat = np.stack([(1 - w) * a.column(x) + w * b.column(x) for x in bs], 1)
        return DeviceTiming(bs, lat), f"derived: interpolated between MPS levels V={lo[-1]} and V={hi[0]}"
    near = lo[-1] if lo else hi[0]
    t = levels[near]
    return (DeviceTiming(t.batch_sizes, t.latency_us * (target / near)),
            f"derived: MPS level V={near} scaled by {target / near:.3g}")


def size_timing(profile: Profile, gpu: str, size: VGpuSize) -> tuple[DeviceTiming, str] | None:
    """(timing, 'measured' or how it was derived) of one size, or None when the profile cannot give one."""
    dev = sized_device(gpu, size.label)
    if dev in profile.timings and 1 in profile.timings[dev]:
        return profile.timings[dev][1], "measured"
    return _derived(profile.timings.get(gpu, {}), size.share)


def sized_profile(profile: Profile, sizes: VGpuSizes) -> Profile:
    """``profile`` with a level-1 device for every size of every GPU type it can time (see module doc)."""
    timings = dict(profile.timings)
    notes = {}
    for gpu, splits in sizes.items():
        for s in splits.sizes:
            got = size_timing(profile, gpu, s)
            if got is not None:
                timings[sized_device(gpu, s.label)] = {1: got[0]}
                notes[sized_device(gpu, s.label)] = got[1]
    if not notes:
        return profile
    return replace(profile, timings=timings, provenance={**profile.provenance, "vgpu_sizes": notes})


def size_provenance(profile: Profile, device: str) -> str:
    """'measured' or how the sized device's timings were derived ('' for a plain GPU type)."""
    return str(profile.provenance.get("vgpu_sizes", {}).get(device, ""))


def expanded_cluster(cluster: ClusterSpec) -> ClusterSpec:
    """The cluster with each size as a GPU type of its own: at most G x (the most of it in one split) of them,
    level 1, its server NIC shared in proportion to compute (gpus_per_server / share)."""
    if not cluster.vgpu_sizes:
        return cluster
    gpus, per_server, levels = dict(cluster.gpus), dict(cluster.gpus_per_server), dict(cluster.vgpu_levels)
    for gpu, splits in cluster.vgpu_sizes.items():
        for s in splits.sizes:
            dev = sized_device(gpu, s.label)
            gpus[dev] = cluster.gpus[gpu] * max(p.count(s.label) for p in splits.patterns)
            per_server[dev] = cluster.gpus_per_server.get(gpu, 1) / s.share
            levels[dev] = 1
    return replace(cluster, gpus=gpus, gpus_per_server=per_server, vgpu_levels=levels, vgpu_sizes=None)
