"""Application DAGs in plan.json and manifest.json: checked against the models' real tensors (one-line errors),
the app's inputs and outputs derived, fan-out rows, and the generated manifest (manifests without apps unchanged)."""

from __future__ import annotations

import copy
import json
from dataclasses import replace

import pytest

from model_repository_gen.app_manifest import applications_from_list
from model_repository_gen.generate import generate
from model_repository_gen.manifest import ModelInfo, load_manifest, manifest_from_dict
from plans.plan_json import load_plan
from poolpipe_common.errors import InputError
from poolpipe_common.tensors import TensorSpec
from runtime.app_testbed import build_app_deployment, build_app_plan

MODELS = {
    "det": ModelInfo("det", 100.0, 4, (TensorSpec("image", "FP32", (3, 16, 16)),),
                     (TensorSpec("crops", "FP32", (2, 16)), TensorSpec("score", "FP32", (1,))), ()),
    "cls": ModelInfo("cls", 100.0, 4, (TensorSpec("feat", "FP32", (16,)),), (TensorSpec("probs", "FP32", (10,)),), ()),
    "cls2": ModelInfo("cls2", 100.0, 4, (TensorSpec("feat", "FP32", (16,)),), (TensorSpec("probs", "FP32", (10,)),),
                      ()),
    "join": ModelInfo("join", 100.0, 4, (TensorSpec("a", "FP32", (10,)), TensorSpec("b", "FP32", (10,))),
                      (TensorSpec("out", "FP32", (1,)),), ()),
    "relay": ModelInfo("relay", 100.0, 4, (TensorSpec("x", "FP32", (16,)),), (TensorSpec("y", "FP32", (16,)),), ()),
    "half": ModelInfo("half", 100.0, 4, (TensorSpec("feat", "FP16", (16,)),), (TensorSpec("y", "FP16", (1,)),), ()),
}
APP = {"name": "traffic", "slo_us": 400000, "rate_rps": 100,
       "modules": [{"name": "d", "model": "det", "slo_us": 150000}, {"name": "c", "model": "cls", "slo_us": 250000}],
       "edges": [{"from": "d", "to": "c", "fan_out": 2.0, "tensors": {"crops": "feat"}}]}


def _app(**changes):
    a = copy.deepcopy(APP)
    a.update(changes)
    return a


def test_app_inputs_outputs_rows_and_deadline_shares() -> None:
    (app,) = applications_from_list([APP], MODELS, "plan")
    assert [m.name for m in app.modules] == ["d", "c"] and [m.rows for m in app.modules] == [1, 2]
    assert app.modules[1].rate_rps == 200.0  # the app's rate times its rows, when the plan gives none
    assert [t.spec for t in app.inputs] == [TensorSpec("image", "FP32", (3, 16, 16))]
    assert [t.spec for t in app.outputs] == [TensorSpec("probs", "FP32", (2, 10))]  # 2 crops per image
    assert app.edges[0].rows == 2 and app.edges[0].fan_out == 2.0
    assert app.after_us("d") == 250000 and app.after_us("c") == 0
    assert app.max_batch_size == 4


def test_two_sinks_with_one_output_name_are_named_by_module() -> None:
    a = _app(modules=APP["modules"] + [{"name": "c2", "model": "cls2"}],
             edges=APP["edges"] + [{"from": "d", "to": "c2", "tensors": {"crops": "feat"}}])
    (app,) = applications_from_list([a], MODELS, "plan")
    assert [t.spec.name for t in app.outputs] == ["c.probs", "c2.probs"]
    assert app.module("c2").slo_us == 100.0  # no share in the plan: the model's own SLO
    assert app.after_us("d") == 250000  # the longest path after the detector


