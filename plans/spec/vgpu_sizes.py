"""Unequal vGPU sizes of one GPU type (spec field ``cluster.vgpu_sizes``): MPS percentage splits or MIG profiles.

YAML::

    cluster:
      vgpu_sizes:
        L4: {mps_percent: [25, 25, 50]}              # one split of each GPU (or a list of splits)
        A100: {mig: [1g, 2g, 3g, 4g, 7g]}            # allowed MIG profiles; any valid MIG geometry of them

An MPS split is a list of thread percentages (each 1..100, together at most 100): each share is a vGPU of
its own, one tritonserver with ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` set to it. MIG profiles follow the
A100/H100 slice rules: 7 compute slices and 8 memory slices per GPU, and each profile may start only at
its allowed memory slices (1g: 0..6, 2g: 0/2/4, 3g: 0/4 over 4 memory slices, 4g: 0, 7g: 0); the
splits are the maximal sets of non-overlapping placements of the allowed profiles using <= 7 compute slices.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from poolpipe_common.errors import InputError

SPLIT_KINDS = ("mps_percent", "mig")  # cluster.vgpu_sizes.TYPE holds exactly one of these
MIG_GPU_PREFIXES = ("A100", "H100")
MIG_COMPUTE_SLICES = 7
# profile (compute slices) -> (memory slices it spans, allowed first memory slice)
MIG_PLACEMENTS: dict[int, tuple[int, tuple[int, ...]]] = {
    1: (1, (0, 1, 2, 3, 4, 5, 6)), 2: (2, (0, 2, 4)), 3: (4, (0, 4)), 4: (4, (0,)), 7: (8, (0,))}
_MIG_LABEL = re.compile(r"^([12347])g(\.\d+gb)?$")


@dataclass(frozen=True)
class VGpuSize:
    """One share of a GPU: its label ("25%", "3g.20gb"), its compute share (0, 1], MIG compute slices."""

    label: str
    share: float
    mig_slices: int | None = None

    @property
    def mps_percent(self) -> int:
        return round(self.share * 100)


@dataclass(frozen=True)
class GpuSplits:
    """The allowed ways to split one GPU of ``gpu`` into unequal vGPUs (``kind`` mps or mig)."""

    gpu: str
    kind: str
    sizes: tuple[VGpuSize, ...]  # distinct sizes, smallest share first
    patterns: tuple[tuple[str, ...], ...]  # each: the labels of one GPU's vGPUs
    raw: Any  # the spec's form, for to_dict

    def size(self, label: str) -> VGpuSize:
        for s in self.sizes:
            if s.label == label:
                return s
        raise KeyError(label)

    def counts(self, pattern: tuple[str, ...]) -> dict[str, int]:
        return {s.label: pattern.count(s.label) for s in self.sizes}

    def to_dict(self) -> dict[str, Any]:
        return {"mps_percent" if self.kind == "mps" else "mig": self.raw}


VGpuSizes = dict[str, GpuSplits]


def mig_layout(pattern: tuple[int, ...]) -> list[tuple[int, int]] | None:
    """(compute slices, first memory slice) of each profile of ``pattern`` in one valid placement, or None."""
    order = sorted(range(len(pattern)), key=lambda i: -pattern[i])
    used = [False] * 8
    starts = [0] * len(pattern)

    def place(j: int) -> bool:
        if j == len(order):
            return True
        g = pattern[order[j]]
        span, allowed = MIG_PLACEMENTS[g]
        for s in allowed:
            if not any(used[s:s + span]):
                used[s:s + span] = [True] * span
                starts[order[j]] = s
                if place(j + 1):
                    return True
                used[s:s + span] = [False] * span
        return False
    if sum(pattern) > MIG_COMPUTE_SLICES or not place(0):
        return None
    return [(g, s) for g, s in zip(pattern, starts)]


def mig_patterns(profiles: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Every maximal valid MIG geometry (multiset of compute slices, largest first) of the allowed profiles."""
    valid: set[tuple[int, ...]] = set()

    def grow(cur: tuple[int, ...]) -> None:
        for g in profiles:
            nxt = tuple(sorted((*cur, g), reverse=True))
            if nxt not in valid and mig_layout(nxt) is not None:
                valid.add(nxt)
                grow(nxt)
    grow(())

    def extendable(p: tuple[int, ...]) -> bool:
        return any(tuple(sorted((*p, g), reverse=True)) in valid for g in profiles)
    return sorted((p for p in valid if not extendable(p)), reverse=True)


