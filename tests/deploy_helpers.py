"""Helpers for the generate/launch/ensemble tests: a zoo model's profile and hand-built plans.

The profile's block boundaries come from the real pre-partitioner on the real ONNX model; its
latency tables are hand-written (the planner's numbers do not matter to what these tests check).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from model_repository_gen.onnx_check import bytes_per_request
from plans.plan_json import ModelPlan, PartitionPlan, PipelinePlan, Plan
from plans.spec.planning_spec import ClusterSpec
from profiling.prepartition import prepartition
from profiling.profile import Block, DeviceTiming, Profile

BATCHES = (1, 2, 4)


def make_profile(onnx_path: Path, name: str, n_blocks: int, devices: dict[str, tuple[int, ...]]) -> Profile:
    """A profile with the pre-partitioner's block boundaries; device -> vGPU levels with made-up latencies."""
    pp = prepartition(onnx_path, n_blocks, repeats=1, warmup=0)
    sizes = bytes_per_request(onnx.load(str(onnx_path)))  # the real sizes: generate checks them against the ONNX
    blocks = tuple(Block(f"block{i}", sum(sizes[t] for t in b.output_tensors), b.output_tensors)
                   for i, b in enumerate(pp.blocks))
    timings = {dev: {v: DeviceTiming(BATCHES, np.array([[100.0 * (i + 1) * b * v for b in BATCHES]
                                                           for i in range(n_blocks)]))
                     for v in levels} for dev, levels in devices.items()}
    return Profile(name, blocks, timings, sum(sizes[t] for t in pp.input_tensors), pp.input_tensors,
                   {"source": "tests"})


def make_plan(profile: Profile, pipelines: list[list[tuple[tuple[int, int], str, int, int]]], batch: int = 2,
              gpus: dict[str, int] | None = None) -> Plan:
    """Pipelines given as [((first, end), gpu, v, num_vgpus), ...] per pipeline."""
    pipes = []
    for parts in pipelines:
        pps = tuple(PartitionPlan(blocks, gpu, v, batch, n, profile.latency_us(gpu, v, batch, *blocks))
                    for blocks, gpu, v, n in parts)
        pipes.append(PipelinePlan(pps, 100.0, sum(p.latency_us for p in pps)))
    types = gpus or {gpu: 1 for parts in pipelines for _, gpu, _, _ in parts}
    levels = {t: max([v for parts in pipelines for _, g, v, _ in parts if g == t] or [1]) for t in types}
    cluster = ClusterSpec(dict(types), {t: 1 for t in types}, 10.0, levels)
    model = ModelPlan(profile.model, 100000.0, 100.0 * len(pipes), tuple(pipes), profile)
    return Plan("hand", "none", 0.0, cluster, (model,))


def write_cluster(path: Path, hosts: list[dict]) -> Path:
    path.write_text(json.dumps({"hosts": hosts}))
    return path


def reference_output(onnx_path: Path, x: np.ndarray) -> np.ndarray:
    sess = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    return sess.run(None, {sess.get_inputs()[0].name: x})[0]


def run_pipeline_through_triton(manifest, pipeline_id: str, x: np.ndarray, vgpu_choice: int = 0
                                ) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """Send ``x`` stage by stage through the pipeline's Triton partition models (gRPC); returns the
    final output and each stage's (compute start, end) ns."""
    import tritonclient.grpc as grpcclient

    from model_repository_gen.triton_config import (
        COMPUTE_END_OUTPUT,
        COMPUTE_START_OUTPUT,
    )

    model = manifest.model(pipeline_id.split("/")[0])
    pipe = next(p for p in model.pipelines if p.id == pipeline_id)
    tensors = {model.inputs[0].name: x}
    stamps = []
    np_types = {"FP32": np.float32, "FP16": np.float16}
    for stage in pipe.stages:
        vgpu = manifest.vgpu(stage.vgpus[vgpu_choice % len(stage.vgpus)])
        client = grpcclient.InferenceServerClient(vgpu.grpc_url)
        inputs = []
        for spec in stage.inputs:
            arr = tensors[spec.name].astype(np_types[spec.datatype])
            inp = grpcclient.InferInput(spec.name, list(arr.shape), spec.datatype)
            inp.set_data_from_numpy(arr)
            inputs.append(inp)
        names = [s.name for s in stage.outputs] + [COMPUTE_START_OUTPUT, COMPUTE_END_OUTPUT]
        res = client.infer(stage.triton_model, inputs, outputs=[grpcclient.InferRequestedOutput(n) for n in names])
        for spec in stage.outputs:
            tensors[spec.name] = res.as_numpy(spec.name)
        stamps.append((int(res.as_numpy(COMPUTE_START_OUTPUT)[0, 0]), int(res.as_numpy(COMPUTE_END_OUTPUT)[0, 0])))
        client.close()
    return tensors[model.outputs[0].name], stamps
