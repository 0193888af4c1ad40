"""Floors under the sidecar's costs, on Python's gRPC stack (grpc.aio, raw bytes, as the sidecar's calls are):

- ``bare_proxy``: a proxy that forwards Triton's ``ModelInfer`` and does nothing else (no decode, no checks, no
  metrics): what it adds over calling Triton directly is what any proxy in Python adds on this machine;
- ``chained_stage_calls``: a pipeline's stages called one after the other by a bare client, each stage's output
  bytes sent on as the next one's input: what splitting a model into stage calls costs before any scheduler.

``benchmarks/sidecar.py`` prints both beside the sidecar's pass-through and planned-path latencies.
"""

from __future__ import annotations

import asyncio
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import grpc
import numpy as np
from tritonclient.grpc import service_pb2, service_pb2_grpc

from model_repository_gen.manifest import Manifest

SERVICE = "inference.GRPCInferenceService"
START_TIMEOUT_S = 30.0
WARMUP = 5  # requests through the chain before it is timed


def _identity(b: bytes) -> bytes:
    return b


async def _serve(target: str) -> None:
    """The proxy: forward every ModelInfer to ``target`` until terminated; prints its port once listening."""
    channel = grpc.aio.insecure_channel(target)
    call = channel.unary_unary(f"/{SERVICE}/ModelInfer", request_serializer=_identity,
                               response_deserializer=_identity)

    async def model_infer(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return await call(request)

    handler = grpc.method_handlers_generic_handler(SERVICE, {"ModelInfer": grpc.unary_unary_rpc_method_handler(
        model_infer, request_deserializer=_identity, response_serializer=_identity)})
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(port, flush=True)
    await server.wait_for_termination()


@contextmanager
def bare_proxy(target: str) -> Iterator[str]:
    """A bare grpc.aio proxy to the Triton at ``target`` ("host:port") in its own process; yields its URL and
    stops it (by its PID) on the way out, also on failure."""
    proc = subprocess.Popen([sys.executable, "-m", "loadtest.grpc_floor", target], stdout=subprocess.PIPE, text=True)
    try:
        # its port, once it listens (nothing within the timeout, or an empty line: it did not start)
        ready, _, _ = select.select([proc.stdout], [], [], START_TIMEOUT_S)
        line = proc.stdout.readline() if ready else ""  # type: ignore[union-attr]
        if not line.strip().isdigit():
            raise RuntimeError(f"the bare gRPC proxy to {target} did not start within {START_TIMEOUT_S:.0f} s "
                               f"(exit code {proc.poll()})")
        yield f"127.0.0.1:{int(line)}"
    finally:
        proc.terminate()
        try:
            proc.wait(5.0)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def chained_stage_calls(manifest: Manifest, model: str, x: np.ndarray, n: int, gap_s: float = 0.2
                              ) -> tuple[list[float], bytes]:
    """``n`` requests of input ``x`` through ``model``'s first pipeline, each stage called on the first vGPU of its
    pool by one grpc.aio client (a few warm-up requests first), one request every ``gap_s``: their latencies (s)
    and the last answer's bytes."""
    urls = {v.id: v.grpc_url for v in manifest.vgpus}
    stages = next(m for m in manifest.models if m.name == model).pipelines[0].stages
    for st in stages:
        if len(st.inputs) != 1 or len(st.outputs) != 1:
            raise ValueError(f"stage {st.triton_model} has {len(st.inputs)} inputs and {len(st.outputs)} outputs: "
                             "chained_stage_calls sends one tensor from stage to stage")
    channels = [grpc.aio.insecure_channel(urls[st.vgpus[0]]) for st in stages]
    stubs = [service_pb2_grpc.GRPCInferenceServiceStub(c) for c in channels]
    lat: list[float] = []
    data = b""
    try:
        for i in range(n + WARMUP):
            t0 = time.perf_counter()
            data = x.tobytes()
            for st, stub in zip(stages, stubs):
                req = service_pb2.ModelInferRequest(model_name=st.triton_model)
                spec = st.inputs[0]
                req.inputs.add(name=spec.name, datatype=spec.datatype, shape=[x.shape[0], *spec.shape])
                req.raw_input_contents.append(data)
                req.outputs.add(name=st.outputs[0].name)
                data = (await stub.ModelInfer(req)).raw_output_contents[0]
            if i >= WARMUP:
                lat.append(time.perf_counter() - t0)
            await asyncio.sleep(gap_s)
    finally:
        for c in channels:
            await c.close()
    return lat, data


if __name__ == "__main__":
    asyncio.run(_serve(sys.argv[1]))
