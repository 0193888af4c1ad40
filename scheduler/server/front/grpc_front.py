"""The gRPC front end: Triton's ``GRPCInferenceService`` (stubs from tritonclient.grpc) on grpc.aio."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from typing import Any, AsyncIterator, Callable

import grpc
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2, service_pb2_grpc

from scheduler.server.common.channels import SERVER_OPTIONS
from scheduler.server.common.errors import ServeError
from scheduler.server.common.forwarding import forwarded_metadata, set_incoming
from scheduler.server.common.restricted import GRPC_METHODS, RestrictedApis
from scheduler.server.common.tls import ServerTls
from scheduler.server.common.wire import InferRequest, serialize_response
from scheduler.server.front.health import add_health
from scheduler.server.front.router import Router

log = logging.getLogger("poolpipe.sidecar.grpc")

UNARY_METHODS = ("ServerLive", "ServerReady", "ServerMetadata", "ModelReady", "ModelMetadata", "ModelConfig",
                 "ModelStatistics", "RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload",
                 "SystemSharedMemoryStatus", "SystemSharedMemoryRegister", "SystemSharedMemoryUnregister",
                 "CudaSharedMemoryStatus", "CudaSharedMemoryRegister", "CudaSharedMemoryUnregister",
                 "TraceSetting", "LogSettings")


class Undecodable:
    """A request message that does not parse; the handler answers it with INVALID_ARGUMENT (grpc would answer
    UNKNOWN, as for an exception escaping the handler)."""

    def __init__(self, message: str) -> None:
        self.message = message


def _deserializer(cls: Any) -> Callable[[bytes], Any]:
    def parse(data: bytes) -> Any:
        try:
            return cls.FromString(data)
        except DecodeError as e:
            return Undecodable(f"the request is not a valid {cls.DESCRIPTOR.full_name} message: {e}")
    return parse


def service_handler(servicer: Any) -> grpc.GenericRpcHandler:
    """Triton's GRPCInferenceService, as ``add_GRPCInferenceServiceServicer_to_server`` builds it, but with
    deserializers that hand an undecodable message to the handler instead of failing inside grpc."""
    service = service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    handlers = {}
    for m in service.methods:
        make = grpc.stream_stream_rpc_method_handler if m.client_streaming else grpc.unary_unary_rpc_method_handler
        handlers[m.name] = make(getattr(servicer, m.name),
                                request_deserializer=_deserializer(getattr(service_pb2, m.input_type.name)),
                                response_serializer=getattr(service_pb2, m.output_type.name).SerializeToString)
    # ModelInfer takes the request as received: a pass-through one is forwarded without decoding its tensors
    handlers["ModelInfer"] = grpc.unary_unary_rpc_method_handler(servicer.ModelInfer,
                                                                 response_serializer=serialize_response)
    return grpc.method_handlers_generic_handler(service.full_name, handlers)


def _deadline(context: grpc.aio.ServicerContext) -> float | None:
    remaining = context.time_remaining()
    return None if remaining is None else time.monotonic() + remaining


class InferenceServicer(service_pb2_grpc.GRPCInferenceServiceServicer):
    """Every call goes to the Router; a ServeError becomes the gRPC status Triton would send."""

    def __init__(self, router: Router, restricted: RestrictedApis | None = None,
                 header_pattern: re.Pattern | None = None) -> None:
        self.router = router
        self.restricted = restricted or RestrictedApis()
        self.header_pattern = header_pattern  # --grpc-header-forward-pattern: metadata as request parameters
        for name in UNARY_METHODS:
            setattr(self, name, self._unary(name))

    def _check(self, method: str, context: grpc.aio.ServicerContext) -> None:
        """--grpc-restricted-protocol: refuse a restricted call without its header (a ServeError)."""
        if self.restricted.rules:
            metadata = dict(context.invocation_metadata() or ())
            self.restricted.check(GRPC_METHODS[method], metadata.get, grpc_call=True)

    def _unary(self, method: str) -> Any:
        async def handler(request: Any, context: grpc.aio.ServicerContext) -> Any:
            set_incoming(context.invocation_metadata, self.header_pattern)  # forwarded to the pass-through
            try:
                self._check(method, context)
            except ServeError as e:
                await context.abort(e.code, e.message)
            if isinstance(request, Undecodable):
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)
            try:
                return await self.router.call(method, request, context.time_remaining())
            except ServeError as e:
                await context.abort(e.code, e.message)
        return handler

    async def ModelInfer(self, request: bytes, context: grpc.aio.ServicerContext) -> Any:
        """The serialized request: the router decodes a planned model's, forwards another's as received."""
        set_incoming(context.invocation_metadata, self.header_pattern)
        try:
            self._check("ModelInfer", context)
            return await self.router.submit(InferRequest.from_wire(request, _deadline(context)))
        except ServeError as e:
            await context.abort(e.code, e.message)

    async def ModelStreamInfer(self, request_iterator: AsyncIterator[service_pb2.ModelInferRequest],
                               context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        """Planned models answer each request in turn; other models ride one stream to the pass-through Triton
        (so decoupled models keep their semantics)."""
        set_incoming(context.invocation_metadata, self.header_pattern)
        try:
            self._check("ModelStreamInfer", context)
        except ServeError as e:
            await context.abort(e.code, e.message)
        out: asyncio.Queue = asyncio.Queue()
        backend_call = None
        tasks: set[asyncio.Task] = set()

        async def planned_one(req: service_pb2.ModelInferRequest) -> None:
            try:
                out.put_nowait(service_pb2.ModelStreamInferResponse(infer_response=await self.router.submit(
                    InferRequest.from_message(req, None))))
            except ServeError as e:
                out.put_nowait(service_pb2.ModelStreamInferResponse(error_message=e.message))

        async def pump_backend(call: Any) -> None:
            try:
                async for resp in call:
                    out.put_nowait(resp)
            except grpc.aio.AioRpcError as e:
                out.put_nowait(service_pb2.ModelStreamInferResponse(error_message=e.details() or str(e.code())))

        async def read_client() -> None:
            nonlocal backend_call
            async for req in request_iterator:
                if isinstance(req, Undecodable):
                    out.put_nowait(service_pb2.ModelStreamInferResponse(error_message=req.message))
                    continue
                if self.router.is_planned(req.model_name) or self.router.stub is None:
                    t = asyncio.ensure_future(planned_one(req))
                    tasks.add(t)
                    t.add_done_callback(tasks.discard)
                    continue
                if backend_call is None:
                    backend_call = self.router.stub.ModelStreamInfer(metadata=forwarded_metadata())
                    t = asyncio.ensure_future(pump_backend(backend_call))
                    tasks.add(t)
                    t.add_done_callback(tasks.discard)
                await backend_call.write(req)
            if backend_call is not None:
                await backend_call.done_writing()
            while tasks:
                await asyncio.gather(*list(tasks), return_exceptions=True)
            out.put_nowait(None)

        reader = asyncio.ensure_future(read_client())
        try:
            while True:
                item = await out.get()
                if item is None:
                    break
                yield item
        finally:
            reader.cancel()
            for t in list(tasks):
                t.cancel()
            if backend_call is not None:
                backend_call.cancel()


async def start_grpc(router: Router, bind: str, port: int, restricted: RestrictedApis | None = None,
                     reuse_port: bool = False, tls: ServerTls | None = None, compression_level: int = 0,
                     header_pattern: re.Pattern | None = None) -> grpc.aio.Server:
    """``reuse_port``: several processes listen on the port (serve --workers), the kernel spreads connections;
    ``tls``: serve it over TLS (serve --grpc-use-ssl), else in plaintext; ``compression_level``: grpc core's
    response compression level (0 none .. 3 high, serve --grpc-infer-response-compression-level)."""
    options = SERVER_OPTIONS + ([("grpc.so_reuseport", 1)] if reuse_port else [])
    if compression_level:
        options = [*options, ("grpc.default_compression_level", compression_level)]
    server = grpc.aio.server(options=options)
    server.add_generic_rpc_handlers((service_handler(InferenceServicer(router, restricted, header_pattern)),))
    add_health(server, router)  # grpc.health.v1 (Kubernetes' gRPC probes, grpc_health_probe)
    address = f"{bind}:{port}"
    bound = server.add_secure_port(address, tls.grpc_credentials()) if tls else server.add_insecure_port(address)
    if bound == 0:
        raise OSError(f"cannot listen for gRPC on {bind}:{port}")
    await server.start()
    return server