@pytest.mark.parametrize("app, message", [
    (_app(name="det"), "'det' is already a planned model's name"),
    (_app(modules=[{"name": "d", "model": "nope"}]), "'nope' is not a model of the plan"),
    (_app(modules=APP["modules"] * 2), "module 'd' is declared twice"),
    (_app(edges=[{"from": "d", "to": "x", "tensors": {"crops": "feat"}}]), "'x' is not a module of the application"),
    (_app(edges=[{"from": "d", "to": "c", "tensors": {"boxes": "feat"}}]), "'boxes' is not an output of model 'det'"),
    (_app(edges=[{"from": "d", "to": "c", "tensors": {"crops": "x"}}]), "'x' is not an input of model 'cls'"),
    (_app(edges=[{"from": "d", "to": "c", "tensors": {"score": "feat"}}]), r"shape \[1\] of det.score does not fit"),
    (_app(modules=[APP["modules"][0], {"name": "h", "model": "half"}],
          edges=[{"from": "d", "to": "h", "tensors": {"crops": "feat"}}]), "det.crops is FP32 but half.feat is FP16"),
    (_app(edges=[{"from": "d", "to": "c", "fan_out": 0, "tensors": {"crops": "feat"}}]), "fan_out: must be > 0"),
    (_app(edges=[]), "exactly one source module .* it has 2: d, c"),
    (_app(modules=APP["modules"][:1] + [{"name": "r1", "model": "relay"}, {"name": "r2", "model": "relay"}],
          edges=[{"from": "d", "to": "r1", "tensors": {"crops": "x"}},
                 {"from": "r1", "to": "r2", "tensors": {"y": "x"}},
                 {"from": "r2", "to": "r1", "tensors": {"y": "x"}}]), "the edges between modules r1, r2 form a cycle"),
    (_app(modules=APP["modules"] + [{"name": "j", "model": "join"}],
          edges=APP["edges"] + [{"from": "c", "to": "j", "tensors": {"probs": "a"}}]),
     "input 'b' of module 'j' is fed by 0 edge tensors"),
    (_app(slo_us=-1), "slo_us"),
])
def test_bad_applications_give_one_line_errors(app: dict, message: str) -> None:
    with pytest.raises(InputError, match=message) as e:
        applications_from_list([app], MODELS, "plan")
    assert "\n" not in str(e.value)


def test_rows_that_disagree_at_a_join_are_refused() -> None:
    models = {**MODELS, "join2": replace(MODELS["join"], inputs=(TensorSpec("a", "FP32", (10,)),
                                                                 TensorSpec("b", "FP32", (1,))))}
    a = _app(modules=APP["modules"] + [{"name": "j", "model": "join2"}],
             edges=APP["edges"] + [{"from": "c", "to": "j", "tensors": {"probs": "a"}},
                                   {"from": "d", "to": "j", "tensors": {"score": "b"}}])
    with pytest.raises(InputError, match="module 'j' would get different numbers of rows per app row \\[1, 2\\]"):
        applications_from_list([a], models, "plan")


def test_generate_writes_the_checked_app_and_refuses_a_bad_mapping_before_writing(tmp_path) -> None:
    deploy, _, manifest = build_app_deployment(tmp_path / "ok")
    raw = json.loads((deploy / "manifest.json").read_text())
    assert raw["applications"][0]["outputs"] == [{"name": "probs", "datatype": "FP32", "shape": [2, 10],
                                                  "module": "cls", "tensor": "probs"}]
    assert load_manifest(deploy).applications == manifest.applications
    assert load_plan(tmp_path / "ok" / "plan.json").applications[0]["name"] == "traffic"  # plan.json keeps it
    plain = replace(manifest, applications=())
    assert "applications" not in plain.to_dict()  # manifests without applications are unchanged
    assert manifest_from_dict(plain.to_dict()).applications == ()

    bad = copy.deepcopy(APP)
    bad["modules"] = [{"name": "d", "model": "det"}, {"name": "c", "model": "cls"}]
    bad["edges"][0]["tensors"] = {"crops": "image"}
    plan, paths = build_app_plan(tmp_path / "bad", app=bad)
    (tmp_path / "cluster.json").write_text(json.dumps({"hosts": [
        {"name": "h", "address": "127.0.0.1", "gpu_type": "A", "gpus": 2, "bandwidth_gbps": 10, "device": "cpu",
         "base_port": 0}]}))
    with pytest.raises(InputError, match="'image' is not an input of model 'cls'"):
        generate(plan, paths, tmp_path / "cluster.json", tmp_path / "bad" / "deploy")
    assert not (tmp_path / "bad" / "deploy").exists()
