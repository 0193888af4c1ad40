"""``poolpipe serve --workers N``: one parent process and N sidecar workers, so that one command uses the cores a
host has while clients still see one Triton server.

Worker I runs ``serve --shard I/N`` on the same gRPC and HTTP ports as its siblings (SO_REUSEPORT: the kernel
spreads client connections over the workers) and its own loopback port for its metrics and the peer endpoints
(scheduler/server/peers.py). The parent serves ``--metrics-port`` with the workers' expositions summed
(common/metrics_merge.py), restarts a worker that dies (back-off, a limit, one log line each), forwards SIGHUP
to every worker and drains them all on SIGTERM/SIGINT. A worker's shared-memory regions carry its pid
(planned/shm_pool.py), so the worker that replaces a dead one removes what it left.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from aiohttp import web

from model_repository_gen.manifest import load_manifest
from poolpipe_common.errors import InputError
from poolpipe_common.net import free_ports
from runtime.supervise import RestartPolicy
from scheduler.server import serve_front_cli
from scheduler.server.app import SidecarConfig
from scheduler.server.common.child_processes import die_with_parent
from scheduler.server.common.metrics_merge import counter_samples, merge_expositions
from scheduler.server.common.tls import warn_plaintext
from scheduler.server.front.http_front import start_http
from scheduler.server.planned.manifest_shard import check_split
from scheduler.server.planned.shm_pool import remove_stale_regions

log = logging.getLogger("poolpipe.sidecar.workers")
POLL_S = 0.2
SCRAPE_EVERY_S = 5.0  # the parent keeps each worker's last counters, so a dead worker's count is not lost


def worker_command(args: argparse.Namespace, index: int, ports: tuple[int, ...]) -> list[str]:
    """``poolpipe serve`` for worker ``index``: the parent's flags, its share, its private port."""
    n = len(ports)
    cmd = [sys.executable, "-m", "poolpipe", *(["-v"] if getattr(args, "verbose", False) else []), "serve",
           "--manifest", str(args.manifest), "--grpc-port", str(args.grpc_port), "--http-port", str(args.http_port),
           "--metrics-port", str(ports[index]), "--bind", args.bind, "--policy", args.policy,
           "--drain-timeout", str(args.drain_timeout), "--shard", f"{index}/{n}",
           "--worker-of", f"{index}:{','.join(map(str, ports))}"]
    if args.passthrough:
        cmd += ["--passthrough", args.passthrough]
    if args.front_us is not None:  # else each worker keeps its plan's reserve, as serve does
        cmd += ["--front-us", repr(args.front_us)]
    cmd += ["--stage-protocol", args.stage_protocol]
    if args.native_grpc_port is not None:  # each worker's own front end, on the ports its siblings' share
        cmd += ["--native-grpc-port", str(args.native_grpc_port), "--native-http-port", str(args.native_http_port)]
    if args.passthrough_http:
        cmd += ["--passthrough-http", args.passthrough_http]
    if args.batch_log:
        cmd += ["--batch-log", str(args.batch_log)]  # one file: each line is one append
    if args.overheads_out:
        cmd += ["--overheads-out", str(worker_file(args.overheads_out, index))]
    for flag, values in (("--grpc-restricted-protocol", args.grpc_restricted_protocol),
                         ("--http-restricted-api", args.http_restricted_api), ("--trace-config", args.trace_config)):
        for v in values:
            cmd += [flag, v]
    return cmd + serve_front_cli.worker_args(args)


# serve's options worker_command passes on (or replaces), or that serve refuses with --workers; a new option must be
# added there and here (a test checks)
PASSED_ON = frozenset({"manifest", "passthrough", "grpc_port", "http_port", "metrics_port", "bind", "policy",
                       "drain_timeout", "overheads_out", "front_us", "stage_protocol", "batch_log", "shard", "workers",
                       "worker_of", "replan", "grpc_restricted_protocol", "http_restricted_api", "trace_config",
                       "native_grpc_port", "native_http_port", "passthrough_http"}) | serve_front_cli.DESTS


def worker_file(path: Path, index: int) -> Path:
    """``overheads.json`` -> ``overheads.worker0.json``: what each worker measured of its share."""
    return path.with_name(f"{path.stem}.worker{index}{path.suffix}")


def _sigterm_with_parent() -> None:
    """In the worker, before exec: SIGTERM (a clean drain) when the parent dies, so none is orphaned."""
    die_with_parent(signal.SIGTERM)


@dataclass
class Slot:
    """One worker's place: its process now, its restarts, its last counters."""

    index: int
    proc: subprocess.Popen | None = None
    restarts: int = 0
    due: float | None = None  # when its restart is due
    since: float = 0.0  # when it was last (re)started
    last: bytes = b""  # its last exposition
    ready: bool = False  # it reported ready once (a worker that dies before that on the first start fails serve)
    retired: list[bytes] = field(default_factory=list)  # the counters of its dead predecessors


