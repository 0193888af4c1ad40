"""``grpc.health.v1`` on the sidecar's gRPC port (the server, each planned and pass-through model), Triton's
``--strict-readiness``, and readiness that says what is missing: a sidecar whose planned servers are not up yet next
to a pass-through Triton that is."""

from __future__ import annotations

import queue
import threading
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from grpc_health.v1 import health_pb2, health_pb2_grpc

from runtime.launch import Deployment
from runtime.sidecar_process import SidecarProcess
from runtime.testbed import EMULATED_MODEL, build_emulated_deployment
from runtime.tritonserver import TritonProcess

pytestmark = pytest.mark.triton
MODELS = Path(__file__).resolve().parent / "models"
Status = health_pb2.HealthCheckResponse


def _check(stub: health_pb2_grpc.HealthStub, service: str) -> int:
    return stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10).status


def _simple(c: grpcclient.InferenceServerClient) -> None:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = [grpcclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    for i in inputs:
        i.set_data_from_numpy(a)
    np.testing.assert_array_equal(c.infer("simple", inputs).as_numpy("OUTPUT0"), 2 * a)


def _watch(stub: health_pb2_grpc.HealthStub, service: str, seen: queue.Queue) -> grpc.Future:
    call = stub.Watch(health_pb2.HealthCheckRequest(service=service))

    def pump() -> None:
        try:
            for r in call:
                seen.put(r.status)
        except grpc.RpcError:
            pass
    threading.Thread(target=pump, daemon=True).start()
    return call


def test_grpc_health_and_strict_readiness_name_what_is_missing(tmp_path: Path) -> None:
    deploy = build_emulated_deployment(tmp_path, slo_us=3_000_000.0)
    with TritonProcess(MODELS, log_path=tmp_path / "triton.log") as triton, \
            SidecarProcess(manifest=deploy, passthrough=triton.grpc_url, log_path=tmp_path / "strict.log") as strict, \
            SidecarProcess(manifest=deploy, passthrough=triton.grpc_url, log_path=tmp_path / "lax.log",
                           extra_args=("--strict-readiness", "false")) as lax:
        channel = grpc.insecure_channel(strict.grpc_url)
        health = health_pb2_grpc.HealthStub(channel)
        c = grpcclient.InferenceServerClient(strict.grpc_url)
        # the planned model's servers are not up: strict readiness says the server is not ready, and why
        assert _check(health, "") == Status.NOT_SERVING and not c.is_server_ready()
        assert _check(health, EMULATED_MODEL) == Status.NOT_SERVING and not c.is_model_ready(EMULATED_MODEL)
        assert _check(health, "simple") == Status.SERVING
        with pytest.raises(grpc.RpcError) as unknown:
            _check(health, "no_such_model")
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
        entry = next(m for m in c.get_model_repository_index().models if m.name == EMULATED_MODEL)
        assert entry.state == "UNAVAILABLE" and f"pipeline {EMULATED_MODEL}/" in entry.reason, entry
        _simple(c)
        # --strict-readiness false: ready while live, the planned model's own state still says not ready
        lc = grpcclient.InferenceServerClient(lax.grpc_url)
        lax_health = health_pb2_grpc.HealthStub(grpc.insecure_channel(lax.grpc_url))
        assert lc.is_server_ready() and _check(lax_health, "") == Status.SERVING
        assert not lc.is_model_ready(EMULATED_MODEL) and _check(lax_health, EMULATED_MODEL) == Status.NOT_SERVING
        _simple(lc)  # and it keeps serving the model that is up
        seen: queue.Queue = queue.Queue()
        watch = _watch(health, EMULATED_MODEL, seen)
        assert seen.get(timeout=10) == Status.NOT_SERVING
        with Deployment(deploy, check_hardware=False, log_dir=tmp_path / "logs"):
            assert seen.get(timeout=60) == Status.SERVING  # Watch sends the change
            t0 = time.monotonic()
            while _check(health, "") != Status.SERVING:
                assert time.monotonic() - t0 < 30, "the server did not turn ready"
                time.sleep(0.1)
            assert c.is_server_ready()
        watch.cancel()
        channel.close()
    log = (tmp_path / "strict.log").read_text()
    assert f"event=not_ready model={EMULATED_MODEL} reason='pipeline {EMULATED_MODEL}/" in log
    assert f"event=ready model={EMULATED_MODEL}" in log
