"""Protocol-neutral request handling: every KServe v2 call, as protobuf, goes to a planned model or to the
pass-through Triton. Both front ends (gRPC, HTTP) translate to these calls and back."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

from poolpipe_common import poolpipe_version
from poolpipe_common.errors import InputError
from scheduler.server.common.channels import GRPC_OPTIONS
from scheduler.server.common.client_shm import ClientShmRegistry
from scheduler.server.common.errors import ServeError, from_rpc_error, invalid
from scheduler.server.common.forwarding import forwarded_metadata, header_parameters
from scheduler.server.common.log_settings import LogSettings
from scheduler.server.common.metrics import SidecarMetrics
from scheduler.server.common.tls import ClientTls
from scheduler.server.common.trace_settings import settings_from_request
from scheduler.server.common.tracing import Tracer
from scheduler.server.common.wire import INFER_METHOD, InferRequest
from scheduler.server.front.health import unready_reason
from scheduler.server.front.reserved import add_parameters, refuse_sequences

if TYPE_CHECKING:  # the planned service is imported where a manifest is served (scheduler/server/app.py)
    from scheduler.server.control.reload import PlanSwitch
    from scheduler.server.planned.service import PlannedService

log = logging.getLogger("poolpipe.sidecar")

SERVER_NAME = "poolpipe-sidecar"
# What the sidecar serves itself (without --passthrough, its server metadata lists exactly these; with one, the
# pass-through Triton's list, since every other call is forwarded there). Not served alone: classification and
# sequence (planned models have neither), model repository changes, CUDA shared memory (its calls answer as a
# Triton without that extension: status empty, unregister a no-op, register UNIMPLEMENTED). schedule_policy: the
# priority and timeout request parameters (planned models' batcher controls); trace: only with planned models (the
# sidecar traces those; alone, with none, it has nothing to trace).
EXTENSIONS = ["schedule_policy", "model_configuration", "system_shared_memory", "binary_tensor_data", "parameters",
              "statistics", "trace", "logging"]


def _left_s(deadline_s: float | None) -> float | None:
    """Seconds left until the client's deadline (on time.monotonic()), the timeout of a forwarded call."""
    return None if deadline_s is None else max(deadline_s - time.monotonic(), 0.0)


