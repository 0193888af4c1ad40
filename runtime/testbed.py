"""A small real deployment for the sidecar's tests and benchmark: a zoo model cut into 3 partitions over
two host classes on loopback (A: stage 1 on two vGPUs, stage 2 on one; B: stage 3 on two vGPUs), so
batches hop A->A through shared memory and A->B over gRPC. The plan is written by hand (the planner is
not what is under test); its latency tables come from timing the model's blocks with onnxruntime."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from model_repository_gen.generate import generate
from model_repository_gen.manifest import Manifest
from plans.plan_json import ModelPlan, PartitionPlan, PipelinePlan, Plan
from plans.spec.planning_spec import ClusterSpec
from profiling.prepartition import prepartition
from profiling.profile import Block, DeviceTiming, Profile
from profiling.zoo import build_zoo_model

BATCHES = (1, 2, 3, 4, 6, 8)
# (blocks, gpu type, vGPUs) per stage
STAGES = (((0, 1), "A", 2), ((1, 2), "A", 1), ((2, 3), "B", 2))


def write_trivial_onnx(path: Path) -> Path:
    """A Relu on 16 floats, ``x`` [batch, 16] -> ``y``: a model whose serving costs next to nothing, so what is
    measured around it is the cost of the calls and of the sidecar."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 16])
    m = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "trivial", [x], [y]),
                          opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(path))
    return path


def _boundary_bytes(model_path: Path, names: list[str]) -> list[int]:
    m = onnx.shape_inference.infer_shapes(onnx.load(str(model_path)))
    infos = {v.name: v for v in [*m.graph.value_info, *m.graph.output]}
    out = []
    for n in names:
        dims = [d.dim_value for d in infos[n].type.tensor_type.shape.dim][1:]
        out.append(int(np.prod(dims)) * 4)
    return out


def build_plan(model_path: Path, name: str, slo_us: float, batch: int, cpu_scale: float = 5.0,
               max_slo_share: float = 0.5) -> Plan:
    """Profile = blocks timed on this CPU (batch 1, one thread) x batch x ``cpu_scale`` (servers share 2 cores).

    Timing on a busy machine can inflate the blocks tenfold; the table is then scaled down so the pipeline at
    ``batch`` takes at most ``max_slo_share`` of the SLO, else the plan itself could not meet its SLO and every
    request would be shed."""
    pp = prepartition(model_path, len(STAGES), threads=1, repeats=5, warmup=2)
    tensors = [b.output_tensors for b in pp.blocks]
    sizes = _boundary_bytes(model_path, [t[0] for t in tensors])
    blocks = tuple(Block(f"block{i}", sizes[i], tensors[i]) for i in range(len(pp.blocks)))
    lat = np.array([[max(b.time_us, 100.0) * cpu_scale * (0.6 + 0.4 * bs) for bs in BATCHES] for b in pp.blocks])
    at_batch = sum(float(np.interp(batch, BATCHES, lat[lo:hi].sum(axis=0))) for (lo, hi), _, _ in STAGES)
    lat *= min(1.0, max_slo_share * slo_us / at_batch)
    timing = DeviceTiming(BATCHES, lat)
    profile = Profile(name, blocks, {"A": {1: timing}, "B": {1: timing}}, input_bytes=None,
                      input_tensors=pp.input_tensors, provenance={"source": "sidecar testbed"})
    parts = tuple(PartitionPlan(blocks_, gpu, 1, batch, n, profile.latency_us(gpu, 1, batch, *blocks_),
                                0.0 if i == len(STAGES) - 1 else 1.0)
                  for i, (blocks_, gpu, n) in enumerate(STAGES))
    latency = sum(p.latency_us for p in parts)
    pipe = PipelinePlan(parts, throughput_rps=batch / max(p.latency_us for p in parts) * 1e6, latency_us=latency)
    cluster = ClusterSpec({"A": 3, "B": 2}, {"A": 3, "B": 2}, 10.0, {"A": 1, "B": 1})
    return Plan("testbed", "manual", 0.0, cluster,
                (ModelPlan(name, slo_us, pipe.throughput_rps, (pipe,), profile),))


