"""The planning spec: one planning problem (cluster, limits, models with SLOs), loaded and validated.

YAML or JSON::

    cluster:
      gpus: {L4: 25, T4: 75}            # GPU type -> count
      gpus_per_server: {L4: 4, T4: 2}   # GPUs that share one server's NIC (default 1)
      bandwidth_gbps: 10                # effective NIC bandwidth per server
      vgpu_levels: {L4: 4, T4: 4}       # V may be 1..this (default 1)
      gpu_memory_gb: {V100: 32}         # device memory per GPU type (default: L4 24, T4 16, P4 8, V100 16, H100 80)
      vgpu_sizes: {L4: {mps_percent: [25, 25, 50]}}   # optional unequal shares (plans/spec/vgpu_sizes.py)
    max_partitions: 3
    colocate: false                     # true: vGPUs of different (model, partition) share a GPU (planner.colocation)
    batch_unification: true
    applications: [...]                 # optional DAGs of these models with one SLO each (plans/spec/applications.py)
    models:
      - profile: path/to/profile.json   # relative to the spec file
        slo_us: 33278                   # or slo_multiplier: 5
        slo_margin_us: 3328             # or slo_margin: 0.1
        batch_wait_us_per_request: 130
        weight: 1.0
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from plans.spec.applications import AppSpec, apps_from_list
from plans.spec.vgpu_sizes import VGpuSizes, parse_vgpu_sizes, vgpu_sizes_to_dict
from poolpipe_common.documents import as_float, as_int, check_fields, read_document
from poolpipe_common.errors import InputError
from profiling.block_memory import DEVICE_MEMORY_GB
from profiling.profile import Profile, load_profile, profile_from_dict


@dataclass(frozen=True)
class ClusterSpec:
    gpus: dict[str, int]
    gpus_per_server: dict[str, int]
    bandwidth_gbps: float
    vgpu_levels: dict[str, int]
    gpu_memory_gb: dict[str, float] = field(default_factory=dict)  # overrides of DEVICE_MEMORY_GB
    vgpu_sizes: VGpuSizes | None = None  # unequal shares per GPU type (None: only the equal levels)

    @property
    def gpu_types(self) -> list[str]:
        return list(self.gpus)

    def memory_bytes(self, gpu_type: str) -> float | None:
        """Device memory of one GPU of ``gpu_type`` (None: unknown type, no limit)."""
        gb = self.gpu_memory_gb.get(gpu_type, DEVICE_MEMORY_GB.get(gpu_type))
        return None if gb is None else gb * 1e9

    def to_dict(self) -> dict[str, Any]:
        d = {"gpus": dict(self.gpus), "gpus_per_server": dict(self.gpus_per_server),
             "bandwidth_gbps": self.bandwidth_gbps, "vgpu_levels": dict(self.vgpu_levels)}
        if self.gpu_memory_gb:
            d["gpu_memory_gb"] = dict(self.gpu_memory_gb)
        if self.vgpu_sizes is not None:
            d["vgpu_sizes"] = vgpu_sizes_to_dict(self.vgpu_sizes)
        return d


@dataclass(frozen=True)
class ModelSpec:
    profile: Profile
    slo_us: float
    slo_margin_us: float = 0.0
    batch_wait_us_per_request: float = 0.0
    weight: float = 1.0
    profile_path: str | None = None
    # What serving adds to every partition's latency beyond compute (the sidecar's lead and tail per stage call);
    # set by the sustained objective from the overheads, 0 where a plan reproduces the paper.
    stage_overhead_us: float = 0.0

    @property
    def name(self) -> str:
        return self.profile.model

    @property
    def latency_budget_us(self) -> float:
        """What a planned pipeline's latency (incl. batch forming) may reach: SLO minus margin."""
        return self.slo_us - self.slo_margin_us

    def to_dict(self) -> dict[str, Any]:
        return {"profile": self.profile_path, "model": self.name, "slo_us": self.slo_us,
                "slo_margin_us": self.slo_margin_us,
                "batch_wait_us_per_request": self.batch_wait_us_per_request, "weight": self.weight}


@dataclass(frozen=True)
class PlanningSpec:
    cluster: ClusterSpec
    models: tuple[ModelSpec, ...]
    max_partitions: int = 3
    batch_unification: bool = True
    colocate: bool = False  # plan with planner.colocation.colocate: GPUs shared across (model, partition) pairs
    applications: tuple[AppSpec, ...] = ()  # DAGs of the models with end-to-end SLOs (plans.spec.applications)

    def to_dict(self) -> dict[str, Any]:
        """Serialisable form; profiles are referenced by path (plan.json embeds them separately)."""
        return {"cluster": self.cluster.to_dict(), "max_partitions": self.max_partitions,
                "batch_unification": self.batch_unification, **({"colocate": True} if self.colocate else {}),
                "models": [m.to_dict() for m in self.models],
                **({"applications": [a.to_dict() for a in self.applications]} if self.applications else {})}


