"""Strict inputs through the real CLI: unknown fields are named with a "did you mean", binary and non-UTF-8 files,
YAML/JSON syntax errors (with line and column), an ONNX file of another input size than profiled, and servers that
share a port are one-line errors with exit status 2 and no traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from model_repository_gen.cluster_file import cluster_from_dict
from model_repository_gen.generate import generate
from plans.plan_json import load_plan
from poolpipe_common.errors import InputError
from profiling.reference import import_ppipe_profile
from profiling.zoo import build_zoo_model
from scheduler.sim.simulate_cli import load_overheads
from tests.conftest import REFERENCE_DIR, run_cli
from tests.deploy_helpers import make_plan, make_profile, write_cluster
from workloads.arrivals import arrival_times

SPEC = """cluster:
  gpus: {L4: 1, T4: 2}
  bandwidth_gbps: 10
max_partitions: 2
models:
  - profile: googlenet.json
    slo_multiplier: 5
    slo_margin: 0.1
"""


def _one_line_error(r, *expected: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
    for text in expected:
        assert text in r.stderr, r.stderr


@pytest.fixture(scope="module")
def spec_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("spec")
    import_ppipe_profile(REFERENCE_DIR, "googlenet-v3-pytorch").save(d / "googlenet.json")
    (d / "spec.yaml").write_text(SPEC)
    return d


@pytest.mark.parametrize("case", ["margin_typo", "multiplier_typo", "binary", "not_utf8", "yaml_syntax",
                                  "json_syntax", "cluster_typo"])
def test_bad_spec_files_are_one_line_errors(spec_dir: Path, case: str) -> None:
    bad = spec_dir / f"{case}.yaml"
    text, expected = {
        "margin_typo": (SPEC.replace("slo_margin:", "slo_margn:"),
                        ["models[0]: unknown field 'slo_margn' (did you mean 'slo_margin'?)"]),
        "multiplier_typo": (SPEC.replace("slo_multiplier:", "slo_multipler:"),
                            ["unknown field 'slo_multipler' (did you mean 'slo_multiplier'?)"]),
        "binary": (None, ["is a binary file, not a JSON/YAML text document"]),
        "not_utf8": (None, ["is not UTF-8 text (byte 9, line 1)"]),
        "yaml_syntax": (SPEC.replace("{L4: 1, T4: 2}", "{L4: 1, T4: 2"), ["line 3 column 17: invalid YAML"]),
        "json_syntax": (None, ["line 2 column 1: invalid JSON"]),
        "cluster_typo": (SPEC.replace("bandwidth_gbps", "bandwith_gbps"),
                         ["cluster: unknown field 'bandwith_gbps' (did you mean 'bandwidth_gbps'?)"]),
    }[case]
    if case == "binary":
        bad.write_bytes(b"\x08\x07\x12\x00\x00onnx-ish" * 8)
    elif case == "not_utf8":
        bad.write_bytes(b"cluster: \xe9t\xe9\n")
    elif case == "json_syntax":
        bad = spec_dir / "spec.json"
        bad.write_text('{"cluster": {},\n}')
    else:
        bad.write_text(text)
    _one_line_error(run_cli("plan", "--spec", bad, "--out", spec_dir / "plan.json"), str(bad), *expected)


def test_the_spec_as_written_plans(spec_dir: Path) -> None:
    r = run_cli("plan", "--spec", spec_dir / "spec.yaml", "--out", spec_dir / "plan.json", "--time-limit", "20")
    assert r.returncode == 0, r.stderr
    d = json.loads((spec_dir / "plan.json").read_text())
    d["models"][0]["pipelines"][0]["partitions"][0]["vgpu_fracton"] = "1/1"
    (spec_dir / "typo-plan.json").write_text(json.dumps(d, indent=1))
    _one_line_error(run_cli("simulate", "--plan", spec_dir / "typo-plan.json", "--out", spec_dir / "sim.json"),
                    "partitions[0]: unknown field 'vgpu_fracton' (did you mean 'vgpu_fraction'?)")


def test_overheads_and_trace_files(tmp_path: Path) -> None:
    (tmp_path / "ov.json").write_text('{"lead_uss": 5}')
    with pytest.raises(InputError, match=r"unknown field 'lead_uss' \(did you mean 'lead_us'\?\)"):
        load_overheads(str(tmp_path / "ov.json"))
    for bad in ('[3000, 2000]', '"fast"', '[1000, -1]', '[1000, "x"]'):
        (tmp_path / "ov.json").write_text('{"front_us": 2000, "front_quantiles_us": %s}' % bad)
        with pytest.raises(InputError, match="front_quantiles_us must"):
            load_overheads(str(tmp_path / "ov.json"))
    (tmp_path / "ov.json").write_text('{"front_us": 2000, "front_quantiles_us": [500, 1500, 9000]}')
    ov = load_overheads(str(tmp_path / "ov.json"))
    assert (ov.front_at(0.0), ov.front_at(0.5), ov.front_at(0.75), ov.front_at(1.0)) == (500, 1500, 5250, 9000)
    assert ov.to_dict()["front_quantiles_us"] == [500, 1500, 9000]
    (tmp_path / "trace.csv").write_bytes(b"HashOwner,HashApp,HashFunction,Trigger,1\n\xff\xfe,\xff\n")
    for kind in ("maf19", "maf21", "replay"):
        with pytest.raises(InputError, match="cannot read"):
            arrival_times(f"{kind}:{tmp_path / 'trace.csv'}", 10.0, 1.0)


@pytest.fixture(scope="module")
def resnet_plan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A plan for the 112x112 zoo resnet (profile measured on it), and the same model exported at 224x224."""
    d = tmp_path_factory.mktemp("resnet")
    small = build_zoo_model("resnet", d / "resnet.onnx")
    build_zoo_model("resnet", d / "resnet224.onnx", input_hw=224)
    plan = make_plan(make_profile(small, "resnet", 2, {"cpu": (1,)}), [[((0, 1), "cpu", 1, 1), ((1, 2), "cpu", 1, 1)]])
    plan.save(d / "plan.json")
    write_cluster(d / "cluster.json", [{"name": "box", "address": "127.0.0.1", "gpu_type": "cpu", "gpus": 2,
                                        "bandwidth_gbps": 10, "base_port": 0}])
    return d


def test_an_onnx_of_another_input_size_is_refused(resnet_plan: Path) -> None:
    d = resnet_plan
    r = run_cli("generate", "--plan", d / "plan.json", "--onnx", f"resnet={d / 'resnet224.onnx'}", "--cluster",
                d / "cluster.json", "--out", d / "deploy224")
    _one_line_error(r, "input 'input' is 602112 bytes per request, but the profile of resnet was measured with 150528")
    assert not (d / "deploy224").exists()


def test_servers_that_share_a_port_are_refused_by_launch(resnet_plan: Path) -> None:
    d = resnet_plan
    generate(load_plan(d / "plan.json"), {"resnet": d / "resnet.onnx"}, cluster_from_dict(json.loads(
        (d / "cluster.json").read_text())), d / "deploy")
    launch = d / "deploy" / "box" / "launch.json"
    doc = json.loads(launch.read_text())
    doc["servers"][1]["grpc_port"] = doc["servers"][0]["http_port"]  # a hand edit gone wrong
    launch.write_text(json.dumps(doc))
    r = run_cli("launch", d / "deploy")
    _one_line_error(r, f"both use port {doc['servers'][0]['http_port']} on 127.0.0.1")
