"""Sending fuzz cases (loadtest/fuzz_cases.py) to a live KServe v2 server and classifying what came back:
an error answer, accepted (a malformed request answered with outputs), shed (accepted into the scheduler's
queue, then dropped to protect the SLO), unhandled (HTTP 500, gRPC UNKNOWN: an
exception escaped the server's handler), hung (no answer within the timeout) or cancelled by the client."""

from __future__ import annotations

import asyncio
import os
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import AsyncIterator

import aiohttp
import grpc
import tritonclient.utils.shared_memory as shm
from tritonclient.grpc import service_pb2, service_pb2_grpc

from loadtest.fuzz_cases import GrpcCase, HttpCase, Target
from poolpipe_common.tensors import TensorSpec

MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"
# grpc's own answer to bytes that are not a ModelInferRequest: an error answer, not an escaped exception
_UNDECODABLE = "Failed to deserialize"


@dataclass(frozen=True)
class Outcome:
    result: str  # "error" | "accepted" | "shed" (queued, then dropped to protect the SLO) | "unhandled" | "hung"
    #              | "cancelled"
    detail: str = ""


def grpc_outcome(e: grpc.aio.AioRpcError) -> Outcome:
    code, details = e.code(), e.details() or ""
    if code == grpc.StatusCode.CANCELLED:
        return Outcome("cancelled", details)
    if code == grpc.StatusCode.UNAVAILABLE and "request shed" in details:
        return Outcome("shed", details)
    if code == grpc.StatusCode.UNKNOWN or (code == grpc.StatusCode.INTERNAL and _UNDECODABLE not in details):
        return Outcome("unhandled", f"{code.name}: {details}")
    return Outcome("error", code.name)


async def send_grpc(channel: grpc.aio.Channel, case: GrpcCase, timeout_s: float) -> Outcome:
    """One case over gRPC; an answer later than ``timeout_s`` counts as hung."""
    call = channel.unary_unary(MODEL_INFER, request_serializer=lambda b: b,
                               response_deserializer=service_pb2.ModelInferResponse.FromString)
    payload = case.raw if case.raw is not None else case.request.SerializeToString()
    try:
        await asyncio.wait_for(call(payload, timeout=timeout_s * 2), timeout_s)
        return Outcome("accepted")
    except asyncio.TimeoutError:
        return Outcome("hung")
    except grpc.aio.AioRpcError as e:
        if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
            return Outcome("hung")
        return grpc_outcome(e)


async def send_http(session: aiohttp.ClientSession, base_url: str, case: HttpCase, timeout_s: float) -> Outcome:
    """One case over HTTP; an answer later than ``timeout_s`` counts as hung."""
    try:
        async with session.post(base_url + case.path, data=case.body, headers=case.headers,
                                timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
            text = (await r.read())[:200].decode(errors="replace")
            if r.status == 200:
                return Outcome("accepted")
            if r.status == 503 and "request shed" in text:
                return Outcome("shed", text)
            return Outcome("unhandled" if r.status >= 500 and r.status != 503 else "error", f"{r.status} {text}")
    except asyncio.TimeoutError:
        return Outcome("hung")


async def cancel_grpc(channel: grpc.aio.Channel, request: service_pb2.ModelInferRequest, after_s: float) -> Outcome:
    """A valid request the client cancels after ``after_s`` (the server must not mind)."""
    call = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=10)
    await asyncio.sleep(after_s)
    call.cancel()
    try:
        await call
        return Outcome("accepted")
    except asyncio.CancelledError:
        return Outcome("cancelled")
    except grpc.aio.AioRpcError as e:
        return grpc_outcome(e)


async def cancel_http(session: aiohttp.ClientSession, base_url: str, case: HttpCase, after_s: float) -> Outcome:
    """A valid request whose connection the client drops after ``after_s``."""
    try:
        return await asyncio.wait_for(send_http(session, base_url, case, 10.0), after_s)
    except asyncio.TimeoutError:
        return Outcome("cancelled")


@asynccontextmanager
async def fuzz_target(channel: grpc.aio.Channel, model: str, tag: str) -> AsyncIterator[Target]:
    """The model's Target with two client shm regions registered with the server; both removed afterwards."""
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    meta = await stub.ModelMetadata(service_pb2.ModelMetadataRequest(name=model), timeout=10)
    config = await stub.ModelConfig(service_pb2.ModelConfigRequest(name=model), timeout=10)
    inp = meta.inputs[0]
    spec = TensorSpec(inp.name, inp.datatype, tuple(int(d) for d in inp.shape[1:]))
    max_batch = max(1, config.config.max_batch_size)
    names = (f"fuzz_small_{tag}_{os.getpid()}", f"fuzz_big_{tag}_{os.getpid()}")
    sizes = (Target.small_bytes, 2 * max_batch * spec.bytes_per_request())
    handles = [shm.create_shared_memory_region(n, "/" + n, s) for n, s in zip(names, sizes)]
    try:
        for n, s in zip(names, sizes):
            await stub.SystemSharedMemoryRegister(service_pb2.SystemSharedMemoryRegisterRequest(
                name=n, key="/" + n, byte_size=s), timeout=10)
        yield Target(model, spec, tuple(o.name for o in meta.outputs), max_batch, names[0], names[1])
    finally:
        for n in names:
            try:
                await stub.SystemSharedMemoryUnregister(service_pb2.SystemSharedMemoryUnregisterRequest(name=n),
                                                        timeout=10)
            except grpc.aio.AioRpcError:
                pass
        for h in handles:
            shm.destroy_shared_memory_region(h)