def _num(x: Any, where: str, *, positive: bool = False, integer: bool = False) -> float:
    x = as_int(x, where) if integer else as_float(x, where)
    if x < 0 or (positive and x == 0):
        raise InputError(f"{where}: must be {'> 0' if positive else '>= 0'}, got {x!r}")
    return int(x) if integer else float(x)


def _type_map(x: Any, where: str, *, default: int | None = None, types: list[str] | None = None) -> dict[str, int]:
    if x is None:
        if default is None:
            raise InputError(f"{where}: missing")
        return {t: default for t in types or []}
    if not isinstance(x, dict) or not x:
        raise InputError(f"{where}: expected a map of GPU type -> count, e.g. {{L4: 25, T4: 75}}")
    out = {str(k): _num(v, f"{where}.{k}", integer=True) for k, v in x.items()}
    if types is not None:
        unknown = sorted(set(out) - set(types))
        if unknown:
            raise InputError(f"{where}: GPU type(s) {', '.join(unknown)} not in cluster.gpus ({', '.join(types)})")
        out = {t: out.get(t, default if default is not None else 1) for t in types}
    return out


CLUSTER_FIELDS = ("gpus", "gpus_per_server", "bandwidth_gbps", "vgpu_levels", "gpu_memory_gb", "vgpu_sizes")
MODEL_FIELDS = ("profile", "model", "slo_us", "slo_multiplier", "slo_margin_us", "slo_margin",
                "batch_wait_us_per_request", "weight")
SPEC_FIELDS = ("cluster", "max_partitions", "batch_unification", "colocate", "models", "applications")


def cluster_from_dict(d: Any, where: str = "cluster") -> ClusterSpec:
    check_fields(d, CLUSTER_FIELDS, where)
    if "gpus" not in d:
        raise InputError(f"{where}: missing field 'gpus' (GPU type -> count)")
    gpus = _type_map(d["gpus"], f"{where}.gpus")
    if sum(gpus.values()) == 0:
        raise InputError(f"{where}.gpus: the cluster has zero GPUs")
    types = list(gpus)
    per_server = _type_map(d.get("gpus_per_server"), f"{where}.gpus_per_server", default=1, types=types)
    levels = _type_map(d.get("vgpu_levels"), f"{where}.vgpu_levels", default=1, types=types)
    for t in types:
        if per_server[t] < 1:
            raise InputError(f"{where}.gpus_per_server.{t}: must be >= 1")
        if not 1 <= levels[t] <= 8:
            raise InputError(f"{where}.vgpu_levels.{t}: must be 1..8, got {levels[t]}")
    if "bandwidth_gbps" not in d:
        raise InputError(f"{where}: missing field 'bandwidth_gbps' (effective NIC bandwidth per server)")
    bw = _num(d["bandwidth_gbps"], f"{where}.bandwidth_gbps", positive=True)
    mem = d.get("gpu_memory_gb") or {}
    if not isinstance(mem, dict):
        raise InputError(f"{where}.gpu_memory_gb: expected a map of GPU type -> GB, e.g. {{V100: 32}}")
    memory = {str(t): _num(x, f"{where}.gpu_memory_gb.{t}", positive=True) for t, x in mem.items()}
    return ClusterSpec(gpus, per_server, bw, levels, memory,
                       parse_vgpu_sizes(d.get("vgpu_sizes"), types, f"{where}.vgpu_sizes"))


