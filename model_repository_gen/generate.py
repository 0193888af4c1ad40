"""``poolpipe generate``: a plan + ONNX models + a cluster file -> per-vGPU Triton repositories, launch files, manifest.

Layout of ``out_dir``::

    manifest.json                                  # what runs where (model_repository_gen/manifest.py)
    <host>/launch.json                             # the host's tritonservers: ports, environment
    <host>/launch.sh                               # the same as a readable shell script
    <host>/<vgpu>/model_repository/<partition>/{config.pbtxt, 1/model.py, 1/model.onnx}

Each planned vGPU becomes one tritonserver (decision 3 of ARCHITECTURE.md) on a concrete (host, GPU,
slot). A GPU split into V vGPUs runs V servers, each with ``CUDA_VISIBLE_DEVICES=<gpu>`` (so its
config says ``gpus: [0]``) and ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100/V``. On CPU devices the
vGPUs of a host share its cores: each gets ``cores // vGPUs on the host`` engine threads. On emulated
devices the partition backend holds each batch for the profiled latency of its (GPU type, V, batch)
(the native ``poolpipe_emulated`` backend where it builds, else ``1/model.py``; no ONNX file); a model
served only by emulated hosts needs no ONNX file, its tensors are invented from the profile
(``emulated_io.py``, scaled by ``emulated_tensor_scale``; the manifest keeps their profiled size as each stage's
``link_bytes_per_request``, so the scheduler reserves a NIC for as long as the planned cluster's would take).
Unequal vGPU sizes (plan ``gpu_splits``, plans/split_slots.py) take the first GPUs of their type: an MPS
share's server gets ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` = its percentage; a MIG instance's server names its
instance by parent GPU, profile and placement, resolved by ``launch`` (model_repository_gen/vgpu_env.py).
GPU partitions run the engine their profile measured, resolved here once (model_repository_gen/gpu_engines.py),
and each GPU's vGPUs are checked against its memory and their MPS share of it (model_repository_gen/gpu_memory.py).
"""

from __future__ import annotations

import json
import math
import re
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import onnx

from model_repository_gen import triton_config as tc
from model_repository_gen.app_manifest import applications_from_list
from model_repository_gen.cluster_file import (
    Cluster,
    cpu_cores,
    load_cluster,
)
from model_repository_gen.emulated_io import EmulatedTensors, check_scale, emulated_tensors
from model_repository_gen.generations import generation_suffix, kept_ports
from model_repository_gen.gpu_engines import EngineChoice, resolve_engines
from model_repository_gen.gpu_memory import check_gpu_memory
from model_repository_gen.manifest import (
    HostInfo,
    Manifest,
    ModelInfo,
    PipelineInfo,
    StageInfo,
    VGpuInfo,
)
from model_repository_gen.onnx_check import check_onnx_matches_profile
from model_repository_gen.ports import assign_ports
from model_repository_gen.vgpu_env import Slot, launch_sh, mps_percent, vgpu_env
from plans.plan_json import ModelPlan, PartitionPlan, Plan
from plans.split_slots import sized_slots, split_gpu_counts
from poolpipe_common.batcher import BatcherControls
from poolpipe_common.errors import InputError
from poolpipe_common.tensors import TensorSpec

LAUNCH_FORMAT = "poolpipe.launch/1"


StageKey = tuple[str, int, int]  # (model, pipeline index, stage index)


def gpus_needed(plan: Plan) -> dict[str, int]:
    """Physical GPUs of each type the plan needs; vGPUs of one level share GPUs, levels do not mix."""
    per_level: dict[tuple[str, int], int] = {}
    for m in plan.models:
        for pl in m.pipelines:
            for p in pl.partitions:
                if p.size is None:
                    per_level[(p.gpu, p.v)] = per_level.get((p.gpu, p.v), 0) + p.num_vgpus
    out: dict[str, int] = dict(split_gpu_counts(plan))
    for (gpu, v), n in per_level.items():
        out[gpu] = out.get(gpu, 0) + math.ceil(n / v)
    return out


