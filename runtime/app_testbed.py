"""A small real application for the sidecar's app tests and benchmark: a conv "detector" whose output holds
FAN_OUT feature rows per image, each row fed to a "classifier" (an application DAG det -> cls with fan-out).
Both are real ONNX models, each planned whole (one stage) on its own CPU vGPU of one loopback host; the plan
is written by hand like the other test beds (the planner's numbers are not what is under test), and its
``applications`` list is added in the plan.json format the planner writes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from model_repository_gen.generate import generate
from model_repository_gen.manifest import Manifest
from plans.plan_json import ModelPlan, PartitionPlan, PipelinePlan, Plan
from plans.spec.planning_spec import ClusterSpec
from profiling.prepartition import prepartition
from profiling.profile import Block, DeviceTiming, Profile

FAN_OUT = 2  # feature rows per detector image
FEATURES = 16
CLASSES = 10
IMAGE = (3, 16, 16)
BATCHES = (1, 2, 3, 4, 5, 6, 7, 8)  # every size: a partial batch held for more rows is never split
DET, CLS = "det", "cls"


def build_detector(path: Path, seed: int = 0) -> Path:
    """image [B,3,16,16] -> Conv(3->FAN_OUT, 4x4, stride 4) -> Relu -> crops [B, FAN_OUT, 16]."""
    rng = np.random.default_rng(seed)
    w = numpy_helper.from_array(rng.standard_normal((FAN_OUT, 3, 4, 4)).astype(np.float32) * 0.3, "w")
    b = numpy_helper.from_array(rng.standard_normal(FAN_OUT).astype(np.float32), "b")
    shape = numpy_helper.from_array(np.array([0, FAN_OUT, FEATURES], dtype=np.int64), "shape")
    nodes = [helper.make_node("Conv", ["image", "w", "b"], ["conv"], strides=[4, 4]),
             helper.make_node("Relu", ["conv"], ["relu"]),
             helper.make_node("Reshape", ["relu", "shape"], ["crops"])]
    graph = helper.make_graph(nodes, "det", [helper.make_tensor_value_info("image", TensorProto.FLOAT,
                                                                           ["batch", *IMAGE])],
                              [helper.make_tensor_value_info("crops", TensorProto.FLOAT,
                                                             ["batch", FAN_OUT, FEATURES])], [w, b, shape])
    return _save(graph, path)


def build_classifier(path: Path, seed: int = 1) -> Path:
    """feat [B,16] -> MatMul + Add -> Softmax -> probs [B,10]."""
    rng = np.random.default_rng(seed)
    w = numpy_helper.from_array(rng.standard_normal((FEATURES, CLASSES)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(CLASSES).astype(np.float32), "b")
    nodes = [helper.make_node("MatMul", ["feat", "w"], ["mm"]), helper.make_node("Add", ["mm", "b"], ["logits"]),
             helper.make_node("Softmax", ["logits"], ["probs"], axis=-1)]
    graph = helper.make_graph(nodes, "cls", [helper.make_tensor_value_info("feat", TensorProto.FLOAT,
                                                                           ["batch", FEATURES])],
                              [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["batch", CLASSES])], [w, b])
    return _save(graph, path)


def _save(graph: onnx.GraphProto, path: Path) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def _model_plan(onnx_path: Path, name: str, slo_us: float, batch: int, stage_us: float) -> ModelPlan:
    """One block, one stage on one vGPU of type A; latency ``stage_us`` x (0.6 + 0.4 x batch)."""
    pp = prepartition(onnx_path, 1, threads=1, repeats=1, warmup=0)
    blocks = (Block("block0", None, pp.blocks[0].output_tensors),)
    timing = DeviceTiming(BATCHES, np.array([[stage_us * (0.6 + 0.4 * b) for b in BATCHES]]))
    profile = Profile(name, blocks, {"A": {1: timing}}, None, pp.input_tensors, {"source": "app testbed"})
    part = PartitionPlan((0, 1), "A", 1, batch, 1, profile.latency_us("A", 1, batch))
    pipe = PipelinePlan((part,), batch / part.latency_us * 1e6, part.latency_us)
    return ModelPlan(name, slo_us, pipe.throughput_rps, (pipe,), profile)


def application(slo_us: float, rate_rps: float, det_share: float = 0.5, dummy: tuple[str, ...] = ()
                ) -> dict[str, Any]:
    """The app in plan.json's ``applications`` format: det -> cls, fan-out FAN_OUT, each module's SLO share;
    the modules in ``dummy`` have their batches padded with dummy requests."""
    return {"name": "traffic", "slo_us": slo_us, "rate_rps": rate_rps,
            "modules": [{"name": DET, "model": DET, "slo_us": slo_us * det_share, "rate_rps": rate_rps,
                         "dummy_requests": DET in dummy},
                        {"name": CLS, "model": CLS, "slo_us": slo_us * (1 - det_share),
                         "rate_rps": rate_rps * FAN_OUT, "dummy_requests": CLS in dummy}],
            "edges": [{"from": DET, "to": CLS, "fan_out": float(FAN_OUT), "tensors": {"crops": "feat"}}]}


def build_app_plan(work: Path, slo_us: float = 400_000.0, batch: int = 4, stage_us: float = 2_000.0,
                   app: dict[str, Any] | None = None) -> tuple[Plan, dict[str, Path]]:
    """The plan (both models, the application) and the ONNX paths by model name."""
    paths = {DET: build_detector(work / "det.onnx"), CLS: build_classifier(work / "cls.onnx")}
    models = tuple(_model_plan(paths[n], n, slo_us / 2, batch, stage_us) for n in (DET, CLS))
    cluster = ClusterSpec({"A": 2}, {"A": 2}, 10.0, {"A": 1})
    plan = Plan("testbed", "manual", 0.0, cluster, models, applications=(app or application(slo_us, 50.0),))
    return plan, paths


def build_app_deployment(work: Path, slo_us: float = 400_000.0, batch: int = 4, stage_us: float = 2_000.0,
                         app: dict[str, Any] | None = None) -> tuple[Path, dict[str, Path], Manifest]:
    """Returns (deploy dir, ONNX paths by model, manifest); the plan is written to ``work/plan.json`` too."""
    work.mkdir(parents=True, exist_ok=True)
    plan, paths = build_app_plan(work, slo_us, batch, stage_us, app)
    plan.save(work / "plan.json")
    hosts = [{"name": "hostA", "address": "127.0.0.1", "gpu_type": "A", "gpus": 2, "bandwidth_gbps": 10,
              "device": "cpu", "cpu_cores": 1, "base_port": 0}]
    (work / "cluster.json").write_text(json.dumps({"hosts": hosts}))
    manifest = generate(plan, paths, work / "cluster.json", work / "deploy")
    return work / "deploy", paths, manifest