def model_spec_from_dict(d: Any, where: str, base_dir: Path | None = None,
                         profile: Profile | None = None) -> ModelSpec:
    """Build one model entry; ``profile`` may be given directly (else loaded from d['profile'])."""
    check_fields(d, MODEL_FIELDS, where)
    path = None
    if profile is None:
        if "profile" not in d:
            raise InputError(f"{where}: missing field 'profile' (path to a profile JSON)")
        raw = d["profile"]
        if isinstance(raw, dict):
            profile = profile_from_dict(raw, f"{where}.profile")
        else:
            p = Path(str(raw))
            if base_dir is not None and not p.is_absolute():
                p = base_dir / p
            path = str(p)
            profile = load_profile(p)
    if "model" in d and d["model"] != profile.model:
        raise InputError(f"{where}.model: {d['model']!r} but the profile is of model {profile.model!r}")
    fastest = profile.fastest_latency_us(1)
    if "slo_us" in d:
        slo = _num(d["slo_us"], f"{where}.slo_us", positive=True)
    elif "slo_multiplier" in d:
        slo = _num(d["slo_multiplier"], f"{where}.slo_multiplier", positive=True) * fastest
    else:
        raise InputError(f"{where}: give slo_us or slo_multiplier")
    if "slo_margin_us" in d:
        margin = _num(d["slo_margin_us"], f"{where}.slo_margin_us")
    else:
        margin = _num(d.get("slo_margin", 0.0), f"{where}.slo_margin") * slo
    if slo - margin < fastest:
        raise InputError(f"{where}: SLO {slo:.0f} us minus margin {margin:.0f} us is below the fastest "
                         f"possible latency of {profile.model} ({fastest:.0f} us at batch 1); raise the SLO")
    wait = _num(d.get("batch_wait_us_per_request", 0.0), f"{where}.batch_wait_us_per_request")
    weight = _num(d.get("weight", 1.0), f"{where}.weight", positive=True)
    return ModelSpec(profile, slo, margin, wait, weight, path)


def time_dilated(spec: PlanningSpec, k: float) -> PlanningSpec:
    """The same planning problem in slow motion: every latency, SLO and margin x ``k``, NIC bandwidth / ``k``.
    Plans keep their structure and their load factors, at 1/``k`` of the request rate: how a small machine
    emulates a large cluster without its per-request CPU costs growing relative to the compute."""
    models = tuple(replace(m, profile=m.profile.time_scaled(k), slo_us=m.slo_us * k,  # raises unless k > 0
                           slo_margin_us=m.slo_margin_us * k,
                           batch_wait_us_per_request=m.batch_wait_us_per_request * k) for m in spec.models)
    cluster = replace(spec.cluster, bandwidth_gbps=spec.cluster.bandwidth_gbps / k)
    return replace(spec, cluster=cluster, models=models)


def check_spec(spec: PlanningSpec) -> PlanningSpec:
    """Cross-checks between the cluster and the profiles; returns the spec unchanged when it is sound."""
    if spec.max_partitions < 1:
        raise InputError(f"max_partitions must be >= 1, got {spec.max_partitions}")
    if not spec.models:
        raise InputError("models: at least one model is needed")
    names = [m.name for m in spec.models]
    if len(set(names)) != len(names):
        raise InputError(f"models: the same model appears twice ({names})")
    for m in spec.models:
        usable = [t for t in spec.cluster.gpu_types if t in m.profile.timings]
        if not usable:
            raise InputError(f"model {m.name}: its profile has none of the cluster's GPU types "
                             f"(profile: {', '.join(m.profile.devices)}; cluster: {', '.join(spec.cluster.gpu_types)})")
    for t, levels in spec.cluster.vgpu_levels.items():
        if not any(t in m.profile.timings for m in spec.models):
            raise InputError(f"cluster.gpus: GPU type {t} is not profiled for any model "
                             f"(profiled: {sorted({d for m in spec.models for d in m.profile.devices})})")
        for m in spec.models:
            if t in m.profile.timings:
                missing = [v for v in range(1, levels + 1) if v not in m.profile.timings[t]]
                if missing:
                    raise InputError(f"cluster.vgpu_levels.{t} = {levels}, but profile {m.name} has no "
                                     f"{t} timings at V = {missing}; lower vgpu_levels or profile those levels")
    return spec


def spec_from_dict(d: Any, base_dir: Path | None = None, source: str = "spec") -> PlanningSpec:
    check_fields(d, SPEC_FIELDS, source)
    if "cluster" not in d:
        raise InputError(f"{source}: missing field 'cluster'")
    cluster = cluster_from_dict(d["cluster"], f"{source}: cluster")
    raw_models = d.get("models")
    if not isinstance(raw_models, list) or not raw_models:
        raise InputError(f"{source}: field 'models' must be a non-empty list")
    models = tuple(model_spec_from_dict(m, f"{source}: models[{i}]", base_dir) for i, m in enumerate(raw_models))
    maxp = _num(d.get("max_partitions", 3), f"{source}: max_partitions", positive=True, integer=True)
    bu, co = d.get("batch_unification", True), d.get("colocate", False)
    if not isinstance(bu, bool) or not isinstance(co, bool):
        raise InputError(f"{source}: {'batch_unification' if not isinstance(bu, bool) else 'colocate'} "
                         "must be true or false")
    apps = apps_from_list(d.get("applications"), [m.name for m in models], source)
    return check_spec(PlanningSpec(cluster, models, int(maxp), bu, co, apps))


def load_spec(path: str | Path) -> PlanningSpec:
    return spec_from_dict(read_document(path, "spec", yaml_ok=True), Path(path).parent, str(path))
