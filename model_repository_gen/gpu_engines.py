"""Which engine each GPU partition runs, resolved once at generate time: the engine its profile measured.

A profile records the engine and the execution providers that timed it (``provenance.devices.<type>.engine``,
``.providers``; profiling.profiler), so the deployment runs what the plan's latencies were measured on.
``generate --engine TYPE=ENGINE`` names another (``trt``, ``ort-trt``, ``ort``, ``torch``), or ``cpu``: ONNX
Runtime on the CPU although the host has GPUs, the only way a GPU slot computes on the CPU. A profile that records
no engine (imported reference data) runs ``auto``: the partition backend takes the first GPU engine that loads,
and fails to load rather than fall back to the CPU. ``generate`` prints the choice per model and GPU type.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from plans.plan_json import ModelPlan
from poolpipe_common.errors import InputError

GPU_ENGINES = ("trt", "ort-trt", "ort", "torch")
CHOICES = (*GPU_ENGINES, "cpu", "auto")
BUILDS_TENSORRT = ("trt", "ort-trt", "auto")  # engines whose first load may build a TensorRT engine


@dataclass(frozen=True)
class EngineChoice:
    engine: str  # the backend's engine parameter
    device: str  # "" (the instance's kind) or "cpu" (asked for by name)
    source: str  # why: "profile", "--engine", or what is missing

    @property
    def name(self) -> str:
        """How the manifest and the printout name it: the engine, or 'cpu' for ONNX Runtime on the CPU."""
        return "cpu" if self.device == "cpu" else self.engine


def parse_engine_args(values: list[str]) -> dict[str, str]:
    """``--engine TYPE=ENGINE`` pairs -> {GPU type: engine}; InputError on a malformed or unknown one."""
    out: dict[str, str] = {}
    for v in values:
        gpu, sep, engine = v.partition("=")
        if not sep or not gpu or engine not in CHOICES:
            raise InputError(f"--engine {v!r}: expected GPU_TYPE=ENGINE with ENGINE one of {', '.join(CHOICES)}")
        if gpu in out:
            raise InputError(f"--engine {gpu}: given twice")
        out[gpu] = engine
    return out


def profiled_engine(m: ModelPlan, gpu_type: str) -> tuple[str | None, str]:
    """(the engine the model's profile measured ``gpu_type`` with, or None where it records none; its device)."""
    prov = m.profile.provenance
    per_device = prov.get("devices") if isinstance(prov.get("devices"), dict) else None
    entry = per_device.get(gpu_type) if per_device else (prov if len(m.profile.timings) == 1 else None)
    if not isinstance(entry, dict):
        return None, ""
    engine, device = entry.get("engine"), entry.get("device")
    return (engine if isinstance(engine, str) and engine else None), (device if isinstance(device, str) else "")


def choose_engine(m: ModelPlan, gpu_type: str, overrides: Mapping[str, str]) -> EngineChoice:
    """The engine of ``m``'s partitions on GPU hosts of ``gpu_type`` (module doc)."""
    named = overrides.get(gpu_type)
    if named == "cpu":
        return EngineChoice("ort", "cpu", "--engine")
    if named:
        return EngineChoice(named, "", "--engine")
    measured, device = profiled_engine(m, gpu_type)
    if measured is None:
        return EngineChoice("auto", "", "the profile records no engine")
    if measured not in GPU_ENGINES or device == "cpu":
        raise InputError(f"profile {m.profile.model}: {gpu_type} was measured with engine {measured} on the CPU, "
                         f"but its hosts have GPUs; measure it with --device cuda, or name the engine with "
                         f"generate --engine {gpu_type}=ENGINE (cpu: ONNX Runtime on the CPU, as measured)")
    return EngineChoice(measured, "", "profile")


def engine_lines(choices: Mapping[tuple[str, str], EngineChoice]) -> list[str]:
    """One printed line per (model, GPU type): which engine its GPU partitions run, and why."""
    return [f"engine of {model} on {gpu}: {c.name} ({c.source})" for (model, gpu), c in sorted(choices.items())]


def resolve_engines(plan_models: list[ModelPlan], gpu_pools: Mapping[tuple[str, str], bool],
                    overrides: Mapping[str, str]) -> dict[tuple[str, str], EngineChoice]:
    """(model, GPU type) -> its engine, for every pair that has partitions on GPU hosts (``gpu_pools``' keys)."""
    unknown = sorted(set(overrides) - {gpu for _, gpu in gpu_pools})
    if unknown:
        raise InputError(f"--engine {', '.join(unknown)}: no partition of the plan runs on GPU hosts of that type "
                         f"(GPU types with GPU hosts: {', '.join(sorted({g for _, g in gpu_pools})) or 'none'})")
    by_name = {m.name: m for m in plan_models}
    return {(model, gpu): choose_engine(by_name[model], gpu, overrides) for model, gpu in sorted(gpu_pools)}