class WorkerPool:
    """Starts, watches, restarts and stops the workers; serves the summed metrics."""

    def __init__(self, args: argparse.Namespace, config: SidecarConfig, policy: RestartPolicy | None = None) -> None:
        self.args, self.config = args, config
        self.policy = policy or RestartPolicy()
        self.ports = tuple(free_ports(args.workers, {config.grpc_port, config.http_port, config.metrics_port}))
        self.slots = [Slot(i) for i in range(args.workers)]
        self.stopping = False
        self._session: aiohttp.ClientSession | None = None

    def spawn(self, slot: Slot) -> None:
        slot.proc = subprocess.Popen(worker_command(self.args, slot.index, self.ports), preexec_fn=_sigterm_with_parent)
        slot.since = time.monotonic()

    async def metrics(self, _request: web.Request) -> web.Response:
        await self.scrape()
        texts = [s.last for s in self.slots if s.last] + [t for s in self.slots for t in s.retired]
        return web.Response(body=merge_expositions(texts), content_type="text/plain")

    async def scrape(self) -> None:
        async def one(slot: Slot) -> None:
            try:
                async with self._session.get(f"http://127.0.0.1:{self.ports[slot.index]}/metrics") as r:
                    if r.status == 200:
                        slot.last = await r.read()
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
                pass  # restarting: its last exposition stands until it answers again
        await asyncio.gather(*(one(s) for s in self.slots))

    async def check_started(self) -> None:
        """Until every worker reported ready once: ask the ones that have not (their peer endpoint)."""
        async def one(slot: Slot) -> None:
            try:
                async with self._session.get(f"http://127.0.0.1:{self.ports[slot.index]}/peer/ready") as r:
                    slot.ready = r.status == 200
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
                pass
        await asyncio.gather(*(one(s) for s in self.slots if not s.ready))

    def poll(self) -> str | None:
        """Schedule and run due restarts; returns an error when a worker died more often than allowed."""
        now = time.monotonic()
        for s in self.slots:
            if s.proc is not None and s.proc.poll() is not None and s.due is None:
                rc, pid = s.proc.returncode, s.proc.pid
                if not s.ready and not s.restarts:  # the first start failed: a setting, not bad luck
                    return (f"sidecar worker {s.index} exited with status {rc} before it was ready (its error is "
                            "logged above); every worker stopped")
                s.restarts = self.policy.counted(s.restarts, s.since, now)
                if s.restarts >= self.policy.max_restarts:
                    return (f"sidecar worker {s.index} (pid {pid}) exited with status {rc} after {s.restarts} "
                            "restarts; every worker stopped")
                if s.last:  # its counters so far stay in the sums (a restart must not make them drop)
                    s.retired.append(counter_samples(s.last))
                    s.last = b""
                delay = self.policy.delay_s(s.restarts)
                s.due = now + delay
                log.warning("event=worker_exited worker=%d pid=%d status=%s restart_in_s=%.1f restart=%d of=%d",
                            s.index, pid, rc, delay, s.restarts + 1, self.policy.max_restarts)
            elif s.due is not None and s.due <= now:
                s.restarts += 1
                s.due = None
                self.spawn(s)
                log.info("event=worker_restarted worker=%d pid=%d", s.index, s.proc.pid)
        return None

    def forward(self, sig: int) -> None:
        for s in self.slots:
            if s.proc is not None and s.proc.poll() is None:
                s.proc.send_signal(sig)

    async def reload(self) -> None:
        """SIGHUP: every worker reloads its share, once the manifest is known to split into them all."""
        try:
            manifest = await asyncio.to_thread(load_manifest, self.config.manifest)
            await asyncio.to_thread(check_split, manifest, len(self.slots))
        except InputError as e:
            log.warning("event=reload_failed reason=%s (no worker reloaded)", e)
            return
        self.forward(signal.SIGHUP)

    async def stop(self) -> None:
        """SIGTERM every worker (each drains its requests), SIGKILL what is left after the drain timeout; then
        remove the shared-memory regions of workers that died without releasing them."""
        self.stopping = True
        self.forward(signal.SIGTERM)
        deadline = time.monotonic() + self.config.drain_timeout_s + 10.0
        while any(s.proc is not None and s.proc.poll() is None for s in self.slots) and time.monotonic() < deadline:
            await asyncio.sleep(POLL_S)
        self.forward(signal.SIGKILL)
        for s in self.slots:
            if s.proc is not None:
                s.proc.wait()
        removed = remove_stale_regions()
        log.info("event=workers_stopped shm_regions_removed=%d", len(removed))

    async def run(self) -> int:
        """Until SIGTERM/SIGINT (0), or InputError when a worker fails its first start or dies too often."""
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        reloads: list[asyncio.Task] = []
        loop.add_signal_handler(signal.SIGHUP, lambda: reloads.append(asyncio.ensure_future(self.reload())))
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2.0))
        c = self.config
        runner = None
        error = None
        try:
            app = web.Application()
            app.router.add_get("/metrics", self.metrics)
            runner = await start_http(app, c.bind, c.metrics_port)
            for s in self.slots:
                self.spawn(s)
            log.info("event=workers_started workers=%d pids=%s grpc=%s:%d http=%s:%d metrics=%s:%d",
                     len(self.slots), ",".join(str(s.proc.pid) for s in self.slots), c.bind, c.grpc_port, c.bind,
                     c.http_port, c.bind, c.metrics_port)
            warn_plaintext(c.bind, c.tls)  # once for the workers' shared ports (they say nothing)
            next_scrape = time.monotonic() + SCRAPE_EVERY_S
            while not stop.is_set() and error is None:
                if not all(s.ready for s in self.slots):
                    await self.check_started()
                error = self.poll()
                if time.monotonic() >= next_scrape:
                    await self.scrape()
                    next_scrape = time.monotonic() + SCRAPE_EVERY_S
                try:
                    await asyncio.wait_for(stop.wait(), POLL_S)
                except asyncio.TimeoutError:
                    pass
        finally:
            await self.stop()
            if runner is not None:
                await runner.cleanup()
            await self._session.close()
        if error:
            log.error("event=workers_failed reason=%s", error)
            raise InputError(error)
        return 0


def run_workers(args: argparse.Namespace, config: SidecarConfig) -> int:
    """``serve --workers N`` (N > 1): until SIGTERM/SIGINT, or a worker that keeps dying."""
    try:
        return asyncio.run(WorkerPool(args, config).run())
    except OSError as e:
        raise InputError(f"cannot start the sidecar: {e}") from None