def assign_vgpus(plan: Plan, cluster: Cluster) -> dict[StageKey, list[Slot]]:
    """Give every planned vGPU a concrete (host, GPU, slot); InputError if a GPU type is short."""
    available = cluster.gpus_of_type()
    for gpu, need in sorted(gpus_needed(plan).items()):
        have = available.get(gpu, 0)
        if need > have:
            hosts = ", ".join(f"{t}: {n}" for t, n in sorted(available.items()))
            raise InputError(f"{cluster.source}: the plan needs {need} {gpu} GPU(s) but the cluster file has {have} "
                             f"(hosts offer {hosts}); add hosts with gpu_type {gpu} or re-plan for this cluster")
    physical = {gpu: [(h, i) for h in cluster.hosts_of_type(gpu) for i in range(h.gpus)] for gpu in available}
    split = split_gpu_counts(plan)
    next_gpu = {gpu: split.get(gpu, 0) for gpu in available}  # unequally split GPUs come first
    sizes = plan.cluster.vgpu_sizes or {}
    out: dict[StageKey, list[Slot]] = {}
    for key, pool in sized_slots(plan).items():
        gpu = plan.model(key[0]).pipelines[key[1]].partitions[key[2]].gpu
        out[key] = [Slot(*physical[gpu][s.gpu], s.slot, 1, s, sizes[gpu].kind == "mig") for s in pool]
    demands: dict[tuple[str, int], list[tuple[StageKey, int]]] = {}
    for m in plan.models:
        for j, pl in enumerate(plan.model(m.name).pipelines):
            for k, p in enumerate(pl.partitions):
                if p.size is None:
                    demands.setdefault((p.gpu, p.v), []).append(((m.name, j, k), p.num_vgpus))
    for (gpu, v), items in sorted(demands.items()):
        slot, current = v, None  # start on a fresh GPU for each level
        for key, n in items:
            pool = []
            for _ in range(n):
                if slot == v:
                    current, slot = physical[gpu][next_gpu[gpu]], 0
                    next_gpu[gpu] += 1
                pool.append(Slot(current[0], current[1], slot, v))
                slot += 1
            out[key] = pool
    return out


def gpu_pools(plan: Plan, assignment: dict[StageKey, list[Slot]]) -> dict[tuple[str, str], bool]:
    """(model, GPU type) of every partition with a vGPU on a GPU host (the pairs that need an engine)."""
    return {(name, plan.model(name).pipelines[j].partitions[k].gpu): True
            for (name, j, k), pool in assignment.items() if any(s.host.on_gpu for s in pool)}


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", name)


def partition_model_name(model: str, first: int, end: int) -> str:
    return f"{_safe(model)}_b{first}_{end}"


def _load_onnx(path: Path, model: str) -> onnx.ModelProto:
    try:
        return onnx.load(str(path), load_external_data=False)
    except FileNotFoundError:
        raise InputError(f"--onnx {model}={path}: file not found") from None
    except Exception as e:  # noqa: BLE001 - onnx raises DecodeError, OSError, ...
        raise InputError(f"--onnx {model}={path}: not a readable ONNX model ({type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else 'parse error'})") from None


def _prepare_out_dir(out: Path) -> None:
    """Create ``out``; an earlier generate's output there is replaced, any other non-empty directory refused."""
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out}: exists and is not a directory")
    if out.is_dir() and any(out.iterdir()):
        if not (out / "manifest.json").is_file():
            raise InputError(f"--out {out}: directory is not empty and holds no earlier poolpipe output; "
                             f"choose a new or empty directory")
        for child in out.iterdir():
            if child.is_dir() and ((child / "launch.json").is_file() or (child / "kustomization.yaml").is_file()):
                shutil.rmtree(child)  # a host's files, or an earlier --k8s output
        (out / "manifest.json").unlink()
    out.mkdir(parents=True, exist_ok=True)



