"""A worker of ``serve --workers N`` and its peers: what one worker is told must reach every worker, since a
client's next call may land on another (the kernel spreads connections over the workers, SO_REUSEPORT).

Each worker listens privately on 127.0.0.1:<its port> (its metrics port, scraped by the parent) with the peer
endpoints below. Client shared-memory registrations are copied to every worker (a worker that starts copies the
ones its live peers hold); updates of the trace and logging extensions reach every worker; reloads, readiness
and statistics span them. Peer calls change only the worker they reach (no further broadcast; the shared-memory
ones no pass-through forwarding either).
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import grpc
from aiohttp import web
from google.protobuf.message import Message
from tritonclient.grpc import service_pb2

from model_repository_gen.manifest import load_manifest
from poolpipe_common.errors import InputError
from scheduler.server.common.client_shm import ClientShmRegistry
from scheduler.server.common.errors import ServeError
from scheduler.server.control.reload import FLUSH_TIMEOUT_S, READY_TIMEOUT_S, ReloadError
from scheduler.server.front.router import Router
from scheduler.server.planned.manifest_shard import check_split as check_shares

log = logging.getLogger("poolpipe.sidecar.workers")
PEER_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class WorkerGroup:
    """This worker's index and every worker's private port (index -> port), from ``--worker-of``."""

    index: int
    ports: tuple[int, ...]

    def __post_init__(self) -> None:
        if not 0 <= self.index < len(self.ports) or len(set(self.ports)) != len(self.ports):
            raise ValueError(f"worker group: index {self.index} of ports {self.ports}")

    @property
    def peers(self) -> list[str]:
        return [f"http://127.0.0.1:{p}" for i, p in enumerate(self.ports) if i != self.index]


class Peers:
    """HTTP calls to the other workers; a peer that does not answer (restarting) is reported as None."""

    def __init__(self, group: WorkerGroup) -> None:
        self.group = group
        self._session: aiohttp.ClientSession | None = None

    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=PEER_TIMEOUT_S))
        return self._session

    async def call(self, url: str, path: str, body: dict | bytes | None = None, timeout_s: float = PEER_TIMEOUT_S
                   ) -> tuple[int, bytes] | None:
        """GET without a body, else POST it (a dict as JSON, bytes as they are)."""
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        try:
            if body is None:
                async with self.session().get(url + path, timeout=timeout) as r:
                    return r.status, await r.read()
            kw = {"data": body} if isinstance(body, bytes) else {"json": body}
            async with self.session().post(url + path, timeout=timeout, **kw) as r:
                return r.status, await r.read()
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
            return None

    async def all(self, path: str, body: dict | bytes | None = None, timeout_s: float = PEER_TIMEOUT_S
                  ) -> list[tuple[int, bytes] | None]:
        return list(await asyncio.gather(*(self.call(u, path, body, timeout_s) for u in self.group.peers)))

    async def close(self) -> None:
        """Close the connections (a later call opens new ones)."""
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()


def _repeated(f: Any) -> bool:
    flag = getattr(f, "is_repeated", None)  # protobuf >= 6 (label is deprecated there)
    return bool(flag) if flag is not None else f.label == f.LABEL_REPEATED


def add_statistics(total: Message, more: Message) -> None:
    """Sum ``more`` into ``total`` (Triton's ModelStatistics): counts and durations add up, ``last_inference``
    is the latest, batch statistics match by batch size, map entries by key."""
    for f, value in more.ListFields():
        if f.type == f.TYPE_MESSAGE and _repeated(f):
            mine = getattr(total, f.name)
            if f.message_type.GetOptions().map_entry:
                for key, item in value.items():
                    add_statistics(mine[key], item)
                continue
            by_size = {s.batch_size: s for s in mine} if f.name == "batch_stats" else {}
            for item in value:
                target = by_size.get(getattr(item, "batch_size", None))
                if target is None:
                    mine.add().CopyFrom(item)
                else:
                    add_statistics(target, item)
        elif f.type == f.TYPE_MESSAGE:
            add_statistics(getattr(total, f.name), value)
        elif f.name == "last_inference":
            total.last_inference = max(total.last_inference, value)
        elif f.name not in ("name", "version", "batch_size"):
            setattr(total, f.name, getattr(total, f.name) + value)


class WorkerRouter(Router):
    """The Router of one worker: shared-memory registrations go to every worker, readiness and planned models'
    statistics span them."""

    def __init__(self, *args: Any, peers: Peers, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.peers = peers

    async def local_ready(self, model: str = "") -> bool:
        if model:
            return (await super()._ModelReady(service_pb2.ModelReadyRequest(name=model), 2.0)).ready
        return await super().server_ready()

    async def _peers_ready(self, model: str = "") -> bool:
        answers = await self.peers.all("/peer/ready" + (f"?model={model}" if model else ""))
        return all(a is not None and a[0] == 200 for a in answers)

    async def server_ready(self) -> bool:
        return await self.local_ready() and await self._peers_ready()

    async def _ModelReady(self, request: Any, timeout_s: float | None) -> Any:
        ready = await self.local_ready(request.name)
        if ready and self.is_planned(request.name):
            ready = await self._peers_ready(request.name)
        return service_pb2.ModelReadyResponse(ready=ready)

    async def _ModelStatistics(self, request: Any, timeout_s: float | None) -> Any:
        resp = await super()._ModelStatistics(request, timeout_s)
        mine = {s.name: s for s in resp.model_stats if self.is_planned(s.name)}
        if not mine:
            return resp
        for answer in await self.peers.all("/peer/statistics", {"name": request.name}):
            if answer is None or answer[0] != 200:
                continue  # a worker restarting: its requests so far are not counted (docs/serving.md)
            for s in service_pb2.ModelStatisticsResponse.FromString(answer[1]).model_stats:
                if s.name in mine:
                    add_statistics(mine[s.name], s)
        return resp

    async def _SystemSharedMemoryRegister(self, request: Any, timeout_s: float | None) -> Any:
        resp = await super()._SystemSharedMemoryRegister(request, timeout_s)
        body = {"name": request.name, "key": request.key, "offset": request.offset, "byte_size": request.byte_size}
        answers = await self.peers.all("/peer/shm/register", body)
        failed = [a[1].decode(errors="replace") for a in answers if a is not None and a[0] != 200]
        if failed:  # undo everywhere: a region one worker cannot map would fail infers that land there
            await self._SystemSharedMemoryUnregister(service_pb2.SystemSharedMemoryUnregisterRequest(
                name=request.name), timeout_s)
            raise ServeError(grpc.StatusCode.INTERNAL, f"failed to register shared memory region "
                             f"'{request.name}' with every sidecar worker: {failed[0]}")
        return resp

    async def _SystemSharedMemoryUnregister(self, request: Any, timeout_s: float | None) -> Any:
        resp = await super()._SystemSharedMemoryUnregister(request, timeout_s)
        await self.peers.all("/peer/shm/unregister", {"name": request.name})
        return resp

    async def _TraceSetting(self, request: Any, timeout_s: float | None) -> Any:
        resp = await super()._TraceSetting(request, timeout_s)  # validated and applied here first
        await self.peers.all("/peer/settings/TraceSetting", request.SerializeToString())
        return resp

    async def _LogSettings(self, request: Any, timeout_s: float | None) -> Any:
        resp = await super()._LogSettings(request, timeout_s)
        await self.peers.all("/peer/settings/LogSettings", request.SerializeToString())
        return resp

    async def close(self) -> None:
        await super().close()
        await self.peers.close()


async def copy_registrations(peers: Peers, shm: ClientShmRegistry) -> int:
    """A starting worker takes the client shared-memory registrations the live peers hold; returns how many."""
    copied = 0
    for got in await peers.all("/peer/shm"):
        if got is None or got[0] != 200:
            continue
        for r in service_pb2.SystemSharedMemoryStatusResponse.FromString(got[1]).regions.values():
            if r.name in shm.regions:
                continue
            try:
                shm.register(r.name, r.key, r.offset, r.byte_size)
                copied += 1
            except ServeError as e:
                log.warning("event=shm_copy_failed region=%s reason=%s", r.name, e.message)
    return copied


def _error(e: ServeError) -> web.Response:
    return web.Response(status=e.http_status, text=e.message)


def peer_routes(app: web.Application, sidecar: Any) -> None:
    """The peer endpoints on a worker's private port; ``sidecar`` is the worker's Sidecar (its router is None
    until it has started, and then it reports not ready)."""
    async def ready(request: web.Request) -> web.Response:
        router = sidecar.router
        ok = router is not None and await router.local_ready(request.query.get("model", ""))
        return web.Response(status=200 if ok else 503)

    async def statistics(request: web.Request) -> web.Response:
        name = (await request.json()).get("name", "")
        router: Router | None = sidecar.router
        if router is None or router.planned is None:
            return web.Response(status=503)
        planned = router.planned
        names = [name] if name else planned.names()
        resp = service_pb2.ModelStatisticsResponse(
            model_stats=[planned.statistics(m) for m in names if planned.has(m)])
        return web.Response(body=resp.SerializeToString())

    async def shm_status(_request: web.Request) -> web.Response:
        resp = service_pb2.SystemSharedMemoryStatusResponse()
        for n, r in list(sidecar.client_shm.regions.items()):
            resp.regions[n].CopyFrom(service_pb2.SystemSharedMemoryStatusResponse.RegionStatus(
                name=r.name, key=r.key, offset=r.offset, byte_size=r.byte_size))
        return web.Response(body=resp.SerializeToString())

    async def shm_register(request: web.Request) -> web.Response:
        b = await request.json()
        have = sidecar.client_shm.regions.get(b["name"])
        if have is not None and (have.key, have.offset, have.byte_size) == (b["key"], b["offset"], b["byte_size"]):
            return web.Response()  # copied from a peer at start already
        try:
            sidecar.client_shm.register(str(b["name"]), str(b["key"]), int(b["offset"]), int(b["byte_size"]))
        except ServeError as e:
            return _error(e)
        return web.Response()

    async def shm_unregister(request: web.Request) -> web.Response:
        sidecar.client_shm.unregister(str((await request.json()).get("name", "")))
        return web.Response()

    async def reload(request: web.Request) -> web.Response:
        manifest = (await request.json()).get("manifest")
        try:
            report = await sidecar.plans.reload(Path(manifest) if manifest else None)
        except ReloadError as e:
            return web.json_response({"error": str(e)}, status=e.status)
        return web.json_response(report.to_dict())

    async def settings(request: web.Request) -> web.Response:
        """The trace or logging extension's update another worker received, applied here alone."""
        method, router = request.match_info["method"], sidecar.router
        if router is None:
            return web.Response(status=503)
        message = getattr(service_pb2, method + "Request").FromString(await request.read())
        try:
            await getattr(Router, "_" + method)(router, message, PEER_TIMEOUT_S)
        except ServeError as e:
            return _error(e)
        return web.Response()

    app.router.add_post(r"/peer/settings/{method:(TraceSetting|LogSettings)}", settings)
    app.router.add_get("/peer/ready", ready)
    app.router.add_post("/peer/statistics", statistics)
    app.router.add_get("/peer/shm", shm_status)
    app.router.add_post("/peer/shm/register", shm_register)
    app.router.add_post("/peer/shm/unregister", shm_unregister)
    app.router.add_post("/peer/reload", reload)


def check_split(manifest: Path, workers: int) -> None:
    """The manifest must split into ``workers`` shares with a complete pipeline each (ReloadError, 400, if not)."""
    try:
        check_shares(load_manifest(manifest), workers)
    except InputError as e:
        raise ReloadError(f"cannot reload onto {workers} sidecar workers: {e}", 400) from None


def _json_answer(answer: tuple[int, bytes] | None) -> tuple[int, dict]:
    if answer is None:
        return 503, {"error": "the worker did not answer"}
    try:
        return answer[0], json.loads(answer[1])
    except ValueError:
        return answer[0], {"error": answer[1].decode(errors="replace")}


def reload_everywhere(sidecar: Any, peers: Peers) -> Any:
    """``serve --workers``' reload: every worker reloads its share of the manifest at once; the answer is this
    worker's report with every worker's under ``workers`` (an error naming each worker that failed)."""
    async def own(path: Path | None) -> tuple[int, dict]:
        try:
            return 200, (await sidecar.plans.reload(path)).to_dict()
        except ReloadError as e:
            return e.status, {"error": str(e)}

    async def run(path: Path | None) -> dict:
        n = len(peers.group.ports)
        await asyncio.to_thread(check_split, path or sidecar.plans.manifest_path, n)
        mine, theirs = await asyncio.gather(own(path), peers.all(
            "/peer/reload", {"manifest": str(path) if path else ""}, READY_TIMEOUT_S + FLUSH_TIMEOUT_S + 10))
        answers = [_json_answer(a) for a in theirs]
        answers.insert(peers.group.index, mine)
        failed = [f"worker {i}: {body.get('error', status)}" for i, (status, body) in enumerate(answers)
                  if status != 200]
        if failed:
            worst = max(status for status, _ in answers if status != 200)
            raise ReloadError(f"reload failed on {len(failed)} of {n} sidecar workers ({'; '.join(failed)})",
                              worst if worst >= 400 else 503)
        return {**mine[1], "workers": [body for _, body in answers]}
    return run
