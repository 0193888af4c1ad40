"""Stage calls over a real tritonserver's HTTP endpoint (scheduler/server/planned/stage_http.py): the answer equals
the model's, connections are reused, Triton's errors arrive as the gRPC codes the executor acts on, a timeout and a
dead server are explicit errors, and a planned sidecar serves over either protocol."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import urllib.request
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from ensembles.triton_baseline import start_baseline, write_whole_model
from model_repository_gen.manifest import StageInfo
from poolpipe_common.tensors import TensorSpec
from runtime.launch import Deployment
from runtime.sidecar_process import SidecarProcess
from runtime.testbed import build_deployment, write_trivial_onnx
from scheduler.server.planned.stage_http import HttpStageClient, StageCallError, decode_answer, encode_call
from scheduler.server.planned.stage_io import HopTensor

pytestmark = pytest.mark.triton
X, Y = TensorSpec("x", "FP32", (16,)), TensorSpec("y", "FP32", (16,))
STAGE = StageInfo("trivial", (0, 1), "cpu", 1, ("v0",), (X,), (Y,), {1: 1.0})


@pytest.fixture(scope="module")
def triton(tmp_path_factory: pytest.TempPathFactory):
    work = tmp_path_factory.mktemp("stage-http")
    write_whole_model(work / "repo", write_trivial_onnx(work / "trivial.onnx"), "trivial", 32)
    with start_baseline(work / "repo", log_path=work / "triton.log") as t:
        yield t


async def _call(client: HttpStageClient, stage: StageInfo = STAGE, timeout_s: float = 10.0, model: str = "trivial"
                ) -> dict:
    """One call of a row of ones as ``stage``'s input."""
    spec = stage.inputs[0]
    head, binary, offsets = encode_call(stage, [HopTensor(spec, [1, *spec.shape], bytes(spec.bytes_per_request()))],
                                        None, 1, "r1")
    assert offsets == {}
    return await client.infer(model, head, binary, timeout_s)


async def _stopped(pid: int) -> None:
    """Until every thread of ``pid`` is stopped (state T in /proc): SIGSTOP is delivered asynchronously."""
    def running(task: Path) -> bool:
        try:
            return (task / "stat").read_text().rsplit(")", 1)[1].split()[0] not in ("T", "t", "Z", "X")
        except FileNotFoundError:  # a thread that ended meanwhile
            return False

    while any(running(t) for t in Path(f"/proc/{pid}/task").iterdir()):
        await asyncio.sleep(0.01)


async def _raises(call) -> StageCallError:
    with pytest.raises(StageCallError) as e:
        await call
    return e.value


def test_answers_equal_the_model_and_connections_are_reused(triton) -> None:
    async def main() -> tuple[list[dict], int]:
        client = HttpStageClient(triton.http_url)
        outs = []
        for i in range(5):
            x = np.arange(16 * (i + 1), dtype=np.float32).reshape(i + 1, 16) - 20
            head, binary, _ = encode_call(STAGE, [HopTensor(X, list(x.shape), x.tobytes())], None, len(x), str(i))
            outs.append((x, await client.infer("trivial", head, binary, 10.0)))
        many = await asyncio.gather(*[client.infer("trivial", *encode_call(
            STAGE, [HopTensor(X, [1, 16], bytes(64))], None, 1, "c")[:2], 10.0) for _ in range(4)])
        idle = len(client.idle)
        client.close()
        return outs + [(np.zeros((1, 16), np.float32), m) for m in many], idle

    outs, idle = asyncio.run(main())
    for x, out in outs:
        shape, data = out["y"]
        assert shape == list(x.shape)
        np.testing.assert_array_equal(np.frombuffer(data, np.float32).reshape(x.shape), np.maximum(x, 0))
    assert idle == 4  # the sequential calls shared one connection; four at once needed four


def test_tritons_errors_arrive_as_grpc_codes(triton) -> None:
    async def main() -> None:
        client = HttpStageClient(triton.http_url)
        e = await _raises(_call(client, model="nope"))
        assert e.code == grpc.StatusCode.NOT_FOUND and "unknown model" in e.details
        wrong = StageInfo("trivial", (0, 1), "cpu", 1, ("v0",), (TensorSpec("x", "FP32", (15,)),), (Y,), {})
        e = await _raises(_call(client, wrong))
        assert e.code == grpc.StatusCode.INVALID_ARGUMENT and "unexpected shape" in e.details
        # a server that cannot answer in time (stopped, not merely fast: a 1 us timeout raced the trivial model's
        # answer and lost on a loaded host): the call gives up, explicitly, within its own timeout
        os.kill(triton.proc.pid, signal.SIGSTOP)
        try:
            await _stopped(triton.proc.pid)  # a signal takes effect after kill() returns: a CI run's call got through
            e = await _raises(_call(client, timeout_s=0.2))
        finally:
            os.kill(triton.proc.pid, signal.SIGCONT)
        assert e.code == grpc.StatusCode.DEADLINE_EXCEEDED
        assert (await _call(client))["y"][0] == [1, 16]  # and the client still works
        client.close()
    asyncio.run(main())