def _check_onnx_args(plan: Plan, onnx_paths: Mapping[str, Path], assignment: dict[StageKey, list[Slot]],
                     scale: float) -> None:
    """Each model needs --onnx unless only emulated hosts serve it; no --onnx for models not in the plan."""
    planned = [m.name for m in plan.models]
    missing = [n for n in planned if n not in onnx_paths]
    real = sorted({s.host.name for (name, _, _), pool in assignment.items() if name in missing
                   for s in pool if not s.host.emulated})
    if real:
        raise InputError(f"no ONNX file for plan model(s) {', '.join(missing)}: host(s) {', '.join(real)} run real "
                         "engines; pass --onnx NAME=MODEL.onnx (a model served only by hosts with device: emulated "
                         "needs none)")
    extra = sorted(set(onnx_paths) - set(planned))
    if extra:
        raise InputError(f"--onnx {', '.join(extra)}: not a model of the plan (it has {', '.join(planned)})")
    if scale != 1.0 and not missing:
        raise InputError(f"--emulated-tensor-scale {scale:g}: every plan model has --onnx, so no tensors are invented "
                         "to scale; leave out the flag, or the --onnx of models that only emulated hosts serve")


def _slot_settings(s: Slot, stage: int, p: PartitionPlan, m: ModelPlan, threads: int, emulated_backend: str,
                   engine: EngineChoice | None) -> tuple[tc.BackendSettings, str, int | None]:
    """The partition backend's settings, instance kind and GPU index for one vGPU (emulated: ``emulated_backend``)."""
    dev = p.timing_device
    if s.host.emulated:
        sizes = m.profile.batch_sizes(dev, p.v)
        lat = tuple((b, m.profile.latency_us(dev, p.v, b, *p.blocks)) for b in sizes)
        qs = [(b, m.profile.latency_quantiles_us(dev, p.v, b, *p.blocks)) for b in sizes]
        dist = (qs[0][1][0], tuple((b, q[1]) for b, q in qs if q is not None)) if qs[0][1] is not None else None
        emulated = tc.EmulatedSettings(lat, stage, s.host.latency_cv, dist, emulated_backend)
        return tc.BackendSettings(emulated=emulated), "KIND_CPU", None
    if s.host.on_cpu:
        return (tc.BackendSettings(engine="ort", intra_op_threads=threads, emulate_slowdown=s.host.emulate_slowdown),
                "KIND_CPU", None)
    assert engine is not None, "every GPU pool has an engine (resolve_engines)"
    return (tc.BackendSettings(mps_thread_percentage=mps_percent(s), engine=engine.engine, device=engine.device),
            "KIND_GPU", 0)


