"""The sidecar process: front ends (gRPC, HTTP), metrics endpoint, planned models, lifecycle and signals."""

from __future__ import annotations

import asyncio
import logging
import re
import signal
from collections.abc import Awaitable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import web

from scheduler.server.common import event_loop, latency_summary
from scheduler.server.common.client_shm import ClientShmRegistry
from scheduler.server.common.latency_summary import SummarySettings
from scheduler.server.common.metrics import SidecarMetrics
from scheduler.server.common.restricted import RestrictedApis
from scheduler.server.common.tls import TlsSettings, configure_stage_tls, tls_summary, warn_plaintext
from scheduler.server.common.trace_settings import TraceConfig
from scheduler.server.common.tracing import Tracer
from scheduler.server.front.grpc_front import start_grpc
from scheduler.server.front.health import ReadinessLog
from scheduler.server.front.http_front import HttpFront, start_http
from scheduler.server.front.http_passthrough import HttpPassthrough
from scheduler.server.front.router import Router

if TYPE_CHECKING:
    from scheduler.server.peers import WorkerGroup

log = logging.getLogger("poolpipe.sidecar")


@dataclass(frozen=True)
class SidecarConfig:
    manifest: Path | None = None
    passthrough: str | None = None
    grpc_port: int = 8001
    http_port: int = 8000
    metrics_port: int = 8002
    bind: str = "127.0.0.1"
    policy: str = "auto"
    drain_timeout_s: float = 30.0
    batch_log: Path | None = None
    overheads_out: Path | None = None
    # serve --front-us: deadlines come this much before the SLO (the way outside our clock); None: each plan's own
    front_us: float | None = None
    shard: tuple[int, int] = (0, 1)  # (I, N): serve shard I of N (scheduler/core/shards.py)
    replan: Path | None = None  # serve --replan FILE: automatic re-planning settings
    grpc_restricted: tuple[str, ...] = ()  # --grpc-restricted-protocol SPECs (scheduler/server/common/restricted.py)
    http_restricted: tuple[str, ...] = ()  # --http-restricted-api SPECs
    trace: TraceConfig | None = None  # serve --trace-config: traces of planned requests (None: off)
    group: WorkerGroup | None = None  # a worker of serve --workers N (scheduler/server/workers.py), else None
    native_grpc_port: int | None = None  # serve --native-grpc-port: Triton's front end for the planned models
    native_http_port: int = 0
    stage_protocol: str = "http"  # serve --stage-protocol: how stage calls reach the Triton servers
    passthrough_http: str | None = None  # serve --passthrough-http: the native front end forwards those models
    strict_readiness: bool = True  # serve --strict-readiness: Triton's meaning (false: ready while live)
    grpc_header_forward_pattern: str | None = None  # Triton's flags: matching headers become request parameters
    http_header_forward_pattern: str | None = None
    grpc_compression: int = 0  # serve --grpc-infer-response-compression-level: grpc core's level, 0 (none) to 3
    summaries: SummarySettings = SummarySettings()  # serve --metrics-config summary_latencies=true: Triton's summaries
    tls: TlsSettings = TlsSettings()  # serve --grpc-use-ssl, --http-use-ssl, --passthrough-use-ssl ...: off


def _pattern(regex: str | None) -> re.Pattern | None:
    return None if regex is None else re.compile(regex)


