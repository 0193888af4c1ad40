"""A zoo model from ONNX to running Triton servers.

profile measure (two labels) -> profile merge -> plan -> generate -> launch, all through the CLI.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from model_repository_gen.manifest import load_manifest
from profiling.profile import load_profile
from profiling.zoo import build_zoo_model
from runtime.tritonserver import SHM_PREFIX
from tests.conftest import ROOT, run_cli
from tests.deploy_helpers import (
    make_plan,
    reference_output,
    run_pipeline_through_triton,
    write_cluster,
)

pytestmark = [pytest.mark.triton, pytest.mark.e2e]

HAS_PLANNER_CLI = importlib.util.find_spec("planner.cli.plan_cli") is not None


def _ok(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_zoo_model_from_profile_to_launched_pipelines(tmp_path):
    onnx_path = build_zoo_model("resnet", tmp_path / "resnet.onnx")
    common = ["--batch-sizes", "1,2", "--repeats", "3", "--warmup", "1"]
    # two "device types" emulated on the CPU with different thread counts
    _ok(run_cli("profile", "measure", onnx_path, "--threads", "2", "--label", "L4", "--blocks", "3", *common,
                "--out", tmp_path / "l4.json"))
    _ok(run_cli("profile", "measure", onnx_path, "--threads", "1", "--label", "T4", "--like", tmp_path / "l4.json",
                *common, "--out", tmp_path / "t4.json"))
    _ok(run_cli("profile", "merge", tmp_path / "l4.json", tmp_path / "t4.json", "--out", tmp_path / "resnet.json"))
    prof = load_profile(tmp_path / "resnet.json")
    assert prof.devices == ["L4", "T4"] and prof.num_blocks == 3

    plan_path = tmp_path / "plan.json"
    if HAS_PLANNER_CLI:  # the planner is on this branch: plan for one L4 and one T4
        spec = {"cluster": {"gpus": {"L4": 1, "T4": 1}, "bandwidth_gbps": 10}, "max_partitions": 2,
                "models": [{"profile": "resnet.json", "slo_multiplier": 10}]}
        (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
        _ok(run_cli("plan", "--spec", tmp_path / "spec.yaml", "--out", plan_path))
    else:  # until the planner lands: a hand-built plan on the measured profile
        make_plan(prof, [[((0, 1), "T4", 1, 1), ((1, 3), "L4", 1, 1)]]).save(plan_path)

    hosts = [{"name": n, "address": "127.0.0.1", "gpu_type": t, "gpus": 1, "bandwidth_gbps": 10, "device": "cpu",
              "cpu_cores": 2, "base_port": 0} for n, t in (("l4box", "L4"), ("t4box", "T4"))]
    cluster = write_cluster(tmp_path / "cluster.json", hosts)
    out = tmp_path / "deploy"
    _ok(run_cli("generate", "--plan", plan_path, "--onnx", f"resnet={onnx_path}", "--cluster", cluster,
                "--out", out))
    manifest = load_manifest(out)
    assert manifest.plan.to_dict()["models"][0]["profile"] == json.loads((tmp_path / "resnet.json").read_text())

    x = np.random.default_rng(7).standard_normal((2, 3, 112, 112)).astype(np.float32)
    expected = reference_output(onnx_path, x)
    proc = subprocess.Popen([sys.executable, "-m", "poolpipe", "launch", str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT)
    try:
        deadline = time.monotonic() + 60
        line = ""
        while time.monotonic() < deadline and not line.startswith("ready:"):
            line = proc.stdout.readline()
            if not line:
                break
        assert line.startswith(f"ready: {len(manifest.vgpus)} tritonserver(s)"), (line, proc.poll())
        for m in manifest.models:
            for p in m.pipelines:
                y, _ = run_pipeline_through_triton(manifest, p.id, x[:p.batch])  # a full planned batch
                np.testing.assert_allclose(y, expected[:p.batch], atol=1e-5, rtol=0)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not list(Path("/dev/shm").glob(f"{SHM_PREFIX}{proc.pid}_*"))