def build_deployment(work: Path, model: str = "resnet", name: str = "resnet", slo_us: float = 250_000.0,
                     batch: int = 4) -> tuple[Path, Path, Manifest]:
    """Returns (deploy dir, full ONNX model, manifest)."""
    work.mkdir(parents=True, exist_ok=True)
    onnx_path = build_zoo_model(model, work / f"{model}.onnx")
    plan = build_plan(onnx_path, name, slo_us, batch)
    hosts = [{"name": "hostA", "address": "127.0.0.1", "gpu_type": "A", "gpus": 3, "bandwidth_gbps": 10,
              "device": "cpu", "cpu_cores": 1, "base_port": 0},
             # another loopback address: a second "machine", so hostA -> hostB hops travel over gRPC
             {"name": "hostB", "address": "127.0.0.2", "gpu_type": "B", "gpus": 2, "bandwidth_gbps": 10,
              "device": "cpu", "cpu_cores": 1, "base_port": 0}]
    cluster = work / "cluster.json"
    cluster.write_text(json.dumps({"hosts": hosts}))
    deploy = work / "deploy"
    manifest = generate(plan, {name: onnx_path}, cluster, deploy)
    return deploy, onnx_path, manifest


def with_two_mode_latency(profile: Profile, levels: int = 21) -> Profile:
    """``profile`` with a two-mode latency distribution around its medians on every device and level."""
    from dataclasses import replace

    from profiling.latency_quantiles import two_mode_multipliers, with_multipliers

    lv = tuple(float(x) for x in np.linspace(0.0, 1.0, levels))
    mult = two_mode_multipliers(lv)
    timings = {d: {v: replace(t, quantiles=with_multipliers(t.latency_us, lv, mult)) for v, t in per.items()}
               for d, per in profile.timings.items()}
    return replace(profile, timings=timings)


EMULATED_MODEL = "googlenet-v3-pytorch"  # PPipe's measured profile with the shortest latencies (5 ms on an L4)
REFERENCE_DIR = Path(__file__).resolve().parents[1] / "data" / "ppipe"


def build_emulated_deployment(work: Path, slo_us: float = 1_000_000.0, batch: int = 2, scale: float = 0.01,
                              two_mode: bool = False, gpus: int = 1,
                              addresses: tuple[str, str] = ("127.0.0.1", "127.0.0.2"),
                              previous: Path | None = None) -> Path:
    """A deployment that costs almost no CPU: PPipe's measured googlenet profile on two emulated servers (a T4 runs
    blocks 0-2, an L4 the rest, one gRPC hop between two loopback addresses), tensors at ``scale`` of their profiled
    bytes; each server class has ``gpus`` GPUs (each pool that many vGPUs). ``two_mode``: a variable-latency model
    (half the inputs four times slower than the other half, the profile's median unchanged; see
    profiling.latency_quantiles). One ``addresses`` for both hosts: one machine, whose hop goes through the
    sidecar's shared-memory pool. ``previous``: a running deployment to migrate from (generate --previous).
    Returns the deploy directory (for the fuzzer, the health, shard, reload and migration tests and benchmarks)."""
    from plans.plan_json import ModelPlan, PartitionPlan, PipelinePlan, Plan
    from profiling.reference import import_ppipe_profile

    profile = import_ppipe_profile(REFERENCE_DIR, EMULATED_MODEL)
    if two_mode:
        profile = with_two_mode_latency(profile)
    parts = tuple(PartitionPlan(blocks, gpu, 1, batch, gpus, profile.latency_us(gpu, 1, batch, *blocks))
                  for blocks, gpu in (((0, 2), "T4"), ((2, profile.num_blocks), "L4")))
    latency = sum(p.latency_us for p in parts)
    pipe = PipelinePlan(parts, gpus * batch / max(p.latency_us for p in parts) * 1e6, latency)
    cluster = ClusterSpec({"T4": gpus, "L4": gpus}, {"T4": gpus, "L4": gpus}, 10.0, {"T4": 1, "L4": 1})
    plan = Plan("testbed", "manual", 0.0, cluster, (ModelPlan(EMULATED_MODEL, slo_us, pipe.throughput_rps, (pipe,),
                                                              profile),))
    hosts = [{"name": "t4box", "address": addresses[0], "gpu_type": "T4", "gpus": gpus, "bandwidth_gbps": 10,
              "device": "emulated", "base_port": 0},
             {"name": "l4box", "address": addresses[1], "gpu_type": "L4", "gpus": gpus, "bandwidth_gbps": 10,
              "device": "emulated", "base_port": 0}]
    work.mkdir(parents=True, exist_ok=True)
    (work / "cluster.json").write_text(json.dumps({"hosts": hosts}))
    from model_repository_gen.manifest import load_manifest

    generate(plan, {}, work / "cluster.json", work / "deploy", emulated_tensor_scale=scale,
             previous=load_manifest(previous) if previous else None)
    return work / "deploy"