class Router:
    """Routes calls by model name; shared-memory registrations are kept locally and mirrored to the pass-through."""

    def __init__(self, passthrough: str | None, plans: PlanSwitch | None, metrics: SidecarMetrics,
                 shm: ClientShmRegistry, tracer: Tracer | None = None, passthrough_tls: ClientTls | None = None
                 ) -> None:
        self.passthrough_url = passthrough
        self.passthrough_tls = passthrough_tls  # serve --passthrough-use-ssl: the channel there is TLS
        self.strict_readiness = True  # serve --strict-readiness false: the server is ready while it is live
        self.tracer = tracer  # the sidecar's trace settings (planned models); None: trace calls go to the pass-through
        self.plans = plans  # which plan serves the planned models (None: no manifest, everything passes through)
        self.metrics = metrics
        self.shm = shm  # shared with the planned service, which reads inputs from and writes outputs to it
        self.log_settings = LogSettings()  # the logging extension, for the sidecar's own log
        self._channel: grpc.aio.Channel | None = None
        self.stub: service_pb2_grpc.GRPCInferenceServiceStub | None = None
        self._infer_raw: grpc.aio.UnaryUnaryMultiCallable | None = None  # ModelInfer, bytes in and out

    async def start(self) -> None:
        if self.passthrough_url:
            tls = self.passthrough_tls
            self._channel = grpc.aio.insecure_channel(self.passthrough_url, options=GRPC_OPTIONS) if tls is None \
                else grpc.aio.secure_channel(self.passthrough_url, tls.grpc_credentials(), options=GRPC_OPTIONS)
            self.stub = service_pb2_grpc.GRPCInferenceServiceStub(self._channel)
            self._infer_raw = self._channel.unary_unary(INFER_METHOD)

    async def close(self) -> None:
        if self.stub is not None and self.shm.regions:
            for name in list(self.shm.regions):
                try:
                    await self.stub.SystemSharedMemoryUnregister(
                        service_pb2.SystemSharedMemoryUnregisterRequest(name=name), timeout=2)
                except grpc.aio.AioRpcError:
                    pass
        self.shm.close()
        if self._channel is not None:
            await self._channel.close()

    # --- helpers -------------------------------------------------------------------------------------------
    @property
    def planned(self) -> PlannedService | None:
        """The plan serving now (a reload swaps it between two calls, never during one)."""
        return self.plans.current if self.plans is not None else None


    def is_planned(self, model: str) -> bool:
        return self.planned is not None and self.planned.has(model)

    async def forward(self, method: str, request: Any, timeout_s: float | None = None) -> Any:
        if self.stub is None:
            raise ServeError(grpc.StatusCode.UNIMPLEMENTED if method.startswith(("Repository", "Cuda", "Trace"))
                             else grpc.StatusCode.NOT_FOUND, self._no_passthrough(method, request))
        try:
            return await getattr(self.stub, method)(request, timeout=timeout_s, metadata=forwarded_metadata())
        except grpc.aio.AioRpcError as e:
            raise from_rpc_error(e) from None

    @staticmethod
    def _no_passthrough(method: str, request: Any) -> str:
        name = getattr(request, "name", "") or getattr(request, "model_name", "")
        if name and method.startswith(("Model",)):
            return f"Request for unknown model: '{name}' is not found"
        return (f"{method} is not supported by the sidecar alone: it needs a Triton server behind it (start it with "
                "--passthrough HOST:PORT)")

    # --- health and metadata ---------------------------------------------------------------------------------

    async def server_ready(self) -> bool:
        """Triton's --strict-readiness: every planned model and the pass-through Triton ready (strict, the
        default), else ready while live."""
        if not self.strict_readiness:
            return True
        if self.planned is not None and not all(self.planned.ready(m) for m in self.planned.names()):
            return False
        if self.stub is not None:
            try:
                r = await self.stub.ServerReady(service_pb2.ServerReadyRequest(), timeout=2)
                return bool(r.ready)
            except grpc.aio.AioRpcError:
                return False
        return True

    async def call(self, method: str, request: Any, timeout_s: float | None = None) -> Any:
        """Answer one unary KServe v2 call (everything but inference)."""
        handler = getattr(self, "_" + method, None)
        if handler is not None:
            return await handler(request, timeout_s)
        return await self.forward(method, request, timeout_s)

    async def _ServerLive(self, request: Any, timeout_s: float | None) -> Any:
        return service_pb2.ServerLiveResponse(live=True)

    async def _ServerReady(self, request: Any, timeout_s: float | None) -> Any:
        return service_pb2.ServerReadyResponse(ready=await self.server_ready())

    async def _ServerMetadata(self, request: Any, timeout_s: float | None) -> Any:
        if self.stub is not None:
            return await self.forward("ServerMetadata", request, timeout_s)
        served = [e for e in EXTENSIONS if e != "trace" or self.tracer is not None]
        return service_pb2.ServerMetadataResponse(name=SERVER_NAME, version=poolpipe_version(), extensions=served)

    async def _ModelReady(self, request: Any, timeout_s: float | None) -> Any:
        if self.is_planned(request.name):
            return service_pb2.ModelReadyResponse(ready=self.planned.ready(request.name))
        if self.stub is None:
            return service_pb2.ModelReadyResponse(ready=False)
        return await self.forward("ModelReady", request, timeout_s)

    async def _ModelMetadata(self, request: Any, timeout_s: float | None) -> Any:
        if self.is_planned(request.name):
            return self.planned.metadata(request.name)
        return await self.forward("ModelMetadata", request, timeout_s)

    async def _ModelConfig(self, request: Any, timeout_s: float | None) -> Any:
        if self.is_planned(request.name):
            return self.planned.config(request.name)
        return await self.forward("ModelConfig", request, timeout_s)

    async def _ModelStatistics(self, request: Any, timeout_s: float | None) -> Any:
        if self.is_planned(request.name):
            return service_pb2.ModelStatisticsResponse(model_stats=[self.planned.statistics(request.name)])
        resp = service_pb2.ModelStatisticsResponse()
        if self.stub is not None:
            resp = await self.forward("ModelStatistics", request, timeout_s)
        if not request.name and self.planned is not None:
            resp.model_stats.extend(self.planned.statistics(m) for m in self.planned.names())
        return resp

    async def _RepositoryIndex(self, request: Any, timeout_s: float | None) -> Any:
        resp = service_pb2.RepositoryIndexResponse()
        if self.stub is not None:
            resp = await self.forward("RepositoryIndex", request, timeout_s)
        if self.planned is not None:
            for m in self.planned.names():
                why = unready_reason(self.planned, m)  # what is missing, as Triton says why a model is unavailable
                resp.models.add(name=m, version="1", state="UNAVAILABLE" if why else "READY", reason=why)
        return resp

    async def _RepositoryModelLoad(self, request: Any, timeout_s: float | None) -> Any:
        return await self._repository_change("RepositoryModelLoad", request, timeout_s)

    async def _RepositoryModelUnload(self, request: Any, timeout_s: float | None) -> Any:
        return await self._repository_change("RepositoryModelUnload", request, timeout_s)

    async def _repository_change(self, method: str, request: Any, timeout_s: float | None) -> Any:
        if self.is_planned(request.model_name):
            raise ServeError(grpc.StatusCode.FAILED_PRECONDITION,
                             f"model '{request.model_name}' is a planned model served by poolpipe; "
                             "re-run 'poolpipe generate' and restart the sidecar to change it")
        return await self.forward(method, request, timeout_s)

    async def _TraceSetting(self, request: Any, timeout_s: float | None) -> Any:
        """The trace extension: the sidecar's settings (global, or a planned model's); another model's go to the
        pass-through Triton, and so does a global change (its models follow the global settings too)."""
        if self.tracer is None or (request.model_name and not self.is_planned(request.model_name)):
            return await self.forward("TraceSetting", request, timeout_s)
        try:
            settings = self.tracer.settings.update(request.model_name, settings_from_request(request.settings))
        except InputError as e:
            raise ServeError(grpc.StatusCode.INVALID_ARGUMENT, str(e)) from None
        if not request.model_name and request.settings and self.stub is not None:
            try:
                await self.forward("TraceSetting", request, timeout_s)
            except ServeError as e:  # the sidecar's own settings changed: say what the pass-through refused
                log.warning("event=trace_settings_not_forwarded passthrough=%s error=%r", self.passthrough_url,
                            e.message)
        resp = service_pb2.TraceSettingResponse()
        for k, v in settings.items():
            resp.settings[k].value.extend(v)
        return resp

    # --- client system shared memory ---------------------------------------------------------------------

    async def _SystemSharedMemoryRegister(self, request: Any, timeout_s: float | None) -> Any:
        self.shm.register(request.name, request.key, request.offset, request.byte_size)
        if self.stub is not None:
            try:
                await self.forward("SystemSharedMemoryRegister", request, timeout_s)
            except ServeError:
                self.shm.unregister(request.name)
                raise
        return service_pb2.SystemSharedMemoryRegisterResponse()

    async def _SystemSharedMemoryUnregister(self, request: Any, timeout_s: float | None) -> Any:
        self.shm.unregister(request.name)
        if self.stub is not None:
            await self.forward("SystemSharedMemoryUnregister", request, timeout_s)
        return service_pb2.SystemSharedMemoryUnregisterResponse()

    async def _SystemSharedMemoryStatus(self, request: Any, timeout_s: float | None) -> Any:
        resp = service_pb2.SystemSharedMemoryStatusResponse()
        names = [request.name] if request.name else list(self.shm.regions)
        for n in names:
            r = self.shm.get(n)
            resp.regions[n].CopyFrom(service_pb2.SystemSharedMemoryStatusResponse.RegionStatus(
                name=r.name, key=r.key, offset=r.offset, byte_size=r.byte_size))
        return resp

    # --- CUDA shared memory and logging without a pass-through Triton ---------------------------------------

    async def _CudaSharedMemoryStatus(self, request: Any, timeout_s: float | None) -> Any:
        if self.stub is not None:
            return await self.forward("CudaSharedMemoryStatus", request, timeout_s)
        if request.name:
            raise invalid(f"Unable to find cuda shared memory region: '{request.name}'")
        return service_pb2.CudaSharedMemoryStatusResponse()

    async def _CudaSharedMemoryUnregister(self, request: Any, timeout_s: float | None) -> Any:
        if self.stub is not None:
            return await self.forward("CudaSharedMemoryUnregister", request, timeout_s)
        return service_pb2.CudaSharedMemoryUnregisterResponse()  # none can be registered: nothing to remove

    async def _LogSettings(self, request: Any, timeout_s: float | None) -> Any:
        if self.stub is not None:
            return await self.forward("LogSettings", request, timeout_s)
        return self.log_settings.call(request)

    # --- inference -----------------------------------------------------------------------------------------

    def submit(self, request: InferRequest) -> asyncio.Future:
        """The one way in for an inference, whichever front end decoded it: a planned model's request is checked
        and queued now (its answer, or a ServeError, comes in the future; cancelling the future withdraws it); any
        other goes to the pass-through Triton, as received when it came as bytes. Raises ServeError for a planned
        request refused at once."""
        model = request.model_name
        if not self.is_planned(model):
            return asyncio.ensure_future(self._measured(model, "passthrough", self._forward(request)))
        series = self.metrics.series(model, "planned")
        series.requests.inc()
        t0 = time.monotonic()
        if self.plans.on_arrival is not None:  # type: ignore[union-attr]
            self.plans.on_arrival(model)  # type: ignore[union-attr]
        try:
            if request.decoded is None:  # the native front end's requests carry no sequence (its backend refuses)
                refuse_sequences(model, request.message().parameters)
                add_parameters(request.message(), header_parameters())
            future = self.plans.current.submit(request)  # type: ignore[union-attr]
        except ServeError as e:
            self._count(model, series, t0, e)
            raise

        def done(f: asyncio.Future) -> None:
            if not f.cancelled():  # withdrawn by its front end or client: counted neither way
                self._count(model, series, t0, f.exception())
        future.add_done_callback(done)
        return future

    async def _forward(self, request: InferRequest) -> service_pb2.ModelInferResponse | bytes:
        """A pass-through model's inference: its bytes as received (Triton's answer comes back as bytes), else the
        message."""
        left = _left_s(request.deadline_s)
        params = header_parameters()  # --grpc/http-header-forward-pattern: then the message, with them, goes
        if request.wire is not None and self._infer_raw is not None and not params:
            try:
                return await self._infer_raw(request.wire, timeout=left, metadata=forwarded_metadata())
            except grpc.aio.AioRpcError as e:
                raise from_rpc_error(e) from None
        message = request.message()
        add_parameters(message, params)
        return await self.forward("ModelInfer", message, left)

    def _count(self, model: str, series: Any, t0: float, error: BaseException | None) -> None:
        """Count one answered request (``error`` None) or one failed with a ServeError (other errors are not)."""
        if error is None:
            series.successes.inc()
            series.latency.observe(time.monotonic() - t0)
        elif isinstance(error, ServeError):
            self.metrics.child(self.metrics.failures, model, error.code.name).inc()

    async def _measured(self, model: str, route: str, answer: Awaitable[Any]) -> Any:
        """Await ``answer`` and count it in the request metrics of (model, route)."""
        series = self.metrics.series(model, route)
        series.requests.inc()
        t0 = time.monotonic()
        try:
            resp = await answer
        except ServeError as e:
            self._count(model, series, t0, e)
            raise
        self._count(model, series, t0, None)
        return resp