class Sidecar:
    """Start with ``await start()``, stop with ``await stop()`` (drains in-flight requests first)."""

    def __init__(self, config: SidecarConfig) -> None:
        self.config = config
        latency_summary.configure(config.summaries)  # the process's: the planned models' statistics observe them
        configure_stage_tls(config.tls.stage)  # the process's: the fleet's channels to the stage servers
        self.metrics = SidecarMetrics()
        self.client_shm = ClientShmRegistry()  # registered through the router, read and written by planned models
        self.tracer = Tracer(config.trace)
        self.plans = None  # which plan serves (control.reload.PlanSwitch; None without a manifest)
        self.router: Router | None = None
        self._grpc = None
        self._native = None
        self._runners: list[web.AppRunner] = []
        self.replanner = None
        self._readiness: ReadinessLog | None = None
        self._http_passthrough: HttpPassthrough | None = None

    async def start(self) -> None:
        c = self.config
        peers = await self._join_group() if c.group is not None else None
        if c.replan is not None:  # servers a dead re-planning sidecar started: stopped before we plan on them
            from runtime.supervise import reclaim_predecessors  # noqa: PLC0415
            gone = reclaim_predecessors("sidecar")
            if gone.launches:
                log.info("event=reclaimed_servers count=%d predecessors=%s", len(gone.servers),
                         ",".join(map(str, gone.launches)))
        if c.manifest is not None:
            from scheduler.server.control.reload import PlanSwitch  # noqa: PLC0415
            from scheduler.server.planned.service import PlannedService  # noqa: PLC0415

            def open_plan(path: Path, generation: int = 0) -> Awaitable[PlannedService]:
                return PlannedService.create(path, c.policy, self.metrics, self.client_shm, c.batch_log,
                                            c.overheads_out, c.shard, generation, self.tracer, c.front_us,
                                            c.stage_protocol)
            self.plans = PlanSwitch(await open_plan(c.manifest), c.manifest, open_plan)
            if c.replan is not None:
                from scheduler.server.control.replanner import AutoReplanner, load_settings  # noqa: PLC0415
                self.replanner = AutoReplanner(load_settings(c.replan), self.plans, self.metrics)
                self.replanner.start()
        router_args = (c.passthrough, self.plans, self.metrics, self.client_shm,
                       self.tracer if self.plans is not None else None)  # else trace settings pass through
        if peers is None:
            self.router = Router(*router_args, passthrough_tls=c.tls.passthrough)
        else:
            from scheduler.server.peers import WorkerRouter  # noqa: PLC0415
            self.router = WorkerRouter(*router_args, peers=peers, passthrough_tls=c.tls.passthrough)
        self.router.strict_readiness = c.strict_readiness
        await self.router.start()
        self._readiness = ReadinessLog(self.router)
        self._readiness.start()
        if c.native_grpc_port is not None:  # ready before our ports say ready
            from scheduler.server.front.native_front import NativeFront  # noqa: PLC0415
            self._native = NativeFront(self.router, c.bind, c.native_grpc_port, c.native_http_port,
                                       shared=c.group is not None, passthrough_http=c.passthrough_http,
                                       grpc_tls=c.tls.grpc,
                                       avoid=frozenset({c.grpc_port, c.http_port, c.metrics_port}))
            await self._native.start(self._planned_configs())
            if self.plans is not None:
                self.plans.after_reload.append(lambda: self._native.follow(self._planned_configs()))
        grpc_rules = RestrictedApis.parse(c.grpc_restricted, "--grpc-restricted-protocol", grpc_prefix=True)
        http_rules = RestrictedApis.parse(c.http_restricted, "--http-restricted-api", grpc_prefix=False)
        shared = peers is not None  # the workers of serve --workers listen on the same ports (SO_REUSEPORT)
        self._grpc = await start_grpc(self.router, c.bind, c.grpc_port, grpc_rules, reuse_port=shared,
                                      tls=c.tls.grpc, compression_level=c.grpc_compression,
                                      header_pattern=_pattern(c.grpc_header_forward_pattern))
        if c.passthrough_http and c.passthrough:  # the HTTP port forwards pass-through inference as HTTP
            self._http_passthrough = HttpPassthrough(c.passthrough_http, self.metrics)
            await self._http_passthrough.start()
        http_app = HttpFront(self.router, http_rules, _pattern(c.http_header_forward_pattern),
                             self._http_passthrough).app()
        if self.plans is not None:
            from scheduler.server.front.admin import plan_handler, reload_handler  # noqa: PLC0415
            run = None
            if peers is not None:
                from scheduler.server.peers import reload_everywhere  # noqa: PLC0415
                run = reload_everywhere(self, peers)
            http_app.router.add_post("/v2/poolpipe/reload", reload_handler(self.plans, c.bind, run))
            http_app.router.add_get("/v2/poolpipe/plan", plan_handler(self.plans))
        self._runners.append(await start_http(http_app, c.bind, c.http_port, c.drain_timeout_s, reuse_port=shared,
                                                 tls=c.tls.http, cancel_on_hangup=True))
        if peers is None:
            metrics_app = web.Application()
            metrics_app.router.add_get("/metrics", self._metrics)
            self._runners.append(await start_http(metrics_app, c.bind, c.metrics_port))
        log.info("event=listening grpc=%s:%d http=%s:%d metrics=%s:%d planned=%s passthrough=%s tls=%s "
                 "front_us=%g", c.bind, c.grpc_port, c.bind, c.http_port, c.bind, c.metrics_port,
                 ",".join(self.plans.current.names()) if self.plans else "-", c.passthrough or "-",
                 tls_summary(c.tls), self.plans.current.front_us if self.plans else c.front_us or 0.0)
        if c.group is None:  # a worker of serve --workers N says nothing: the parent says it once for all
            warn_plaintext(c.bind, c.tls)

    def _planned_configs(self) -> list:
        """The model configs of the plan being served (none without a manifest)."""
        if self.plans is None:
            return []
        plan = self.plans.current
        return [plan.config(m).config for m in plan.names()]

    async def _join_group(self):  # -> Peers
        """A worker of serve --workers: its private port (metrics for the parent, the peer endpoints) opens first,
        so that registrations other workers broadcast while it starts reach it; then it copies theirs."""
        from scheduler.server.peers import Peers, copy_registrations, peer_routes  # noqa: PLC0415

        group = self.config.group
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        peer_routes(app, self)
        self._runners.append(await start_http(app, "127.0.0.1", group.ports[group.index]))
        peers = Peers(group)
        copied = await copy_registrations(peers, self.client_shm)
        await peers.close()  # none left open if the start fails from here on (the router's calls open them again)
        log.info("event=worker_started worker=%d of=%d shm_registrations_copied=%d", group.index, len(group.ports),
                 copied)
        return peers

    async def _metrics(self, request: web.Request) -> web.Response:
        if self.plans is None:
            return web.Response(body=self.metrics.exposition(), content_type="text/plain")
        plan = self.plans.current
        plan.refresh_gauges()  # poolpipe's own families, then Triton's for the planned models
        body = self.metrics.exposition() + plan.triton_metrics()
        return web.Response(body=body, content_type="text/plain")

    async def stop(self) -> None:
        """Stop accepting, let in-flight requests finish (up to the drain timeout), release every shm region."""
        log.info("event=draining")
        if self._native is not None:  # its tritonserver drains the requests it holds, answered from here
            await self._native.close()
        stops = [r.cleanup() for r in self._runners]
        if self._grpc is not None:
            stops.append(self._grpc.stop(self.config.drain_timeout_s))
        await asyncio.gather(*stops, return_exceptions=True)  # both front ends drain at once
        if self.plans is not None:
            await self.plans.close()
        if self.replanner is not None:
            await self.replanner.close()
        if self._readiness is not None:
            await self._readiness.close()
        if self._http_passthrough is not None:
            await self._http_passthrough.close()
        if self.router is not None:
            await self.router.close()
        await asyncio.to_thread(self.tracer.shutdown)  # flush the batched spans
        log.info("event=stopped")

    async def run_until_signal(self) -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await self.start()
        event_loop.freeze_heap()
        reloads: list[asyncio.Task] = []
        if self.plans is not None:
            from scheduler.server.control.reload import reload_on_signal  # noqa: PLC0415
            loop.add_signal_handler(signal.SIGHUP, lambda: reloads.append(reload_on_signal(self.plans)))
        try:
            await stop.wait()
        finally:
            await self.stop()