class _Writer:
    """Writes the partition models of every vGPU and collects each vGPU's server entry."""

    def __init__(self, out: Path, work: Path, onnx_paths: Mapping[str, Path], fp16_boundaries: bool,
                 invented: dict[str, EmulatedTensors], ports: dict[str, tuple[int, int, int]],
                 vgpus_per_host: dict[str, int], generation: int = 0, emulated_backend: str = "python",
                 profiled: dict[str, EmulatedTensors] | None = None,
                 engines: dict[tuple[str, str], EngineChoice] | None = None) -> None:
        self.out, self.work, self.onnx_paths, self.fp16 = out, work, onnx_paths, fp16_boundaries
        self.profiled = profiled or {}  # invented models' tensors at their profiled sizes, where ``invented`` shrank
        self.emulated_backend = emulated_backend
        self.suffix = generation_suffix(generation)
        self.invented, self.ports, self.vgpus_per_host = invented, ports, vgpus_per_host
        self.cut_cache: dict[tuple[str, int, int], tuple[Path | None, list[TensorSpec], list[TensorSpec]]] = {}
        self.servers: dict[str, dict[str, Any]] = {}
        self.engines = engines or {}  # (model, GPU type) -> the engine of its partitions on GPU hosts

    def partition(self, m: ModelPlan, first: int, end: int) -> tuple[Path | None, list[TensorSpec], list[TensorSpec]]:
        """(ONNX file or None for an invented model, inputs, outputs) of blocks [first, end)."""
        from model_repository_gen.cut import cut_partition, partition_io  # onnx graph work only when generating

        key = (m.name, first, end)
        if key not in self.cut_cache:
            if m.name in self.invented:
                self.cut_cache[key] = (None, *self.invented[m.name].stage_io(first, end))
            else:
                sub = cut_partition(Path(self.onnx_paths[m.name]), m.profile, first, end, self.fp16)
                f = self.work / f"{partition_model_name(*key)}.onnx"
                onnx.save(sub, str(f))
                self.cut_cache[key] = (f, *partition_io(sub))
        return self.cut_cache[key]

    def stage(self, m: ModelPlan, batch: int, k: int, p: PartitionPlan, pool: list[Slot]) -> StageInfo:
        """Write stage ``k``'s partition model into each vGPU of its pool."""
        f, ins, outs = self.partition(m, *p.blocks)
        name = partition_model_name(m.name, *p.blocks) + self.suffix
        for s in pool:
            threads = max(1, cpu_cores(s.host) // self.vgpus_per_host[s.host.name]) if s.host.on_cpu else 0
            settings, kind, gpu = _slot_settings(s, k, p, m, threads, self.emulated_backend,
                                                 self.engines.get((m.name, p.gpu)))
            cfg = tc.partition_config(name, ins, outs, batch, kind=kind, gpu=gpu, settings=settings)
            tc.write_model(self.out / s.host.name / s.id / "model_repository", cfg,
                           None if settings.emulated is not None else f)
            http, grpc, metrics = self.ports[s.id]
            srv = self.servers.setdefault(s.id, {
                "vgpu": s.id, "host": s.host.name, "gpu_index": s.gpu_index, "slot": s.slot, "v": s.v,
                "repository": f"{s.id}/model_repository", "http_port": http, "grpc_port": grpc,
                "metrics_port": metrics, "env": vgpu_env(s, threads), "models": []})
            srv["models"].append(name)
        dev = p.timing_device  # 'GPU@size' for an unequal share, so the sidecar finds its timings
        lat = {b: m.profile.latency_us(dev, p.v, b, *p.blocks) for b in m.profile.batch_sizes(dev, p.v)}
        link = (sum(t.bytes_per_request() for t in self.profiled[m.name].stage_io(*p.blocks)[0])
                if m.name in self.profiled else None)
        engine = self.engines[(m.name, p.gpu)].name if any(s.host.on_gpu for s in pool) else ""
        return StageInfo(name, p.blocks, dev, p.v, tuple(s.id for s in pool), tuple(ins), tuple(outs), lat, link,
                         engine)

    def model(self, m: ModelPlan, io: tuple[list[TensorSpec], list[TensorSpec]],
              assignment: dict[StageKey, list[Slot]]) -> ModelInfo:
        pipes = []
        for j, pl in enumerate(m.pipelines):
            stages = tuple(self.stage(m, pl.batch, k, p, assignment[(m.name, j, k)])
                           for k, p in enumerate(pl.partitions))
            pipes.append(PipelineInfo(f"{m.name}/{j}", pl.batch, pl.throughput_rps, pl.latency_us, stages))
        ins, outs = io
        return ModelInfo(m.name, m.slo_us, max(pl.batch for pl in m.pipelines), tuple(ins), tuple(outs), tuple(pipes))


def _write_launch_files(out: Path, cluster: Cluster, servers: dict[str, dict[str, Any]]) -> list[VGpuInfo]:
    """Per host with servers: launch.json and launch.sh; returns every vGPU for the manifest."""
    vgpus = []
    for h in cluster.hosts:
        mine = sorted((s for s in servers.values() if s["host"] == h.name), key=lambda s: (s["gpu_index"], s["slot"]))
        for s in mine:
            vgpus.append(VGpuInfo(s["vgpu"], h.name, h.gpu_type, s["gpu_index"], s["slot"], s["v"],
                                  f"{h.address}:{s['grpc_port']}", f"{h.address}:{s['http_port']}",
                                  f"{h.address}:{s['metrics_port']}", f"{h.name}/{s['repository']}",
                                  "KIND_GPU" if h.on_gpu else "KIND_CPU", dict(s["env"])))
        if not mine:
            continue
        launch = {"format": LAUNCH_FORMAT, "host": h.name, "address": h.address, "gpu_type": h.gpu_type,
                  "device": h.device, "gpus": h.gpus,
                  "needs_mps": h.on_gpu and any(s["v"] > 1 or s["env"].get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "100")
                                                != "100" for s in mine), "servers": mine}
        (out / h.name / "launch.json").write_text(json.dumps(launch, indent=1) + "\n")
        sh = out / h.name / "launch.sh"
        sh.write_text(launch_sh(h, mine))
        sh.chmod(0o755)
    return vgpus