def test_a_dead_server_is_unavailable(tmp_path: Path) -> None:
    write_whole_model(tmp_path / "repo", write_trivial_onnx(tmp_path / "trivial.onnx"), "trivial", 32)

    async def main() -> None:
        with start_baseline(tmp_path / "repo", log_path=tmp_path / "triton.log") as t:
            client = HttpStageClient(t.http_url)
            assert (await _call(client))["y"][0] == [1, 16]
        e = await _raises(_call(client))  # the kept connection was closed, and a new one is refused
        assert e.code == grpc.StatusCode.UNAVAILABLE
    asyncio.run(main())


def test_a_connection_not_made_is_unavailable_within_the_calls_timeout() -> None:
    """A host that answers no SYN (cut off the network; here a listener whose accept queue is full, on loopback):
    the call fails UNAVAILABLE within its own timeout, not after the kernel's minutes of SYN retries (before: the
    request was never answered)."""
    import socket
    import time

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = [socket.socket() for _ in range(4)]
    try:
        for f in fillers:  # fill the accept queue: later SYNs are dropped
            f.setblocking(False)
            f.connect_ex(("127.0.0.1", port))

        async def main() -> StageCallError:
            return await asyncio.wait_for(_raises(_call(HttpStageClient(f"127.0.0.1:{port}"), timeout_s=0.3)), 20)
        t0 = time.monotonic()
        e = asyncio.run(main())
        assert e.code == grpc.StatusCode.UNAVAILABLE and "within 0.300 s" in str(e), e
        assert time.monotonic() - t0 < 5.0
    finally:
        for f in (*fillers, listener):
            f.close()


def test_an_answer_decodes_binary_and_shared_memory_outputs() -> None:
    head = b'{"outputs":[{"name":"a","shape":[2,1],"parameters":{"binary_data_size":8}},' \
           b'{"name":"b","shape":[2,3],"parameters":{"shared_memory_region":"r"}},' \
           b'{"name":"c","shape":[1],"parameters":{"binary_data_size":2}}]}'
    out = decode_answer(head + b"12345678xy", len(head))
    assert out == {"a": ([2, 1], b"12345678"), "b": ([2, 3], b""), "c": ([1], b"xy")}


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_planned_sidecar_serves_over_either_stage_protocol(tmp_path: Path, protocol: str) -> None:
    deploy, _, _ = build_deployment(tmp_path, name="resnet", slo_us=500_000.0)
    x = np.random.default_rng(1).standard_normal((1, 3, 112, 112)).astype(np.float32)
    with Deployment(deploy, check_hardware=False, log_dir=tmp_path / "logs"), \
            SidecarProcess(manifest=deploy, log_path=tmp_path / "sidecar.log",
                           extra_args=("--stage-protocol", protocol)) as sc:
        client = grpcclient.InferenceServerClient(sc.grpc_url)
        inp = grpcclient.InferInput("input", [1, 3, 112, 112], "FP32")
        inp.set_data_from_numpy(x)
        first = client.infer("resnet", [inp]).as_numpy("logits")
        assert first.shape == (1, 10) and np.isfinite(first).all()
        np.testing.assert_allclose(client.infer("resnet", [inp]).as_numpy("logits"), first, atol=1e-5)
        assert client.get_inference_statistics("resnet").model_stats[0].inference_stats.success.count == 2
        with urllib.request.urlopen(f"http://127.0.0.1:{sc.metrics_port}/metrics", timeout=5) as r:
            hops = {k: float(v) for k, v in re.findall(r'poolpipe_sidecar_hops_total\{kind="(\w+)"\} (\S+)',
                                                       r.read().decode())}
    assert hops[protocol] >= 2 and hops["shm"] >= 2  # each answer crossed hosts once as bytes, once through shm
    assert hops["http" if protocol == "grpc" else "grpc"] == 0
