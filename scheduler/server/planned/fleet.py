"""The fleet of Triton servers behind the sidecar: one gRPC connection per vGPU (health, shared memory), a
StageClient for its stage calls, and the shared-memory pools (one per machine) registered with every server of
that machine."""

from __future__ import annotations

import asyncio
import logging
import math
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

from model_repository_gen.manifest import Manifest, PipelineInfo
from scheduler.server.common.channels import GRPC_OPTIONS
from scheduler.server.common.tls import stage_channel
from scheduler.server.planned.shm_pool import HostPool, Region, align, stale
from scheduler.server.planned.stage_client import StageClient, stage_client

log = logging.getLogger("poolpipe.sidecar.fleet")

HEALTH_PERIOD_S = 0.5  # liveness of the servers in service
PROBE_PERIOD_S = 0.15  # readiness of the servers out of service (not started yet, restarting)
# A server that is not up yet (serve started before launch) or restarting must be noticed within a second of its
# readiness, not after gRPC's default reconnect back-off (up to two minutes): the channel retries every 150-250 ms.
CHANNEL_OPTIONS = [*GRPC_OPTIONS, ("grpc.initial_reconnect_backoff_ms", 150), ("grpc.min_reconnect_backoff_ms", 150),
                   ("grpc.max_reconnect_backoff_ms", 250)]


def live_slice(servers: list, turn: int) -> tuple[int, list]:
    """The next turn and the servers whose liveness is checked at this tick: round-robin over the PROBE_PERIOD_S
    ticks, enough per tick that each of ``servers`` is checked at least every HEALTH_PERIOD_S."""
    n = len(servers)
    if not n:
        return 0, []
    per_tick = math.ceil(n / max(1, int(HEALTH_PERIOD_S / PROBE_PERIOD_S)))
    return (turn + per_tick) % n, [servers[(turn + i) % n] for i in range(min(per_tick, n))]


def is_local_address(address: str) -> bool:
    """True when a server at ``address`` runs on this machine (and so shares /dev/shm with the sidecar)."""
    try:
        with socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET) as s:
            s.bind((address, 0))
        return True
    except OSError:
        return False


def kept_registrations(ours: set[str], mine: Mapping[str, Region], listed: Mapping) -> set[str]:
    """Regions this fleet registered that the server still lists as they are: kept through a bring-up, since a
    server marked down by a slow health check may still be serving stage calls that name them."""
    return {name for name in ours
            if name in mine and name in listed
            and listed[name].key == mine[name].key and listed[name].byte_size == mine[name].byte_size}


def machines(manifest: Manifest) -> dict[str, str]:
    """Host name -> the first host name with the same address: hosts listed separately in the cluster file
    (e.g. one per GPU type) but on one machine share /dev/shm, so hops between them use shared memory."""
    first: dict[str, str] = {}
    return {h.name: first.setdefault(h.address, h.name) for h in manifest.hosts}


@dataclass
class VGpuServer:
    id: str
    host: str  # the machine (see machines()): the key of its shared-memory pool
    grpc_url: str
    models: tuple[str, ...]
    channel: grpc.aio.Channel
    stub: service_pb2_grpc.GRPCInferenceServiceStub
    stage: StageClient  # its stage calls (serve --stage-protocol: HTTP or gRPC)
    up: bool = True
    registered: set[str] = field(default_factory=set)