def generate(plan: Plan, onnx_paths: Mapping[str, Path], cluster: Cluster | str | Path, out_dir: str | Path,
             fp16_boundaries: bool = False, emulated_tensor_scale: float = 1.0,
             previous: Manifest | None = None, batcher: Mapping[str, BatcherControls] | None = None,
             emulated_backend: str = "auto", engines: Mapping[str, str] | None = None) -> Manifest:
    """Write repositories, launch files and manifest.json for ``plan`` under ``out_dir``; returns the manifest.

    ``onnx_paths`` may leave out models that only emulated hosts serve; their tensors are invented from the
    profile, their bytes scaled by ``emulated_tensor_scale`` (0 < scale <= 1). ``previous``: the deployment that
    runs now; the new one is generated to migrate from it (model_repository_gen.generations). ``batcher``: Triton's
    dynamic-batcher controls per model (priority levels, queue policy) for the sidecar. ``emulated_backend``: what
    serves emulated partitions (auto: the native backend where it builds, else the Python one; native; python).
    ``engines``: GPU type -> engine of its GPU hosts' partitions, where not the one the profile measured
    (model_repository_gen.gpu_engines)."""
    from model_repository_gen.cut import partition_io  # onnx graph work only when generating

    if not isinstance(cluster, Cluster):
        cluster = load_cluster(cluster)
    scale = check_scale(emulated_tensor_scale)
    backend = tc.emulated_backend(emulated_backend) if any(h.emulated for h in cluster.hosts) else "python"
    io: dict[str, tuple[list[TensorSpec], list[TensorSpec]]] = {}
    for m in plan.models:
        if m.name in onnx_paths:
            path = Path(onnx_paths[m.name])
            model = _load_onnx(path, m.name)
            check_onnx_matches_profile(m, path, model)
            io[m.name] = partition_io(model)
    assignment = assign_vgpus(plan, cluster)
    _check_onnx_args(plan, onnx_paths, assignment, scale)
    choices = resolve_engines(list(plan.models), gpu_pools(plan, assignment), engines or {})
    check_gpu_memory(plan, assignment)  # before anything is written
    invented = {m.name: emulated_tensors(m.profile, scale, fp16_boundaries) for m in plan.models
                if m.name not in onnx_paths}
    for name, t in invented.items():
        io[name] = (list(t.inputs), list(t.outputs))
    # shrunk tensors cross links at their profiled size: the scheduler reserves NICs as on the planned cluster
    profiled = {m.name: emulated_tensors(m.profile, 1.0, fp16_boundaries) for m in plan.models
                if m.name in invented and scale != 1.0}
    apps = applications_from_list(plan.applications, {  # checked against the real tensors before writing
        m.name: ModelInfo(m.name, m.slo_us, max(pl.batch for pl in m.pipelines), tuple(io[m.name][0]),
                          tuple(io[m.name][1]), ()) for m in plan.models}, "plan")
    slots = sorted({s.id: s for pool in assignment.values() for s in pool}.values(),
                   key=lambda s: (s.host.name, s.gpu_index, s.slot))
    vgpus_per_host = {h.name: sum(1 for s in slots if s.host.name == h.name) for h in cluster.hosts}
    generation = previous.generation + 1 if previous else 0
    keep, busy = kept_ports(previous, [(s.id, s.host.address, vgpu_env(s, 0)) for s in slots]) if previous else ({}, {})
    ports = assign_ports(cluster, [(s.id, s.host) for s in slots], keep, busy)

    out = Path(out_dir)
    _prepare_out_dir(out)
    work = Path(tempfile.mkdtemp(prefix=".partitions-", dir=out))
    try:
        writer = _Writer(out, work, onnx_paths, fp16_boundaries, invented, ports, vgpus_per_host, generation, backend,
                         profiled, choices)
        models = [writer.model(m, io[m.name], assignment) for m in plan.models]
        models = [replace(m, dynamic_batching=batcher[m.name]) if batcher and m.name in batcher else m for m in models]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    vgpus = _write_launch_files(out, cluster, writer.servers)
    hosts = tuple(HostInfo(h.name, h.address, h.gpu_type, h.gpus, h.bandwidth_gbps) for h in cluster.hosts)
    manifest = Manifest(hosts, tuple(vgpus), tuple(models), plan, out.resolve(), generation, apps)
    manifest.save(out / "manifest.json")
    return manifest
