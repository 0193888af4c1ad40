"""Triton's batcher controls through the live sidecar on an emulated T4 (real tritonservers holding each batch for
its profiled latency): `generate --dynamic-batching`, priority order, REJECT at max_queue_size and a per-request queue
timeout, with Triton's errors over gRPC and HTTP."""

from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from profiling.reference import import_ppipe_profile
from runtime.launch import Deployment
from runtime.sidecar_process import SidecarProcess
from tests.conftest import REFERENCE_DIR, run_cli
from tests.deploy_helpers import make_plan, write_cluster
from tests.planned_testbed import metric

pytestmark = pytest.mark.triton
MODEL = "googlenet-v3-pytorch"  # on a whole emulated T4: 18 ms for 1 request, 30 ms for 2
SPEC = ("priority_levels: 2 default_priority_level: 2 max_queue_delay_microseconds: 100 "
        "default_queue_policy { max_queue_size: 4 default_timeout_microseconds: 10000000 allow_timeout_override: true }"
        " priority_queue_policy { key: 1 value { max_queue_size: 16 default_timeout_microseconds: 10000000"
        " allow_timeout_override: true } }")
BUSY = 4  # priority-1 batches of the stream outstanding: one runs, the others queue (level 1 holds 16)


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory):
    work = tmp_path_factory.mktemp("batcher")
    plan = make_plan(import_ppipe_profile(REFERENCE_DIR, MODEL), [[((0, 10), "T4", 1, 1)]], batch=2)
    plan = replace(plan, models=(replace(plan.models[0], slo_us=5_000_000.0),))  # nothing is shed for its SLO
    plan.save(work / "plan.json")
    cluster = write_cluster(work / "cluster.json", [{"name": "t4box", "address": "127.0.0.1", "gpu_type": "T4",
                                                    "gpus": 1, "bandwidth_gbps": 10, "device": "emulated",
                                                    "base_port": 0}])
    bad = run_cli("generate", "--plan", work / "plan.json", "--cluster", cluster, "--out", work / "bad",
                  "--dynamic-batching", "priority_levels: 2")
    assert bad.returncode == 2 and "default_priority_level must be in range [1, 2]" in bad.stderr
    r = run_cli("generate", "--plan", work / "plan.json", "--cluster", cluster, "--out", work / "deploy",
                "--emulated-tensor-scale", "0.01", "--dynamic-batching", f"{MODEL}={SPEC}")
    assert r.returncode == 0, r.stderr
    assert "max_queue_delay_microseconds ignored" in r.stdout
    written = json.loads((work / "deploy" / "manifest.json").read_text())["models"][0]["dynamic_batching"]
    assert written["priority_queue_policy"]["1"]["max_queue_size"] == 16
    with Deployment(work / "deploy", log_dir=work / "logs"):
        sc = SidecarProcess(manifest=work / "deploy", policy="fifs", log_path=work / "sidecar.log").start()
        try:
            sc.wait_ready()
            yield sc
        finally:
            assert sc.stop() == 0


def _inputs(rows: int = 1) -> list:
    x = grpcaio.InferInput("input", [rows, 3, 22, 22], "FP32")
    x.set_data_from_numpy(np.zeros((rows, 3, 22, 22), np.float32))
    return [x]


async def _call(c: grpcaio.InferenceServerClient, name: str, done: dict, rows: int = 1, **kw) -> None:
    try:
        await c.infer(MODEL, _inputs(rows), **kw)
        done[name] = time.monotonic()
    except InferenceServerException as e:
        done[name] = e