class Fleet:
    """Connections, health and shm pools; tells ``on_change(vgpu, up, why)`` when a server leaves or rejoins."""

    def __init__(self, manifest: Manifest, on_change: Callable[[VGpuServer, bool, str], None],
                 generation: int = 0, stage_protocol: str = "http") -> None:
        self.manifest = manifest
        self.stage_protocol = stage_protocol  # how stage calls travel: "http" or "grpc" (health, shm: gRPC)
        self.generation = generation  # > 0: loaded by a reload (its shm regions are named apart)
        self.machine = machines(manifest)
        self.on_change = on_change
        self.servers: dict[str, VGpuServer] = {}
        self.pools: dict[str, HostPool] = {}
        self.reclaimed: list[str] = []  # registrations of dead sidecars' regions removed from the servers
        self._health: asyncio.Task | None = None

    async def connect(self) -> None:
        """Open every channel, build the pools, and bring up the servers that are ready now."""
        models_on: dict[str, set[str]] = {}
        for m in self.manifest.models:
            for p in m.pipelines:
                for s in p.stages:
                    for v in s.vgpus:
                        models_on.setdefault(v, set()).add(s.triton_model)
        for g in self.manifest.vgpus:
            ch = stage_channel(g.grpc_url, CHANNEL_OPTIONS)  # TLS with serve --stage-use-ssl
            stub = service_pb2_grpc.GRPCInferenceServiceStub(ch)
            self.servers[g.id] = VGpuServer(g.id, self.machine[g.host], g.grpc_url,
                                            tuple(sorted(models_on.get(g.id, ()))), ch, stub,
                                            stage_client(self.stage_protocol, g.http_url, stub))
        self._build_pools()
        ups = await asyncio.gather(*[self.bring_up(srv) for srv in self.servers.values()])
        for srv, ok in zip(self.servers.values(), ups):
            if not ok:
                self.set_up(srv, False, "not ready at start")

    def start_health(self) -> None:
        self._health = asyncio.ensure_future(self._health_loop())

    def _build_pools(self) -> None:
        """One pool per local machine that has consecutive stages on it; slots fit the largest boundary batch."""
        host_of = {vid: srv.host for vid, srv in self.servers.items()}
        local = {self.machine[h.name] for h in self.manifest.hosts if is_local_address(h.address)}
        pipelines: list[PipelineInfo] = [p for m in self.manifest.models for p in m.pipelines]
        need: dict[str, int] = {}
        for p in pipelines:
            for prev, cur in zip(p.stages, p.stages[1:]):
                hosts = {host_of[v] for v in prev.vgpus} & {host_of[v] for v in cur.vgpus} & local
                size = sum(align(t.bytes_per_request() * p.batch) for t in cur.inputs)
                for h in hosts:
                    need[h] = max(need.get(h, 0), size)
        for h, size in need.items():
            pool = HostPool(h, size, self.generation)
            for _ in range(2 * sum(1 for srv in self.servers.values() if srv.host == h)):
                pool.give(pool.create())
            self.pools[h] = pool
            log.info("event=shm_pool host=%s regions=%d slot_bytes=%d", h, len(pool.regions), size)

    def shares_pool(self, a: str, b: str) -> bool:
        """Whether a hop from vGPU ``a`` to vGPU ``b`` can go through shared memory."""
        host = self.servers[a].host
        return self.servers[b].host == host and host in self.pools

    async def take_region(self, host: str) -> Region:
        pool = self.pools[host]
        region = pool.take()
        if region is not None:
            return region
        region = pool.create()
        for srv in self.servers.values():
            if srv.host == host and srv.up:
                try:
                    await self._register(srv, region)
                except grpc.aio.AioRpcError as e:
                    self.set_up(srv, False, f"shm registration: {e.code().name}")
        log.info("event=shm_pool_grow host=%s regions=%d", host, len(pool.regions))
        return region

    def give_region(self, region: Region) -> None:
        self.pools[region.host].give(region)

    async def _register(self, srv: VGpuServer, region: Region) -> None:
        await srv.stub.SystemSharedMemoryRegister(service_pb2.SystemSharedMemoryRegisterRequest(
            name=region.name, key=region.key, offset=0, byte_size=region.byte_size), timeout=5)
        srv.registered.add(region.name)

    async def _unregister_all(self, srv: VGpuServer) -> None:
        for name in list(srv.registered):
            try:
                await srv.stub.SystemSharedMemoryUnregister(
                    service_pb2.SystemSharedMemoryUnregisterRequest(name=name), timeout=2)
            except grpc.aio.AioRpcError:
                pass
            srv.registered.discard(name)

    async def bring_up(self, srv: VGpuServer) -> bool:
        """Ready check; then drop stale registrations (ours from earlier lives, or a dead sidecar's), keep those
        this fleet made that the server still holds, and register the rest of this machine's pool."""
        try:
            ready = await srv.stub.ServerReady(service_pb2.ServerReadyRequest(), timeout=1)
            if not ready.ready:
                return False
            for m in srv.models:
                r = await srv.stub.ModelReady(service_pb2.ModelReadyRequest(name=m), timeout=1)
                if not r.ready:
                    return False
            if not await srv.stage.reachable(1.0):  # Triton's HTTP port opens after its gRPC port
                return False
            status = await srv.stub.SystemSharedMemoryStatus(service_pb2.SystemSharedMemoryStatusRequest(), timeout=2)
            pool = self.pools.get(srv.host)
            mine = {r.name: r for r in pool.regions} if pool else {}
            kept = kept_registrations(srv.registered, mine, status.regions)
            for name in status.regions:
                if name not in kept and (stale(name) or name in mine):
                    await srv.stub.SystemSharedMemoryUnregister(
                        service_pb2.SystemSharedMemoryUnregisterRequest(name=name), timeout=2)
                    if name not in mine:
                        self.reclaimed.append(f"{srv.id}:{name}")
            srv.registered = kept
            # take_region registers a region it creates with the servers up only: one created while this server
            # was being brought up must be registered here, or its stage calls would find no such region.
            while pool and (missing := [r for r in pool.regions if r.name not in srv.registered]):
                for r in missing:
                    await self._register(srv, r)
            return True
        except grpc.aio.AioRpcError:
            return False

    def set_up(self, srv: VGpuServer, up: bool, why: str) -> None:
        if srv.up == up:
            return
        srv.up = up
        log.warning("event=vgpu_%s vgpu=%s url=%s reason=%s", "up" if up else "down", srv.id, srv.grpc_url, why)
        self.on_change(srv, up, why)

    async def _health_loop(self) -> None:
        """Probe the servers out of service every PROBE_PERIOD_S, all at once (one slow server does not delay
        noticing the others), and those in service every HEALTH_PERIOD_S, a slice per tick: sixteen liveness calls
        at once held the event loop 3-6 ms every 0.6 s, which requests near their deadline felt."""
        turn = 0
        while True:
            await asyncio.sleep(PROBE_PERIOD_S)
            servers = list(self.servers.values())
            down = [srv for srv in servers if not srv.up]
            turn, live = live_slice(servers, turn)
            await asyncio.gather(*[self._check(srv) for srv in down + [s for s in live if s.up]])

    async def _check(self, srv: VGpuServer) -> None:
        if not srv.up:
            before = len(self.reclaimed)
            if await self.bring_up(srv):
                self.set_up(srv, True, "healthy again")
            if len(self.reclaimed) > before:
                log.info("event=reclaimed vgpu=%s registrations=%d", srv.id, len(self.reclaimed) - before)
            return
        try:
            r = await srv.stub.ServerLive(service_pb2.ServerLiveRequest(), timeout=1)
            if not r.live:
                self.set_up(srv, False, "not live")
        except grpc.aio.AioRpcError as e:
            self.set_up(srv, False, f"health check: {e.code().name}")

    async def close(self) -> int:
        """Stop the health checks, unregister and remove every region, close the channels; returns regions removed."""
        if self._health is not None:
            self._health.cancel()
            await asyncio.gather(self._health, return_exceptions=True)
        await asyncio.gather(*[self._unregister_all(srv) for srv in self.servers.values()], return_exceptions=True)
        removed = sum(len(p.regions) for p in self.pools.values())
        for pool in self.pools.values():
            pool.destroy()
        for srv in self.servers.values():
            await srv.channel.close()
            srv.stage.close()
        return removed
