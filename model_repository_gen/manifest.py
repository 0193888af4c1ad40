"""manifest.json: what runs where, written by ``poolpipe generate`` and read by the sidecar and the simulator.

It embeds the plan (so the scheduler has the profiles' latency tables) and adds the concrete
placement: hosts, every vGPU with its Triton endpoints, and for each planned model its Triton-facing
inputs/outputs and, per pipeline, the stages with their Triton partition model, boundary tensors and
pool of vGPUs.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from planner.plan import Plan, plan_from_dict
from poolpipe_common.documents import read_document
from poolpipe_common.errors import InputError
from poolpipe_common.tensors import DATATYPES, TensorSpec

FORMAT = "poolpipe.manifest/1"
@dataclass(frozen=True)
class HostInfo:
    name: str
    address: str
    gpu_type: str
    gpus: int
    bandwidth_gbps: float


@dataclass(frozen=True)
class VGpuInfo:
    id: str  # e.g. "hostA-gpu0-s1"
    host: str
    gpu_type: str
    gpu_index: int  # physical GPU on the host
    slot: int  # 0..v-1
    v: int  # the GPU is split into v vGPUs (MPS thread percentage 100/v)
    grpc_url: str  # "address:port"
    http_url: str
    metrics_url: str
    repository: str  # model repository, relative to the manifest's directory
    kind: str  # "KIND_GPU" or "KIND_CPU"
    env: dict[str, str]  # environment of its tritonserver (CUDA_VISIBLE_DEVICES, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE)


@dataclass(frozen=True)
class StageInfo:
    triton_model: str  # partition model name in the vGPUs' repositories
    blocks: tuple[int, int]
    gpu_type: str
    v: int
    vgpus: tuple[str, ...]  # the pool
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    latency_us: dict[int, float]  # batch -> latency of this stage (from the profile)


@dataclass(frozen=True)
class PipelineInfo:
    id: str  # "<model>/<index>"
    batch: int
    throughput_rps: float
    latency_us: float
    stages: tuple[StageInfo, ...]


@dataclass(frozen=True)
class ModelInfo:
    name: str
    slo_us: float
    max_batch_size: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    pipelines: tuple[PipelineInfo, ...]


@dataclass(frozen=True)
class Manifest:
    hosts: tuple[HostInfo, ...]
    vgpus: tuple[VGpuInfo, ...]
    models: tuple[ModelInfo, ...]
    plan: Plan
    root: Path = Path(".")  # directory the manifest was loaded from

    def vgpu(self, vgpu_id: str) -> VGpuInfo:
        for g in self.vgpus:
            if g.id == vgpu_id:
                return g
        raise KeyError(vgpu_id)

    def model(self, name: str) -> ModelInfo:
        for m in self.models:
            if m.name == name:
                return m
        raise KeyError(name)

    def host(self, name: str) -> HostInfo:
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        def tensors(ts: tuple[TensorSpec, ...]) -> list[dict[str, Any]]:
            return [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in ts]

        return {
            "format": FORMAT,
            "hosts": [asdict(h) for h in self.hosts],
            "vgpus": [asdict(g) for g in self.vgpus],
            "models": [{
                "name": m.name, "slo_us": m.slo_us, "max_batch_size": m.max_batch_size,
                "inputs": tensors(m.inputs), "outputs": tensors(m.outputs),
                "pipelines": [{
                    "id": p.id, "batch": p.batch, "throughput_rps": p.throughput_rps, "latency_us": p.latency_us,
                    "stages": [{"triton_model": s.triton_model, "blocks": list(s.blocks), "gpu_type": s.gpu_type,
                                "v": s.v, "vgpus": list(s.vgpus), "inputs": tensors(s.inputs),
                                "outputs": tensors(s.outputs),
                                "latency_us": {str(b): x for b, x in sorted(s.latency_us.items())}}
                               for s in p.stages]} for p in m.pipelines]} for m in self.models],
            "plan": self.plan.to_dict(),
        }

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n")


def _get(d: Any, key: str, where: str) -> Any:
    if not isinstance(d, dict) or key not in d:
        raise InputError(f"{where}: missing field '{key}'")
    return d[key]


def _tensors(raw: Any, where: str) -> tuple[TensorSpec, ...]:
    if not isinstance(raw, list) or not raw:
        raise InputError(f"{where}: expected a non-empty list of tensors")
    out = []
    for i, t in enumerate(raw):
        w = f"{where}[{i}]"
        dt = _get(t, "datatype", w)
        if dt not in DATATYPES:
            raise InputError(f"{w}.datatype: {dt!r} is not one of {', '.join(DATATYPES)}")
        shape = _get(t, "shape", w)
        if not isinstance(shape, list) or not all(isinstance(x, int) and x > 0 for x in shape):
            raise InputError(f"{w}.shape: expected positive integers (without the batch dimension), got {shape!r}")
        out.append(TensorSpec(str(_get(t, "name", w)), dt, tuple(shape)))
    return tuple(out)


def _host(h: Any, where: str) -> HostInfo:
    return HostInfo(str(_get(h, "name", where)), str(_get(h, "address", where)), str(_get(h, "gpu_type", where)),
                    int(_get(h, "gpus", where)), float(_get(h, "bandwidth_gbps", where)))


def manifest_from_dict(d: Any, root: Path = Path("."), source: str = "manifest") -> Manifest:
    """Validate a manifest: fields, cross-references between pipelines and vGPUs."""
    fmt = _get(d, "format", source)
    if fmt != FORMAT:
        raise InputError(f"{source}: format is {fmt!r}, expected {FORMAT!r}")
    hosts = tuple(_host(h, f"{source}: hosts[{i}]") for i, h in enumerate(_get(d, "hosts", source)))
    host_names = {h.name for h in hosts}
    vgpus = []
    for i, g in enumerate(_get(d, "vgpus", source)):
        w = f"{source}: vgpus[{i}]"
        fields = {k: _get(g, k, w) for k in VGpuInfo.__dataclass_fields__}
        if fields["host"] not in host_names:
            raise InputError(f"{w}.host: {fields['host']!r} is not among the hosts")
        vgpus.append(VGpuInfo(**{**fields, "env": dict(fields["env"])}))
    vgpu_ids = {g.id for g in vgpus}
    if len(vgpu_ids) != len(vgpus):
        raise InputError(f"{source}: vGPU ids are not unique")
    models = []
    for i, m in enumerate(_get(d, "models", source)):
        w = f"{source}: models[{i}]"
        pipes = []
        for j, p in enumerate(_get(m, "pipelines", w)):
            wp = f"{w}.pipelines[{j}]"
            stages = []
            for k, s in enumerate(_get(p, "stages", wp)):
                ws = f"{wp}.stages[{k}]"
                pool = tuple(_get(s, "vgpus", ws))
                unknown = [x for x in pool if x not in vgpu_ids]
                if not pool or unknown:
                    raise InputError(f"{ws}.vgpus: empty pool or unknown vGPU ids {unknown}")
                stages.append(StageInfo(str(_get(s, "triton_model", ws)), tuple(_get(s, "blocks", ws)),
                                        str(_get(s, "gpu_type", ws)), int(_get(s, "v", ws)), pool,
                                        _tensors(_get(s, "inputs", ws), f"{ws}.inputs"),
                                        _tensors(_get(s, "outputs", ws), f"{ws}.outputs"),
                                        {int(b): float(x) for b, x in _get(s, "latency_us", ws).items()}))
            pipes.append(PipelineInfo(str(_get(p, "id", wp)), int(_get(p, "batch", wp)),
                                      float(_get(p, "throughput_rps", wp)), float(_get(p, "latency_us", wp)),
                                      tuple(stages)))
        models.append(ModelInfo(str(_get(m, "name", w)), float(_get(m, "slo_us", w)),
                                int(_get(m, "max_batch_size", w)), _tensors(_get(m, "inputs", w), f"{w}.inputs"),
                                _tensors(_get(m, "outputs", w), f"{w}.outputs"), tuple(pipes)))
    plan = plan_from_dict(_get(d, "plan", source), f"{source}: plan")
    return Manifest(hosts, tuple(vgpus), tuple(models), plan, root)


def load_manifest(path: str | Path) -> Manifest:
    p = Path(path)
    if p.is_dir():
        p = p / "manifest.json"
    return manifest_from_dict(read_document(p, "manifest"), p.parent.resolve(), str(p))
