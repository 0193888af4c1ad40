"""Floors under the sidecar's costs, on Python's gRPC stack (grpc.aio, raw bytes, as the sidecar's calls are):

- ``bare_proxy``: a proxy that forwards Triton's ``ModelInfer`` and does nothing else (no decode, no checks, no
  metrics): what it adds over calling Triton directly is what any proxy in Python adds on this machine;
- ``bare_answerer``: a servicer that answers every ``ModelInfer`` at once with one canned answer (nothing
  forwarded, nothing computed): the most requests per core any server on Python's gRPC stack takes here;
- ``chained_stage_calls``: a pipeline's stages called one after the other by a bare client, each stage's output
  bytes sent on as the next one's input: what splitting a model into stage calls costs before any scheduler.

``benchmarks/sidecar.py`` prints each beside the sidecar's figure it is the floor of (pass-through latency, cost
per core, planned-path latency).
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
ANSWER = "--answer"  # the command line's word for "answer at once" instead of a target


def _identity(b: bytes) -> bytes:
    return b


def _canned_answer() -> bytes:
    """What the answerer sends back: a ModelInferResponse with one FP32 output of 16 zeros."""
    resp = service_pb2.ModelInferResponse(model_name="trivial", model_version="1")
    resp.outputs.add(name="y", datatype="FP32", shape=[1, 16])
    resp.raw_output_contents.append(bytes(64))
    return resp.SerializeToString()


async def _serve(target: str | None) -> None:
    """Until terminated: forward every ModelInfer to ``target``, or answer it at once (None); prints its port
    once listening."""
    if target is None:
        answer = _canned_answer()

        async def model_infer(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            return answer
    else:
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
    with _floor_process(target, f"the bare gRPC proxy to {target}") as (url, _):
        yield url


@contextmanager
def bare_answerer() -> Iterator[tuple[str, int]]:
    """A bare grpc.aio servicer that answers every ModelInfer at once, in its own process; yields its URL and
    PID (to read its CPU time) and stops it on the way out, also on failure."""
    with _floor_process(ANSWER, "the bare gRPC answerer") as started:
        yield started


@contextmanager
def _floor_process(arg: str, what: str) -> Iterator[tuple[str, int]]:
    proc = subprocess.Popen([sys.executable, "-m", "loadtest.grpc_floor", arg], stdout=subprocess.PIPE, text=True)
    try:
        # its port, once it listens (nothing within the timeout, or an empty line: it did not start)
        ready, _, _ = select.select([proc.stdout], [], [], START_TIMEOUT_S)
        line = proc.stdout.readline() if ready else ""  # type: ignore[union-attr]
        if not line.strip().isdigit():
            raise RuntimeError(f"{what} did not start within {START_TIMEOUT_S:.0f} s (exit code {proc.poll()})")
        yield f"127.0.0.1:{int(line)}", proc.pid
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
    asyncio.run(_serve(None if sys.argv[1] == ANSWER else sys.argv[1]))
