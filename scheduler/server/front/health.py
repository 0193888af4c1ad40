"""Health beyond KServe v2's live/ready: ``grpc.health.v1`` on the gRPC port (the service "" is the server's
readiness, a model's name its readiness), why a planned model or the pass-through Triton is not ready (the model's
``reason`` in the repository index, and one log line each time a readiness changes)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Protocol

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.grpc import service_pb2

from scheduler.server.common.errors import ServeError

if TYPE_CHECKING:
    from scheduler.server.planned.service import PlannedService

log = logging.getLogger("poolpipe.sidecar.health")
Status = health_pb2.HealthCheckResponse
WATCH_S = 1.0  # how often Watch and the readiness log look again


class Router(Protocol):
    """What health asks of scheduler.server.front.router.Router (which imports this module)."""

    passthrough_url: str | None
    stub: Any

    @property
    def planned(self) -> PlannedService | None: ...
    def is_planned(self, model: str) -> bool: ...
    async def server_ready(self) -> bool: ...
    async def call(self, method: str, request: Any, timeout_s: float | None = None) -> Any: ...


def unready_reason(planned: PlannedService, model: str) -> str:
    """Why ``model`` is not ready ("" when it is): an application's first unready module, else each pipeline's
    missing part (not calibrated yet, or a stage whose every vGPU is down)."""
    if planned.apps.has(model):
        for m in planned.apps.models_of(model):
            why = unready_reason(planned, m)
            if why:
                return f"module {m}: {why}"
        return ""
    if planned.ready(model):
        return ""
    servers, missing = planned.fleet.servers, []
    for p in planned.models[model].pipelines:
        down = [(i, s) for i, s in enumerate(p.stages) if not any(servers[v].up for v in s.vgpus)]
        if down:
            i, s = down[0]
            where = ",".join(f"{v}@{servers[v].grpc_url}" for v in s.vgpus)
            missing.append(f"pipeline {p.id} stage {i}: no vGPU up ({where})")
        elif p.id not in planned.overheads:
            missing.append(f"pipeline {p.id}: not calibrated yet")
    return "; ".join(missing) or "no pipeline in service"


async def passthrough_reason(router: Router) -> str:
    """Why the pass-through Triton is not ready ("" when it is, or when there is none)."""
    if router.stub is None:
        return ""
    try:
        ready = (await router.stub.ServerReady(service_pb2.ServerReadyRequest(), timeout=2)).ready
    except grpc.aio.AioRpcError as e:
        return f"{router.passthrough_url} unreachable: {e.code().name} {e.details() or ''}".strip()
    return "" if ready else f"{router.passthrough_url} answers not ready"


class HealthServicer(health_pb2_grpc.HealthServicer):
    """``grpc.health.v1.Health``: each Check asks the router now (no status kept apart from what KServe's ready
    calls answer); Watch looks again every WATCH_S and sends each change."""

    def __init__(self, router: Router) -> None:
        self.router = router

    async def status(self, service: str) -> int | None:
        """SERVING or NOT_SERVING, None for a name no model has."""
        if not service:
            return Status.SERVING if await self.router.server_ready() else Status.NOT_SERVING
        try:
            ready = (await self.router.call("ModelReady", service_pb2.ModelReadyRequest(name=service), 2.0)).ready
        except ServeError:
            ready = False
        if ready:
            return Status.SERVING
        return Status.NOT_SERVING if await self._known(service) else None

    async def _known(self, model: str) -> bool:
        if self.router.is_planned(model):
            return True
        try:
            index = await self.router.call("RepositoryIndex", service_pb2.RepositoryIndexRequest(), 2.0)
        except ServeError:
            return False
        return any(m.name == model for m in index.models)

    async def Check(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        status = await self.status(request.service)
        if status is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service (no model named '{request.service}')")
        return Status(status=status)

    async def Watch(self, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        last = None
        while True:
            status = await self.status(request.service)
            status = Status.SERVICE_UNKNOWN if status is None else status
            if status != last:
                yield Status(status=status)
                last = status
            await asyncio.sleep(WATCH_S)


def add_health(server: grpc.aio.Server, router: Router) -> None:
    health_pb2_grpc.add_HealthServicer_to_server(HealthServicer(router), server)


class ReadinessLog:
    """One log line each time a planned model or the pass-through Triton turns ready or not, saying what is
    missing; runs from ``start()`` until ``close()``."""

    def __init__(self, router: Router) -> None:
        self.router = router
        self.reasons: dict[str, str] = {}  # "model=<name>" or "passthrough=<address>" -> its reason ("": ready)
        self._task: asyncio.Task | None = None

    async def look(self) -> None:
        planned = self.router.planned
        now = {f"model={m}": unready_reason(planned, m) for m in planned.names()} if planned is not None else {}
        if self.router.stub is not None:
            now[f"passthrough={self.router.passthrough_url}"] = await passthrough_reason(self.router)
        for what, why in now.items():
            if self.reasons.get(what, "") != why:
                if why:
                    log.warning("event=not_ready %s reason=%r", what, why)
                elif what in self.reasons:
                    log.info("event=ready %s", what)
            self.reasons[what] = why

    def start(self) -> None:
        async def run() -> None:
            while True:
                try:
                    await self.look()
                except Exception:  # noqa: BLE001 - a log line must never stop serving
                    log.exception("event=readiness_log_error")
                await asyncio.sleep(WATCH_S)
        self._task = asyncio.ensure_future(run())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
