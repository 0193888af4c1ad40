"""Faults of poolpipe's own making, live on emulated Triton servers: a storm of callers that go away before their
batches start gives the reserved GPU time back (a request after it is served at once)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2, service_pb2_grpc

from runtime.launch import Deployment
from runtime.sidecar_process import SidecarProcess
from runtime.testbed import EMULATED_MODEL, build_emulated_deployment

pytestmark = pytest.mark.triton


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory):
    """An emulated deployment (a T4 and an L4 server, ~6 ms per stage at batch 2) running for the module."""
    work = tmp_path_factory.mktemp("faults")
    deploy = build_emulated_deployment(work)
    with Deployment(deploy, check_hardware=False, log_dir=work / "logs"):
        yield work, deploy


def infer_request(url: str, batch: int = 1) -> service_pb2.ModelInferRequest:
    """A valid request for the emulated model (zeros), shaped from the sidecar's metadata."""
    meta = grpcclient.InferenceServerClient(url).get_model_metadata(EMULATED_MODEL)
    inp = meta.inputs[0]
    shape = [batch, *[int(d) for d in inp.shape[1:]]]
    req = service_pb2.ModelInferRequest(model_name=EMULATED_MODEL)
    req.inputs.add(name=inp.name, datatype=inp.datatype, shape=shape)
    req.raw_input_contents.append(np.zeros(shape, np.float32).tobytes())
    return req


async def _storm_then_one(url: str, req: service_pb2.ModelInferRequest, n: int, cancel_after_s: float
                          ) -> tuple[int, float]:
    """``n`` requests at once, cancelled by their clients after ``cancel_after_s``; then one more request.
    Returns how many of the storm were answered before the cancel, and the last request's latency (s)."""
    async with grpc.aio.insecure_channel(url) as ch:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(ch)
        calls = [stub.ModelInfer(req, timeout=10) for _ in range(n)]
        await asyncio.sleep(cancel_after_s)
        answered = sum(c.done() for c in calls)
        for c in calls:
            c.cancel()
        await asyncio.sleep(0.01)
        t0 = time.monotonic()
        await stub.ModelInfer(req, timeout=10)
        return answered, time.monotonic() - t0


def test_a_cancellation_storm_gives_the_reserved_gpu_time_back(servers: tuple[Path, Path]) -> None:
    """200 requests reserve ~0.6 s of both vGPUs ahead; their clients go away after 50 ms. The batches not yet
    sent are abandoned and their reservations released, so the next request is served within its own few ms
    instead of behind 0.6 s of work nobody waits for (as before: the core kept the reservations)."""
    work, deploy = servers
    sc = SidecarProcess(manifest=deploy, log_path=work / "sidecar-cancel.log").start().wait_ready()
    try:
        req = infer_request(sc.grpc_url)
        answered, latency = asyncio.run(_storm_then_one(sc.grpc_url, req, 200, 0.05))
        assert answered < 50, f"{answered} of the storm were answered before the cancel: no storm"
        assert latency < 0.2, f"a request after the storm took {latency * 1e3:.0f} ms"
        for _ in range(3):  # and it serves on
            grpcclient.InferenceServerClient(sc.grpc_url).infer(EMULATED_MODEL, [_input(req)])
    finally:
        assert sc.stop() == 0


def _input(req: service_pb2.ModelInferRequest) -> grpcclient.InferInput:
    t = req.inputs[0]
    inp = grpcclient.InferInput(t.name, list(t.shape), t.datatype)
    inp.set_data_from_numpy(np.zeros(list(t.shape), np.float32))
    return inp
