"""A variable-latency model served live: an emulated two-mode model (its profile carries latency quantiles, the
emulated servers draw each batch's hold from them) behind the sidecar with ``--policy orloj`` and ``elsa``."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from model_repository_gen.manifest import load_manifest
from runtime.launch import Deployment
from runtime.sidecar_process import SidecarProcess
from runtime.testbed import EMULATED_MODEL, build_emulated_deployment
from scheduler.server.planned.manifest_topology import topology_from_manifest
from scheduler.server.planned.shm_pool import PREFIX
from tests.test_emulated import expected_chain

pytestmark = pytest.mark.triton
REQUESTS = 24


def _infer(url: str, x: np.ndarray) -> np.ndarray:
    with grpcclient.InferenceServerClient(url) as c:
        meta = c.get_model_metadata(EMULATED_MODEL)
        inp = grpcclient.InferInput(meta.inputs[0].name, list(x.shape), meta.inputs[0].datatype)
        inp.set_data_from_numpy(x)
        return c.infer(EMULATED_MODEL, [inp], client_timeout=60).as_numpy(meta.outputs[0].name)


@pytest.mark.parametrize("policy", ["orloj", "elsa"])
def test_variable_latency_model_is_served_with_the_policy(tmp_path: Path, policy: str) -> None:
    deploy = build_emulated_deployment(tmp_path, slo_us=5_000_000.0, two_mode=True)  # generous: a busy machine
    manifest = load_manifest(deploy)
    # the distributions reach both sides: the sidecar's topology and every emulated server's config
    topo = topology_from_manifest(manifest)
    assert all(st.latency_dist for p in topo.pipelines[EMULATED_MODEL] for st in p.stages)
    configs = list(deploy.rglob("config.pbtxt"))
    assert configs and all("emulated_latency_quantiles_us" in c.read_text() for c in configs)
    pipe = manifest.model(EMULATED_MODEL).pipelines[0]
    shape = [int(d) for d in manifest.model(EMULATED_MODEL).inputs[0].shape]
    rng = np.random.default_rng(7)
    xs = [rng.standard_normal((1, *shape)).astype(np.float32) for _ in range(REQUESTS)]
    with Deployment(deploy, check_hardware=False, log_dir=tmp_path / "logs"):
        sc = SidecarProcess(manifest=deploy, policy=policy, log_path=tmp_path / "sidecar.log",
                            extra_args=("--batch-log", str(tmp_path / "batches.jsonl")))
        sc.start()
        try:
            with ThreadPoolExecutor(8) as pool:  # concurrent clients, so batches can form
                ys = list(pool.map(lambda x: _infer(sc.grpc_url, x), xs))
        finally:
            pid = sc.proc.pid if sc.proc else None
            assert sc.stop() == 0
    for x, y in zip(xs, ys):
        np.testing.assert_array_equal(y, expected_chain(pipe, x))  # every hop ran, in order, on this input
    stages = [json.loads(line) for line in (tmp_path / "batches.jsonl").read_text().splitlines()]
    served = [s for s in stages if s["model"] == EMULATED_MODEL and s["stage"] == len(pipe.stages) - 1]
    assert sum(s["batch"] for s in served) >= REQUESTS  # every request through the last stage (calibration adds)
    assert "Traceback" not in (tmp_path / "sidecar.log").read_text()
    assert pid is not None and not list(Path("/dev/shm").glob(f"{PREFIX}{pid}_*"))
