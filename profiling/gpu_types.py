"""The one table of GPU types: the names NVML reports, the label poolpipe gives them, memory and bandwidth.

A GPU type is a short label (``L4``, ``T4``, ``A100-80``) used by profiles, plans, cluster files, the device
tables (profiling.block_memory), ``launch``'s hardware check and the Kubernetes product labels. NVML names a
card by its product ("NVIDIA A100-SXM4-80GB", "Tesla V100-SXM2-16GB", "NVIDIA H100 80GB HBM3"); ``gpu_label``
maps every variant to its label, so a profile measured on a card, the plan's GPU type and ``launch``'s check
agree. A memory variant (A100-80, V100-32) belongs to its family (A100, V100): ``launch`` accepts it where the
cluster file names the family, whose table memory is the smaller.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class GpuType:
    label: str
    pattern: str  # regular expression over the NVML name, upper case, '-' and '_' read as spaces
    memory_gb: float
    bandwidth_gbs: float
    nvml_names: tuple[str, ...]  # names NVML reports for it (GPU Feature Discovery's product label: spaces as '-')
    family: str = ""  # the type this is a memory variant of

    @property
    def products(self) -> tuple[str, ...]:
        """``nvidia.com/gpu.product`` values of this type (GPU Feature Discovery writes the NVML name, '-' for ' ')."""
        return tuple(n.replace(" ", "-") for n in self.nvml_names)


# Ordered: the first whose pattern matches names the card (memory variants before their family). Memory and
# bandwidth from the vendors' data sheets.
GPU_TYPES: tuple[GpuType, ...] = (
    GpuType("H200", r"\bH200\b", 141.0, 4800.0, ("NVIDIA H200", "NVIDIA H200 NVL")),
    GpuType("H100", r"\bH100\b", 80.0, 3350.0, ("NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA H100 NVL")),
    GpuType("A100-80", r"\bA100\b.*\b80 ?GB\b", 80.0, 2039.0,
            ("NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe"), family="A100"),
    GpuType("A100", r"\bA100\b", 40.0, 1555.0, ("NVIDIA A100-SXM4-40GB", "NVIDIA A100-PCIE-40GB")),
    GpuType("A10", r"\bA10\b", 24.0, 600.0, ("NVIDIA A10",)),
    GpuType("V100-32", r"\bV100S?\b.*\b32 ?GB\b", 32.0, 900.0,
            ("Tesla V100-SXM2-32GB", "Tesla V100-PCIE-32GB", "Tesla V100S-PCIE-32GB"), family="V100"),
    GpuType("V100", r"\bV100\b", 16.0, 900.0, ("Tesla V100-SXM2-16GB", "Tesla V100-PCIE-16GB")),
    GpuType("L4", r"\bL4\b", 24.0, 300.0, ("NVIDIA L4",)),
    GpuType("T4", r"\bT4\b", 16.0, 320.0, ("Tesla T4", "NVIDIA T4")),
    GpuType("P4", r"\bP4\b", 8.0, 192.0, ("Tesla P4",)),
)
BY_LABEL = {t.label: t for t in GPU_TYPES}


def _words(name: str) -> str:
    return " ".join(name.upper().replace("-", " ").replace("_", " ").split())


def gpu_type_of(nvml_name: str) -> GpuType | None:
    """The table's type of a card NVML names ``nvml_name``, or None for a card it does not know."""
    words = _words(nvml_name)
    for t in GPU_TYPES:
        if re.search(t.pattern.replace("-", " "), words):
            return t
    return None


def gpu_label(nvml_name: str) -> str:
    """The GPU type label of an NVML name ("NVIDIA A100-SXM4-80GB" -> "A100-80", "Tesla T4" -> "T4"); a card the
    table does not know keeps its name without the vendor words, spaces as '-' ("NVIDIA RTX A4000" -> "RTX-A4000")."""
    t = gpu_type_of(nvml_name)
    if t is not None:
        return t.label
    words = [w for w in nvml_name.split() if w.upper() not in ("NVIDIA", "TESLA", "GEFORCE")]
    return "-".join(words) or "cuda"


def label_matches(gpu_type: str, nvml_name: str) -> bool:
    """Whether a card NVML names ``nvml_name`` is of the cluster file's ``gpu_type`` (its label or its family)."""
    t = gpu_type_of(nvml_name)
    label = gpu_label(nvml_name)
    return gpu_type.upper() in {label.upper(), (t.family if t else "").upper()}


def gpu_products(gpu_type: str) -> tuple[str, ...]:
    """GPU Feature Discovery's ``nvidia.com/gpu.product`` values for a type (with its memory variants): empty where
    the table does not know it."""
    return tuple(p for t in GPU_TYPES if gpu_type in (t.label, t.family) for p in t.products)
