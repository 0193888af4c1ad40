"""Block-level latency profiles: the JSON format, its validating loader, and latency lookups.

Format (``format: poolpipe.profile/1``)::

    {
      "format": "poolpipe.profile/1",
      "model": "resnet50",
      "input_bytes": 602112,                # bytes of the model input at batch 1 (null if unknown)
      "input_tensors": ["input"],           # the model's input tensor names (null if unknown)
      "blocks": [                           # in execution order
        {"name": "block0", "output_bytes": 802816,        # bytes crossing the boundary after it, batch 1
         "output_tensors": ["/layer1/Relu_output_0"]},    # tensor names at that boundary (null if unknown)
        ...
      ],
      "devices": {                          # device type -> vGPU level V (1 = whole GPU) -> timings
        "L4": {"1": {"batch_sizes": [1, 2, 4, 8],
                     "latency_us": [[...per batch size...], ...one row per block...]}}
      },
      "provenance": {"source": "...", "method": "...", ...},
      "memory": {"weight_bytes": [...], "activation_bytes": [...]},   # optional, profiling.block_memory
      "interference": {"cpu": {"per_corunner": ..., ...}}            # optional, profiling.interference
    }

Latencies are per block, in microseconds, of one vGPU while all V vGPUs of the GPU run at once. A timing
entry may add ``latency_quantiles``, the distribution of a variable-latency model (latency_quantiles.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from poolpipe_common.documents import as_int, check_fields, need, read_document
from poolpipe_common.errors import InputError
from profiling.block_memory import BlockMemory, memory_from_dict
from profiling.interference import InterferenceModel, interference_map_from_dict
from profiling.latency_quantiles import LatencyQuantiles, quantiles_from_dict

FORMAT = "poolpipe.profile/1"
PROFILE_FIELDS = ("format", "model", "input_bytes", "input_tensors", "blocks", "devices", "provenance", "memory",
                  "interference")
BLOCK_FIELDS = ("name", "output_bytes", "output_tensors")  # blocks[]
TIMING_FIELDS = ("batch_sizes", "latency_us", "latency_quantiles")  # devices.TYPE.V
MIN_BLOCK_US = 1.0  # every block counts as at least 1 µs (the reference planner's rule)


@dataclass(frozen=True)
class Block:
    name: str
    output_bytes: int | None  # bytes per request crossing the boundary after this block
    output_tensors: tuple[str, ...] | None = None


@dataclass(frozen=True)
class DeviceTiming:
    """Latencies of every block at the profiled batch sizes on one (device type, vGPU level)."""

    batch_sizes: tuple[int, ...]
    latency_us: np.ndarray  # shape (num_blocks, len(batch_sizes)): the median
    quantiles: LatencyQuantiles | None = None  # the distribution, where measured (variable-latency models)

    def column(self, batch: int) -> np.ndarray:
        """Per-block latency at ``batch`` (must be profiled)."""
        return self.latency_us[:, self.batch_sizes.index(batch)]


@dataclass(frozen=True)
class Profile:
    model: str
    blocks: tuple[Block, ...]
    timings: dict[str, dict[int, DeviceTiming]]  # device type -> V -> timing
    input_bytes: int | None = None
    input_tensors: tuple[str, ...] | None = None
    provenance: dict[str, Any] = field(default_factory=dict)
    memory: BlockMemory | None = None  # weights and activations per block (profiling.block_memory)
    interference: dict[str, InterferenceModel] = field(default_factory=dict)  # device type -> fitted model

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def devices(self) -> list[str]:
        return list(self.timings)

    def levels(self, device: str) -> list[int]:
        return sorted(self.timings[device])

    def batch_sizes(self, device: str, v: int) -> tuple[int, ...]:
        return self.timings[device][v].batch_sizes

    def latency_us(self, device: str, v: int, batch: int, first: int = 0, end: int | None = None) -> float:
        """Latency of blocks [first, end) at one batch size, each block counted as at least 1 µs."""
        end = self.num_blocks if end is None else end
        col = self.timings[device][v].column(batch)[first:end]
        return float(np.maximum(col, MIN_BLOCK_US).sum())

    def latency_quantiles_us(self, device: str, v: int, batch: int, first: int = 0,
                             end: int | None = None) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
        """(levels, latencies) of blocks [first, end) at ``batch``, or None where no distribution was profiled."""
        t = self.timings[device][v]
        if t.quantiles is None:
            return None
        end = self.num_blocks if end is None else end
        q = t.quantiles.partition(t.batch_sizes.index(batch), first, end, MIN_BLOCK_US)
        return t.quantiles.levels, tuple(float(x) for x in q)

    def boundary_bytes(self, cut: int) -> int:
        """Bytes per request of the tensor crossing cut ``cut`` (between block cut-1 and block cut)."""
        if not 0 < cut < self.num_blocks:
            raise ValueError(f"cut {cut} is not inside the model (1..{self.num_blocks - 1})")
        b = self.blocks[cut - 1].output_bytes
        if b is None:
            raise ValueError(f"profile {self.model}: boundary size after block {cut - 1} is unknown")
        return b

    def call_bytes(self, first: int, end: int) -> tuple[int, int]:
        """Bytes per request a stage call of blocks [first, end) sends (the model's input for the first) and gets
        back (0 where the profile does not know them)."""
        sent = (self.input_bytes if first == 0 else self.blocks[first - 1].output_bytes) or 0
        return sent, self.blocks[end - 1].output_bytes or 0

    def time_scaled(self, k: float) -> "Profile":
        """Every latency x ``k`` (an emulated cluster in slow motion, see plans.spec.planning_spec.time_dilated)."""
        if not k > 0:
            raise ValueError(f"time scale {k} must be > 0")
        timings = {d: {v: DeviceTiming(t.batch_sizes, t.latency_us * k, t.quantiles and t.quantiles.scaled(k))
                       for v, t in lv.items()}
                   for d, lv in self.timings.items()}
        return replace(self, timings=timings, provenance={**self.provenance, "time_scale": k})

    def fastest_latency_us(self, batch: int = 1) -> float:
        """Whole-model latency at ``batch`` on the fastest profiled device at V=1."""
        return min(self.latency_us(d, 1, batch) for d in self.timings if 1 in self.timings[d]
                   and batch in self.timings[d][1].batch_sizes)

    def to_dict(self) -> dict[str, Any]:
        extra: dict[str, Any] = {}
        if self.memory is not None:
            extra["memory"] = self.memory.to_dict()
        if self.interference:
            extra["interference"] = {d: m.to_dict() for d, m in self.interference.items()}
        return {
            "format": FORMAT,
            "model": self.model,
            "input_bytes": self.input_bytes,
            "input_tensors": list(self.input_tensors) if self.input_tensors else None,
            "blocks": [
                {"name": b.name, "output_bytes": b.output_bytes,
                 "output_tensors": list(b.output_tensors) if b.output_tensors else None}
                for b in self.blocks
            ],
            "devices": {
                dev: {str(v): _timing_dict(t) for v, t in sorted(levels.items())}
                for dev, levels in self.timings.items()
            },
            "provenance": self.provenance,
            **extra,
        }

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n")


def _timing_dict(t: DeviceTiming) -> dict[str, Any]:
    out: dict[str, Any] = {"batch_sizes": list(t.batch_sizes),
                           "latency_us": [[float(x) for x in row] for row in t.latency_us]}
    if t.quantiles is not None:
        out["latency_quantiles"] = t.quantiles.to_dict()
    return out


def _positive_int_or_none(x: Any, where: str) -> int | None:
    if x is None:
        return None
    return as_int(x, where, 0)


def _names(x: Any, where: str) -> tuple[str, ...] | None:
    if x is None:
        return None
    if not isinstance(x, list) or not all(isinstance(s, str) and s for s in x):
        raise InputError(f"{where}: expected a list of tensor names, got {x!r}")
    return tuple(x)


def profile_from_dict(d: Any, source: str = "profile") -> Profile:
    """Validate a profile document; every error names the offending field."""
    check_fields(d, PROFILE_FIELDS, source)
    fmt = need(d, "format", source)
    if fmt != FORMAT:
        raise InputError(f"{source}: field 'format' is {fmt!r}, expected {FORMAT!r}")
    model = need(d, "model", source)
    if not isinstance(model, str) or not model:
        raise InputError(f"{source}: field 'model' must be a non-empty string")
    raw_blocks = need(d, "blocks", source)
    if not isinstance(raw_blocks, list) or not raw_blocks:
        raise InputError(f"{source}: field 'blocks' must be a non-empty list")
    blocks = []
    for i, b in enumerate(raw_blocks):
        w = f"{source}: blocks[{i}]"
        check_fields(b, BLOCK_FIELDS, w)
        name = b.get("name", f"block{i}") if isinstance(b, dict) else None
        if not isinstance(name, str):
            raise InputError(f"{w}.name: expected a string")
        blocks.append(Block(name, _positive_int_or_none(need(b, "output_bytes", w), f"{w}.output_bytes"),
                            _names(b.get("output_tensors"), f"{w}.output_tensors")))
    devices = need(d, "devices", source)
    if not isinstance(devices, dict) or not devices:
        raise InputError(f"{source}: field 'devices' must be a non-empty object (device type -> levels)")
    timings: dict[str, dict[int, DeviceTiming]] = {}
    for dev, levels in devices.items():
        if not isinstance(levels, dict) or not levels:
            raise InputError(f"{source}: devices.{dev} must map vGPU levels ('1'..'4') to timings")
        timings[dev] = {}
        for vk, t in levels.items():
            w = f"{source}: devices.{dev}.{vk}"
            try:
                v = int(vk)
            except ValueError:
                raise InputError(f"{w}: vGPU level must be an integer 1..8, got {vk!r}") from None
            if not 1 <= v <= 8:
                raise InputError(f"{w}: vGPU level must be 1..8")
            check_fields(t, TIMING_FIELDS, w)
            bs = need(t, "batch_sizes", w)
            if (not isinstance(bs, list) or not bs
                    or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in bs)
                    or sorted(set(bs)) != bs):
                raise InputError(f"{w}.batch_sizes: expected increasing positive integers, got {bs!r}")
            lat = need(t, "latency_us", w)
            try:
                arr = np.asarray(lat, dtype=float)
            except (TypeError, ValueError):
                raise InputError(f"{w}.latency_us: expected a numeric matrix (blocks x batch sizes)") from None
            if arr.shape != (len(blocks), len(bs)):
                raise InputError(f"{w}.latency_us: shape {list(arr.shape)} but the profile has "
                                 f"{len(blocks)} blocks and {len(bs)} batch sizes")
            if not np.all(np.isfinite(arr)) or np.any(arr < 0):
                raise InputError(f"{w}.latency_us: latencies must be finite and non-negative")
            quantiles = t.get("latency_quantiles")
            if quantiles is not None:
                quantiles = quantiles_from_dict(quantiles, len(blocks), len(bs), f"{w}.latency_quantiles")
            timings[dev][v] = DeviceTiming(tuple(bs), arr, quantiles)
    prov = d.get("provenance", {})
    if not isinstance(prov, dict):
        raise InputError(f"{source}: field 'provenance' must be an object")
    memory = None if d.get("memory") is None else memory_from_dict(d["memory"], len(blocks), f"{source}: memory")
    interference = ({} if d.get("interference") is None
                    else interference_map_from_dict(d["interference"], f"{source}: interference"))
    return Profile(model, tuple(blocks), timings,
                   _positive_int_or_none(d.get("input_bytes"), f"{source}: input_bytes"),
                   _names(d.get("input_tensors"), f"{source}: input_tensors"), prov, memory, interference)


def load_profile(path: str | Path) -> Profile:
    """Read and validate a profile file; errors name the file and field."""
    return profile_from_dict(read_document(path, "profile"), str(path))