def _metric(metrics_port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as r:
        return metric(r.read().decode(), name, f'model="{MODEL}"')


async def _until(metrics_port: int, name: str, at_least: float) -> None:
    """Wait until the sidecar's own metric ``name`` reaches ``at_least`` (the order of events is the sidecar's,
    not the client's clock)."""
    while await asyncio.to_thread(_metric, metrics_port, name) < at_least:
        await asyncio.sleep(0.01)


async def _scenario(url: str, metrics_port: int) -> tuple[dict, int]:
    """A stream of priority-1 batches (``BUSY`` outstanding, two rows each: a full batch) keeps the T4 busy with one
    always queued, so no priority-2 request can start while it runs, however slow this machine. While it runs: six
    priority-2 requests (level 2 holds four: two are refused), a priority-1 request with a 1 ms timeout (it waits
    behind a queued batch of the stream: it expires), then four priority-1 requests H, queued after the four L. The
    stream ends once every H is answered; then the L are served. Returns the outcomes and the stream's count."""
    done: dict = {}
    stop = asyncio.Event()
    sent = 0

    async def busy(c: grpcaio.InferenceServerClient) -> None:
        nonlocal sent
        while not stop.is_set():
            sent += 1
            await _call(c, f"B{sent}", done, rows=2, priority=1)

    async with grpcaio.InferenceServerClient(url) as c:
        stream = [asyncio.ensure_future(busy(c)) for _ in range(BUSY)]
        await _until(metrics_port, "nv_inference_pending_request_count", 2)  # one runs, the others queue
        low = [asyncio.ensure_future(_call(c, f"L{i}", done)) for i in range(6)]
        await _until(metrics_port, "nv_inference_request_failure", 2)  # all six arrived: two refused
        await _call(c, "T", done, priority=1, timeout=1000)
        await asyncio.gather(*[_call(c, f"H{i}", done, rows=2, priority=1) for i in range(4)])
        stop.set()
        await asyncio.gather(*stream, *low)
    return done, sent


def test_priority_order_queue_size_and_timeout_live(sidecar: SidecarProcess) -> None:
    done, busy = asyncio.run(_scenario(sidecar.grpc_url, sidecar.metrics_port))
    errors = {k: v for k, v in done.items() if isinstance(v, InferenceServerException)}
    refused = sorted(k for k in errors if k.startswith("L"))
    assert len(refused) == 2 and sorted(errors) == [*refused, "T"], errors
    for k in refused:
        assert errors[k].status() == "StatusCode.UNAVAILABLE" and errors[k].message() == "Exceeds maximum queue size"
    assert errors["T"].status() == "StatusCode.UNAVAILABLE" and errors["T"].message() == "Request timeout expired"
    # the refusals are failures with Triton's reason REJECTED, in the statistics and nv_inference_request_failure
    with urllib.request.urlopen(f"http://127.0.0.1:{sidecar.metrics_port}/metrics", timeout=5) as r:
        metrics = r.read().decode()
    labels = f'model="{MODEL}",reason="REJECTED",version="1"'
    assert re.search(rf"^nv_inference_request_failure\{{{labels}\}} 3(\.0)?$", metrics, re.M), metrics
    with httpclient.InferenceServerClient(sidecar.http_url) as h:
        stats = h.get_inference_statistics(MODEL)["model_stats"][0]["inference_stats"]
    assert int(stats["fail"]["count"]) == 3 and int(stats["success"]["count"]) == busy + 8
    high = [done[f"H{i}"] for i in range(4)]
    low = [done[k] for k in (f"L{i}" for i in range(6)) if k not in refused]
    assert max(high) < min(low), "priority 1 is served before the queued priority 2"
    # HTTP: the same parameters, Triton's type check
    with httpclient.InferenceServerClient(sidecar.http_url) as h:
        x = httpclient.InferInput("input", [1, 3, 22, 22], "FP32")
        x.set_data_from_numpy(np.zeros((1, 3, 22, 22), np.float32))
        assert h.infer(MODEL, [x], priority=1).as_numpy("output").shape == (1, 10)
        cfg = h.get_model_config(MODEL)
    body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 3, 22, 22], "data": [0.0] * 1452}],
            "parameters": {"priority": "high"}}
    req = urllib.request.Request(f"http://{sidecar.http_url}/v2/models/{MODEL}/infer", json.dumps(body).encode())
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 400 and "invalid value type for 'priority' parameter" in e.value.read().decode()
    assert cfg["dynamic_batching"]["priority_levels"] == 2
    log = Path(sidecar.log_path).read_text()
    assert "Traceback" not in log
