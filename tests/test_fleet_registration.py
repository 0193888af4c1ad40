"""The sidecar's fleet against real tritonservers, when a server comes back after being marked down: a region the
pool grows meanwhile is registered with it too (a stage call through it once found no such region), and the
regions it still holds are kept, not unregistered and registered again (a stage call in flight on a server a slow
health check had marked down found no such region: CI, test_overload_gets_explicit_shed_errors); and a server is
brought up only once the port its stage calls use takes connections (Triton opens HTTP after gRPC: a rejoined
server's calibration once found it refused, CI, test_killed_server_loses_no_request_and_rejoins)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tritonclient.grpc import service_pb2

from model_repository_gen.manifest import load_manifest
from poolpipe_common.net import free_ports
from runtime.launch import Deployment
from runtime.testbed import build_deployment
from scheduler.server.planned.fleet import Fleet, VGpuServer
from scheduler.server.planned.stage_client import HttpStage


async def _listed(srv: VGpuServer) -> set[str]:
    status = await srv.stub.SystemSharedMemoryStatus(service_pb2.SystemSharedMemoryStatusRequest(), timeout=5)
    return set(status.regions)


async def _unregister(srv: VGpuServer, names: set[str]) -> None:
    for name in names:
        await srv.stub.SystemSharedMemoryUnregister(service_pb2.SystemSharedMemoryUnregisterRequest(name=name),
                                                    timeout=5)


async def _grow_while_bringing_up(deploy: Path) -> tuple[set[str], set[str], set[str]]:
    """(the pool's regions, those the fleet counts as registered, those the server lists) of a server that lost
    its registrations (as a restarted Triton does), brought up while the pool grew under it."""
    fleet = Fleet(load_manifest(deploy), on_change=lambda *_: None)
    await fleet.connect()
    try:
        host, pool = next(iter(fleet.pools.items()))
        srv = next(s for s in fleet.servers.values() if s.host == host)
        fleet.set_up(srv, False, "test: server restarted")
        await _unregister(srv, await _listed(srv))
        while pool.take() is not None:  # every free region in use: the next take creates one
            pass

        async def grow() -> None:
            # the moment bring_up has registered its first region (and has others still to go), grow the pool
            while not 0 < len(srv.registered) < len(pool.regions):
                await asyncio.sleep(0)
            await fleet.take_region(host)

        grown = asyncio.ensure_future(grow())
        assert await fleet.bring_up(srv)
        await asyncio.wait_for(grown, timeout=30)
        return {r.name for r in pool.regions}, set(srv.registered), await _listed(srv)
    finally:
        await fleet.close()


async def _bring_back_after_a_slow_health_check(deploy: Path) -> tuple[set[str], set[str], list[str]]:
    """(the pool's regions, those the server lists, the names bring_up unregistered) of a server only marked down."""
    fleet = Fleet(load_manifest(deploy), on_change=lambda *_: None)
    await fleet.connect()
    try:
        host, pool = next(iter(fleet.pools.items()))
        srv = next(s for s in fleet.servers.values() if s.host == host)
        unregistered: list[str] = []
        call = srv.stub.SystemSharedMemoryUnregister

        def recorded(request, **kw):  # the real call, recorded
            unregistered.append(request.name)
            return call(request, **kw)

        srv.stub.SystemSharedMemoryUnregister = recorded
        try:
            fleet.set_up(srv, False, "test: health check timed out")
            assert await fleet.bring_up(srv)
        finally:
            srv.stub.SystemSharedMemoryUnregister = call
        return {r.name for r in pool.regions}, await _listed(srv), unregistered
    finally:
        await fleet.close()


async def _up_with_the_stage_port_closed(deploy: Path) -> tuple[bool, bool]:
    """(brought up, brought up once the port answers) of a server ready over gRPC whose stage port refuses."""
    fleet = Fleet(load_manifest(deploy), on_change=lambda *_: None)
    await fleet.connect()
    try:
        srv = next(iter(fleet.servers.values()))
        stage, srv.stage = srv.stage, HttpStage(f"127.0.0.1:{free_ports(1)[0]}")  # nothing listens there
        fleet.set_up(srv, False, "test: server restarted")
        closed = await fleet.bring_up(srv)
        srv.stage.close()
        srv.stage = stage
        return closed, await fleet.bring_up(srv)
    finally:
        await fleet.close()


def test_a_region_grown_during_bring_up_is_registered_with_that_server(tmp_path: Path) -> None:
    deploy, _, _ = build_deployment(tmp_path, slo_us=500_000.0)
    with Deployment(deploy, check_hardware=False, log_dir=tmp_path / "logs"):
        regions, counted, listed = asyncio.run(_grow_while_bringing_up(deploy))
        held, listed_again, unregistered = asyncio.run(_bring_back_after_a_slow_health_check(deploy))
        up_closed, up_open = asyncio.run(_up_with_the_stage_port_closed(deploy))
    assert (up_closed, up_open) == (False, True)
    assert len(regions) > 1
    assert regions <= counted, f"not registered: {sorted(regions - counted)}"
    assert regions <= listed, f"the server does not know: {sorted(regions - listed)}"
    assert not list(Path("/dev/shm").glob(f"{next(iter(regions)).rsplit('_', 1)[0]}_*"))  # close() removed them
    assert held and held <= listed_again, f"the server does not know: {sorted(held - listed_again)}"
    assert not set(unregistered) & held, f"unregistered while in use: {sorted(set(unregistered) & held)}"
