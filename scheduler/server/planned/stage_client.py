"""One vGPU's stage calls behind one protocol, whichever way they travel: Triton's HTTP endpoint on kept-open
connections (the default, stage_http.py) or gRPC (``serve --stage-protocol grpc``). The executor calls a
``StageClient`` and never asks which."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import grpc
from tritonclient.grpc import service_pb2_grpc

from model_repository_gen.manifest import StageInfo
from scheduler.server.planned.shm_pool import Region
from scheduler.server.planned.stage_http import HttpStageClient, StageCallError, encode_call
from scheduler.server.planned.stage_io import HopTensor, infer_request, raw_outputs
from scheduler.server.planned.stage_parameters import Value

# a stage call's outputs by name (shape, bytes: empty for an output written to shared memory), and each shared-memory
# output's offset in its region
StageAnswer = tuple[dict[str, tuple[list[int], bytes]], dict[str, int]]


class StageClient(Protocol):
    """Runs one stage's batch on one tritonserver; a StageCallError (in gRPC's status terms) when it fails.
    ``traceparent`` (a traced batch's W3C trace context) travels as the HTTP header or gRPC metadata of that name,
    where a tritonserver tracing in OpenTelemetry mode takes it as its spans' parent; ``parameters`` (the batch's
    request parameters, stage_parameters.py) as the call's request parameters."""

    async def call(self, stage: StageInfo, inputs: list[HopTensor], out_region: Region | None, batch: int,
                   request_id: str, timeout_s: float, traceparent: str | None = None,
                   parameters: Mapping[str, Value] | None = None) -> StageAnswer: ...

    async def reachable(self, timeout_s: float) -> bool:
        """Whether stage calls can reach the server now (the fleet asks before it brings a server up)."""
        ...

    def close(self) -> None: ...


class HttpStage:
    """Stage calls over the server's HTTP endpoint (KServe v2 with Triton's binary tensor extension)."""

    def __init__(self, address: str) -> None:
        self.client = HttpStageClient(address)

    async def call(self, stage: StageInfo, inputs: list[HopTensor], out_region: Region | None, batch: int,
                   request_id: str, timeout_s: float, traceparent: str | None = None,
                   parameters: Mapping[str, Value] | None = None) -> StageAnswer:
        head, binary, offsets = encode_call(stage, inputs, out_region, batch, request_id, parameters)
        return await self.client.infer(stage.triton_model, head, binary, timeout_s, traceparent), offsets

    async def reachable(self, timeout_s: float) -> bool:
        return await self.client.reachable(timeout_s)

    def close(self) -> None:
        self.client.close()


class GrpcStage:
    """Stage calls over the server's gRPC channel (the fleet's, which also carries health and shm calls)."""

    def __init__(self, stub: service_pb2_grpc.GRPCInferenceServiceStub) -> None:
        self.stub = stub

    async def call(self, stage: StageInfo, inputs: list[HopTensor], out_region: Region | None, batch: int,
                   request_id: str, timeout_s: float, traceparent: str | None = None,
                   parameters: Mapping[str, Value] | None = None) -> StageAnswer:
        req, offsets = infer_request(stage, inputs, out_region, batch, request_id, parameters)
        try:
            resp = await self.stub.ModelInfer(req, timeout=timeout_s, metadata=(
                (("traceparent", traceparent),) if traceparent is not None else None))
        except grpc.aio.AioRpcError as e:
            raise StageCallError(e.code(), e.details() or "") from None
        return raw_outputs(resp, set(offsets)), offsets

    async def reachable(self, timeout_s: float) -> bool:  # the channel the fleet's ready checks just answered on
        return True

    def close(self) -> None:  # the channel is the fleet's: it closes it
        pass


def stage_client(protocol: str, http_address: str, stub: service_pb2_grpc.GRPCInferenceServiceStub) -> StageClient:
    """The client for ``serve --stage-protocol`` (``http`` or ``grpc``)."""
    return HttpStage(http_address) if protocol == "http" else GrpcStage(stub)
