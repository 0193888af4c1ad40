"""Two sidecar shards (``serve --shard 0/2`` and ``1/2``) over one emulated deployment, a client alternating
between them as a round-robin Service would: every request answered, each shard on its own vGPUs only."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from model_repository_gen.manifest import load_manifest
from runtime.launch import Deployment
from runtime.sidecar_process import SidecarProcess
from runtime.testbed import EMULATED_MODEL, build_emulated_deployment
from tests.conftest import run_cli

pytestmark = pytest.mark.triton
REQUESTS = 60


def _wait_ready(client: grpcclient.InferenceServerClient) -> None:
    deadline = time.monotonic() + 60
    while not client.is_model_ready(EMULATED_MODEL):
        assert time.monotonic() < deadline, "a shard did not turn ready"
        time.sleep(0.1)


def test_two_shards_serve_the_plan_round_robin_and_lose_nothing(tmp_path: Path) -> None:
    deploy = build_emulated_deployment(tmp_path, slo_us=3_000_000.0, gpus=2)  # 2 T4s, 2 L4s: 1 of each per shard
    manifest = load_manifest(deploy)
    logs = [tmp_path / f"batches{i}.jsonl" for i in range(2)]
    shards = [SidecarProcess(manifest=deploy, log_path=tmp_path / f"sidecar{i}.log",
                             extra_args=("--shard", f"{i}/2", "--batch-log", str(logs[i]))) for i in range(2)]
    with Deployment(deploy, check_hardware=False, log_dir=tmp_path / "logs"):
        try:
            for sc in shards:
                sc.start()
            clients = [grpcclient.InferenceServerClient(sc.grpc_url) for sc in shards]
            for c in clients:
                _wait_ready(c)
            meta = clients[0].get_model_metadata(EMULATED_MODEL)
            shape = [1, *[int(d) for d in meta.inputs[0].shape[1:]]]

            def call(k: int) -> tuple[int, ...]:
                inp = grpcclient.InferInput(meta.inputs[0].name, shape, meta.inputs[0].datatype)
                inp.set_data_from_numpy(np.full(shape, k, np.float32))
                answer = clients[k % 2].infer(EMULATED_MODEL, [inp], client_timeout=30)
                return answer.as_numpy(meta.outputs[0].name).shape

            with ThreadPoolExecutor(4) as pool:
                shapes = list(pool.map(call, range(REQUESTS)))
            assert len(shapes) == REQUESTS and all(s[0] == 1 for s in shapes)  # every request answered
        finally:
            codes = [sc.stop() for sc in shards]
    assert codes == [0, 0]
    used = [{json.loads(line)["vgpu"] for line in f.read_text().splitlines()} for f in logs]
    assert used[0] and used[1] and not used[0] & used[1]  # disjoint shares, both serving
    assert used[0] | used[1] == {g.id for g in manifest.vgpus}


def test_a_shard_without_a_complete_pipeline_is_refused(tmp_path: Path) -> None:
    deploy = build_emulated_deployment(tmp_path)  # one GPU per pool: a second shard would hold nothing
    r = run_cli("serve", "--manifest", deploy, "--shard", "1/2", "--grpc-port", "1", "--http-port", "2",
                "--metrics-port", "3")
    assert r.returncode == 2 and "no complete pipeline" in r.stderr and "use fewer than 2 shards" in r.stderr
    r = run_cli("serve", "--manifest", deploy, "--shard", "2/2")
    assert r.returncode == 2 and "0 <= I < N" in r.stderr
