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

from model_repository_gen.app_manifest import ApplicationInfo, applications_from_list
from plans.plan_json import Plan, plan_from_dict
from poolpipe_common.batcher import BatcherControls
from poolpipe_common.documents import as_float, as_int, as_str, check_fields, need, read_document
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

    @property
    def ports(self) -> tuple[int, int, int]:
        """Its tritonserver's (HTTP, gRPC, metrics) ports."""
        return tuple(int(url.rsplit(":", 1)[1]) for url in (self.http_url, self.grpc_url, self.metrics_url))


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
    # Bytes of one request's input that a link carries on the planned cluster, where they differ from the inputs'
    # own (emulated tensors shrunk by --emulated-tensor-scale keep the profiled NIC time); None: the inputs' bytes.
    link_bytes_per_request: int | None = None
    # The engine of its partitions on GPU hosts, resolved by generate (model_repository_gen.gpu_engines); "" where
    # none of its vGPUs is on a GPU host
    engine: str = ""

    def network_bytes_per_request(self) -> int:
        """What the scheduler reserves a NIC for when this stage's input crosses servers."""
        if self.link_bytes_per_request is not None:
            return self.link_bytes_per_request
        return sum(t.bytes_per_request() for t in self.inputs)


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
    # Triton's dynamic-batcher controls the sidecar honours (priority levels, queue policy); default: none
    dynamic_batching: BatcherControls = BatcherControls()


@dataclass(frozen=True)
class Manifest:
    hosts: tuple[HostInfo, ...]
    vgpus: tuple[VGpuInfo, ...]
    models: tuple[ModelInfo, ...]
    plan: Plan
    root: Path = Path(".")  # directory the manifest was loaded from
    generation: int = 0  # 0, or N when generated beside generation N-1 (generate --previous)
    applications: tuple[ApplicationInfo, ...] = ()  # application DAGs served as one model each (app_manifest.py)

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
                               | ({"link_bytes_per_request": s.link_bytes_per_request}
                                  if s.link_bytes_per_request is not None else {})
                               | ({"engine": s.engine} if s.engine else {})
                               for s in p.stages]} for p in m.pipelines]}
                       | ({"dynamic_batching": m.dynamic_batching.to_dict()} if m.dynamic_batching.active else {})
                       for m in self.models],
            "plan": self.plan.to_dict(),
            "generation": self.generation,
        } | ({"applications": [a.to_dict() for a in self.applications]} if self.applications else {})

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n")


MANIFEST_FIELDS = ("format", "hosts", "vgpus", "models", "plan", "generation", "applications")
MODEL_FIELDS = ("name", "slo_us", "max_batch_size", "inputs", "outputs", "pipelines", "dynamic_batching")
PIPELINE_FIELDS = ("id", "batch", "throughput_rps", "latency_us", "stages")
STAGE_FIELDS = ("triton_model", "blocks", "gpu_type", "v", "vgpus", "inputs", "outputs", "latency_us",
                "link_bytes_per_request", "engine")
TENSOR_FIELDS = ("name", "datatype", "shape")  # inputs[] and outputs[] of models and stages


def _list(x: Any, where: str) -> list:
    if not isinstance(x, list):
        raise InputError(f"{where}: expected a list, got {x!r}")
    return x


def _tensors(raw: Any, where: str) -> tuple[TensorSpec, ...]:
    if not isinstance(raw, list) or not raw:
        raise InputError(f"{where}: expected a non-empty list of tensors")
    out = []
    for i, t in enumerate(raw):
        w = f"{where}[{i}]"
        check_fields(t, TENSOR_FIELDS, w)
        dt = need(t, "datatype", w)
        if dt not in DATATYPES:
            raise InputError(f"{w}.datatype: {dt!r} is not one of {', '.join(DATATYPES)}")
        shape = need(t, "shape", w)
        if not isinstance(shape, list) or not all(isinstance(x, int) and x > 0 for x in shape):
            raise InputError(f"{w}.shape: expected positive integers (without the batch dimension), got {shape!r}")
        out.append(TensorSpec(as_str(need(t, "name", w), f"{w}.name"), dt, tuple(shape)))
    return tuple(out)


def _host(h: Any, where: str) -> HostInfo:
    check_fields(h, HostInfo.__dataclass_fields__, where)
    return HostInfo(as_str(need(h, "name", where), f"{where}.name"),
                    as_str(need(h, "address", where), f"{where}.address"),
                    as_str(need(h, "gpu_type", where), f"{where}.gpu_type"),
                    as_int(need(h, "gpus", where), f"{where}.gpus", 1),
                    as_float(need(h, "bandwidth_gbps", where), f"{where}.bandwidth_gbps", 0))


def _vgpu(g: Any, host_names: set[str], w: str) -> VGpuInfo:
    check_fields(g, VGpuInfo.__dataclass_fields__, w)
    f = {k: need(g, k, w) for k in VGpuInfo.__dataclass_fields__}
    for k, lo in (("gpu_index", 0), ("slot", 0), ("v", 1)):
        f[k] = as_int(f[k], f"{w}.{k}", lo)
    for k in ("id", "host", "gpu_type", "grpc_url", "http_url", "metrics_url", "repository", "kind"):
        f[k] = as_str(f[k], f"{w}.{k}")
    if f["host"] not in host_names:
        raise InputError(f"{w}.host: {f['host']!r} is not among the hosts")
    if not isinstance(f["env"], dict) or not all(isinstance(v, str) for v in f["env"].values()):
        raise InputError(f"{w}.env: expected an object of strings, got {f['env']!r}")
    return VGpuInfo(**{**f, "env": dict(f["env"])})