def _mig_splits(gpu: str, raw: Any, where: str) -> GpuSplits:
    if not gpu.startswith(MIG_GPU_PREFIXES):
        raise InputError(f"{where}: MIG profiles are known for A100 and H100 GPUs, not {gpu}; use mps_percent")
    if not isinstance(raw, list) or not raw:
        raise InputError(f"{where}: expected a list of MIG profiles, e.g. [1g, 2g, 3g, 4g, 7g]")
    by_g: dict[int, str] = {}
    for x in raw:
        m = _MIG_LABEL.match(str(x))
        if m is None:
            raise InputError(f"{where}: {x!r} is not a MIG profile; use 1g, 2g, 3g, 4g or 7g (optionally "
                             "with memory, e.g. 3g.20gb)")
        g = int(m.group(1))
        if g in by_g:
            raise InputError(f"{where}: MIG profile {g}g is listed twice")
        by_g[g] = str(x)
    sizes = tuple(VGpuSize(by_g[g], g / MIG_COMPUTE_SLICES, g) for g in sorted(by_g))
    patterns = tuple(tuple(by_g[g] for g in p) for p in mig_patterns(tuple(sorted(by_g))))
    return GpuSplits(gpu, "mig", sizes, patterns, [str(x) for x in raw])


def _mps_splits(gpu: str, raw: Any, where: str) -> GpuSplits:
    if not isinstance(raw, list) or not raw:
        raise InputError(f"{where}: expected a list of MPS percentages, e.g. [25, 25, 50], or a list of such lists")
    splits = raw if all(isinstance(x, list) for x in raw) else [raw]
    patterns, shares = [], {}
    for split in splits:
        if not split or not all(isinstance(p, int) and not isinstance(p, bool) and 1 <= p <= 100 for p in split):
            raise InputError(f"{where}: {split!r}: each MPS percentage must be a whole number 1..100")
        if sum(split) > 100:
            raise InputError(f"{where}: {split!r} adds up to {sum(split)} % of one GPU; the shares of a GPU may "
                             "add up to at most 100")
        patterns.append(tuple(f"{p}%" for p in sorted(split)))
        shares.update({f"{p}%": p / 100 for p in split})
    sizes = tuple(sorted((VGpuSize(k, s) for k, s in shares.items()), key=lambda s: s.share))
    return GpuSplits(gpu, "mps", sizes, tuple(dict.fromkeys(patterns)), raw)


def parse_vgpu_sizes(raw: Any, gpu_types: list[str], where: str = "cluster.vgpu_sizes") -> VGpuSizes | None:
    """The spec's ``vgpu_sizes`` (None when absent), validated with one-line errors."""
    if raw is None:
        return None
    if not isinstance(raw, dict) or not raw:
        raise InputError(f"{where}: expected a map of GPU type -> {{mps_percent: [...]}} or {{mig: [...]}}, "
                         "e.g. {L4: {mps_percent: [25, 25, 50]}}")
    out: VGpuSizes = {}
    for gpu, entry in raw.items():
        w = f"{where}.{gpu}"
        if str(gpu) not in gpu_types:
            raise InputError(f"{w}: GPU type {gpu} is not in cluster.gpus ({', '.join(gpu_types)})")
        if not isinstance(entry, dict) or len(entry) != 1 or next(iter(entry)) not in SPLIT_KINDS:
            raise InputError(f"{w}: expected exactly one of mps_percent: [...] or mig: [...], got {entry!r}")
        kind, val = next(iter(entry.items()))
        out[str(gpu)] = (_mps_splits if kind == "mps_percent" else _mig_splits)(str(gpu), val, f"{w}.{kind}")
    return out


def vgpu_sizes_to_dict(sizes: VGpuSizes | None) -> dict[str, Any] | None:
    return None if sizes is None else {t: s.to_dict() for t, s in sizes.items()}