def _stage(s: Any, vgpu_ids: set[str], ws: str) -> StageInfo:
    check_fields(s, STAGE_FIELDS, ws)
    pool = tuple(as_str(v, f"{ws}.vgpus") for v in _list(need(s, "vgpus", ws), f"{ws}.vgpus"))
    unknown = [x for x in pool if x not in vgpu_ids]
    if not pool or unknown:
        raise InputError(f"{ws}.vgpus: empty pool or unknown vGPU ids {unknown}")
    blocks = _list(need(s, "blocks", ws), f"{ws}.blocks")
    if len(blocks) != 2:
        raise InputError(f"{ws}.blocks: expected [first, end), got {blocks!r}")
    lat = need(s, "latency_us", ws)
    if not isinstance(lat, dict) or not all(str(b).isdigit() for b in lat):
        raise InputError(f"{ws}.latency_us: expected an object of batch size -> latency, got {lat!r}")
    return StageInfo(as_str(need(s, "triton_model", ws), f"{ws}.triton_model"),
                     tuple(as_int(b, f"{ws}.blocks", 0) for b in blocks),
                     as_str(need(s, "gpu_type", ws), f"{ws}.gpu_type"), as_int(need(s, "v", ws), f"{ws}.v", 1), pool,
                     _tensors(need(s, "inputs", ws), f"{ws}.inputs"), _tensors(need(s, "outputs", ws), f"{ws}.outputs"),
                     {int(b): as_float(x, f"{ws}.latency_us.{b}", 0) for b, x in lat.items()},
                     None if s.get("link_bytes_per_request") is None
                     else as_int(s["link_bytes_per_request"], f"{ws}.link_bytes_per_request", 0),
                     _engine_name(s.get("engine", ""), f"{ws}.engine"))


def _engine_name(x: Any, where: str) -> str:
    if not isinstance(x, str):
        raise InputError(f"{where}: expected an engine name, got {x!r}")
    return x


def _pipeline(p: Any, vgpu_ids: set[str], wp: str) -> PipelineInfo:
    check_fields(p, PIPELINE_FIELDS, wp)
    stages = [_stage(s, vgpu_ids, f"{wp}.stages[{k}]") for k, s in enumerate(_list(need(p, "stages", wp),
                                                                                   f"{wp}.stages"))]
    return PipelineInfo(as_str(need(p, "id", wp), f"{wp}.id"), as_int(need(p, "batch", wp), f"{wp}.batch", 1),
                        as_float(need(p, "throughput_rps", wp), f"{wp}.throughput_rps", 0),
                        as_float(need(p, "latency_us", wp), f"{wp}.latency_us", 0), tuple(stages))


def _model(m: Any, vgpu_ids: set[str], w: str) -> ModelInfo:
    check_fields(m, MODEL_FIELDS, w)
    pipes = [_pipeline(p, vgpu_ids, f"{w}.pipelines[{j}]") for j, p in enumerate(_list(need(m, "pipelines", w),
                                                                                      f"{w}.pipelines"))]
    return ModelInfo(as_str(need(m, "name", w), f"{w}.name"), as_float(need(m, "slo_us", w), f"{w}.slo_us", 0),
                     as_int(need(m, "max_batch_size", w), f"{w}.max_batch_size", 1),
                     _tensors(need(m, "inputs", w), f"{w}.inputs"), _tensors(need(m, "outputs", w), f"{w}.outputs"),
                     tuple(pipes), BatcherControls.from_dict(m.get("dynamic_batching") or {}, f"{w}.dynamic_batching"))


def manifest_from_dict(d: Any, root: Path = Path("."), source: str = "manifest") -> Manifest:
    """Validate a manifest: fields, cross-references between pipelines and vGPUs."""
    check_fields(d, MANIFEST_FIELDS, source)
    fmt = need(d, "format", source)
    if fmt != FORMAT:
        raise InputError(f"{source}: format is {fmt!r}, expected {FORMAT!r}")
    hosts = tuple(_host(h, f"{source}: hosts[{i}]") for i, h in enumerate(_list(need(d, "hosts", source),
                                                                               f"{source}: hosts")))
    host_names = {h.name for h in hosts}
    vgpus = [_vgpu(g, host_names, f"{source}: vgpus[{i}]")
             for i, g in enumerate(_list(need(d, "vgpus", source), f"{source}: vgpus"))]
    vgpu_ids = {g.id for g in vgpus}
    if len(vgpu_ids) != len(vgpus):
        raise InputError(f"{source}: vGPU ids are not unique")
    models = [_model(m, vgpu_ids, f"{source}: models[{i}]")
              for i, m in enumerate(_list(need(d, "models", source), f"{source}: models"))]
    plan = plan_from_dict(need(d, "plan", source), f"{source}: plan")
    generation = as_int(d.get("generation", 0), f"{source}: generation", 0)
    apps = d.get("applications") or []
    if not isinstance(apps, list):
        raise InputError(f"{source}: applications: expected a list, got {apps!r:.80}")
    return Manifest(hosts, tuple(vgpus), tuple(models), plan, root, generation,
                    applications_from_list(apps, {m.name: m for m in models}, source))


def load_manifest(path: str | Path) -> Manifest:
    p = Path(path)
    if p.is_dir():
        p = p / "manifest.json"
    return manifest_from_dict(read_document(p, "manifest"), p.parent.resolve(), str(p))
