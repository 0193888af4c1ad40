"""``serve --native-grpc-port``: the planned models' inference through Triton's own front end.

A tritonserver whose models are the planned ones, served by the poolpipe_front backend (backends/native_front/),
listens on the port; it receives, decodes and answers KServe v2 gRPC and HTTP requests natively and hands each one
to this process over a Unix socket. Here each becomes a ModelInferRequest for the router, as from the gRPC front
end, without grpc.aio's cost per call. With ``serve --passthrough-http`` the port also serves the pass-through
Triton's models (those ready at start, but stateful and decoupled ones): the backend forwards each request there over
KServe v2 HTTP itself, so no Python is on their path. Client shared memory registered on that port is Triton's own;
the sidecar's statistics, metrics, repository, traces and management calls stay on its own ports.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import shutil
import tempfile
from pathlib import Path

import grpc
import tritonclient.http.aio as httpaio

from backends import native_front
from model_repository_gen.front_models import (
    front_config,
    passthrough_front_config,
    passthrough_unsupported,
    write_front_repository,
)
from model_repository_gen.triton_config import config_text
from poolpipe_common.errors import InputError
from runtime.tritonserver import TritonProcess, pid_alive
from scheduler.server.common.errors import ServeError
from scheduler.server.common.tls import ServerTls
from scheduler.server.common.wire import InferRequest
from scheduler.server.front.native_frames import (
    FrameError,
    decode_cancel,
    decode_hello,
    decode_request,
    encode_answer,
    encode_error,
    split_frames,
)
from scheduler.server.front.router import Router

log = logging.getLogger("poolpipe.sidecar.native")
DIR_PREFIX = "poolpipe-front-"  # + the sidecar's PID + "-": its socket, repository and tritonserver log


def reclaim_dirs(root: Path | None = None) -> list[Path]:
    """Remove the work directories of sidecars that died without removing theirs (their tritonservers stopped
    themselves when the socket closed); returns them."""
    gone = []
    for d in Path(root or tempfile.gettempdir()).glob(DIR_PREFIX + "*"):
        pid = d.name[len(DIR_PREFIX):].split("-")[0]
        if pid.isdigit() and not pid_alive(int(pid)):  # as shm_pool.stale judges a region's owner
            shutil.rmtree(d, ignore_errors=True)
            gone.append(d)
    return gone


def passthrough_configs(address: str, planned: set[str]) -> list:
    """The front configs of the models ready on the pass-through Triton at ``address`` (its HTTP HOST:PORT) that
    the front end can forward (a log line names those it cannot); planned names are the sidecar's."""
    import tritonclient.http as httpclient  # noqa: PLC0415
    from google.protobuf import json_format  # noqa: PLC0415
    from tritonclient.grpc import model_config_pb2 as mc  # noqa: PLC0415
    from tritonclient.utils import InferenceServerException  # noqa: PLC0415

    client = httpclient.InferenceServerClient(address)
    try:
        index = client.get_model_repository_index()
        names = sorted({m["name"] for m in index if m.get("state") == "READY"} - planned)
        upstream = [json_format.ParseDict(client.get_model_config(n), mc.ModelConfig(), ignore_unknown_fields=True)
                    for n in names]
    except (InferenceServerException, OSError) as e:
        raise InputError(f"--passthrough-http {address}: cannot list the pass-through Triton's models over HTTP "
                         f"({e}); give its HTTP HOST:PORT (tritonserver --http-port)") from None
    finally:
        client.close()
    configs = []
    for cfg in upstream:
        why = passthrough_unsupported(cfg)
        if why:
            log.info("event=native_front_not_forwarded model=%s reason=%r", cfg.name, why)
        else:
            configs.append(passthrough_front_config(cfg, address))
    return configs


def priority_lost(planned_configs: list) -> list[str]:
    """The planned models with priority levels: Triton's backend API gives the front's backend no request priority
    (only the timeout), so their requests on the native port are scheduled at the default priority level."""
    return [c.name for c in planned_configs if c.dynamic_batching.priority_levels > 0]


class _Connection(asyncio.Protocol):
    """One front model instance's socket: requests in, each submitted at once and answered from its future's
    callback (no task per request); the answers of one loop iteration leave in one write. A cancel frame withdraws
    a request the front answered CANCELLED (its client gave up): it is dropped, and that frame answered, unless its
    answer had left already; so each id gets exactly one answer frame, and the front reuses it only after that."""

    def __init__(self, router: Router) -> None:
        self.router = router
        self.model: str | None = None
        self.buf = bytearray()
        self.out: list[bytes] = []
        self.pending: dict[int, asyncio.Future] = {}  # by frame id, until answered
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        frames, used = split_frames(self.buf)
        del self.buf[:used]
        try:
            for frame in frames:
                if self.model is None:
                    self.model = decode_hello(frame)
                    log.info("event=native_front_connected model=%s", self.model)
                    continue
                withdrawn = decode_cancel(frame)
                if withdrawn is None:
                    self._submit(*decode_request(self.model, frame))
                else:
                    self._withdraw(withdrawn)
        except FrameError as e:  # the backend answers what was pending with UNAVAILABLE
            log.error("event=native_front_bad_frame model=%s error=%s", self.model, e)
            self.transport.close()

    def _submit(self, ident: int, request) -> None:
        try:
            future = self.router.submit(InferRequest.from_decoded(request, None))
        except ServeError as e:
            self._send(encode_error(ident, e.code, e.message))
            return
        except Exception as e:  # noqa: BLE001 - every request gets an answer, and the socket stays open
            log.exception("event=native_front_error model=%s", self.model)
            self._send(encode_error(ident, None, f"poolpipe sidecar: internal error: {e}"))
            return
        self.pending[ident] = future
        future.add_done_callback(functools.partial(self._answered, ident))

    def _withdraw(self, ident: int) -> None:
        future = self.pending.pop(ident, None)
        if future is None:  # answered already: that answer frees the id at the front
            return
        future.cancel()  # a queued request takes no place in a batch (one in flight finishes, unanswered)
        self._send(encode_error(ident, grpc.StatusCode.CANCELLED, "the request was cancelled"))

    def _answered(self, ident: int, future: asyncio.Future) -> None:
        if self.pending.get(ident) is not future:  # withdrawn: its cancel frame was answered instead
            return
        del self.pending[ident]
        if future.cancelled():
            self._send(encode_error(ident, grpc.StatusCode.CANCELLED, "the request was cancelled"))
            return
        error = future.exception()
        if error is None:
            self._send(encode_answer(ident, future.result()))
        elif isinstance(error, ServeError):
            self._send(encode_error(ident, error.code, error.message))
        else:  # every request gets an answer
            log.error("event=native_front_error model=%s error=%r", self.model, error)
            self._send(encode_error(ident, None, f"poolpipe sidecar: internal error: {error}"))

    def _send(self, data: bytes) -> None:
        if not self.out:
            asyncio.get_running_loop().call_soon(self._flush)
        self.out.append(data)

    def _flush(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(b"".join(self.out))
        self.out.clear()

    def connection_lost(self, exc: Exception | None) -> None:
        for future in list(self.pending.values()):  # withdrawn: their samples are skipped when dispatched
            future.cancel()
        self.pending.clear()


class NativeFront:
    """Start with ``await start()``, stop with ``await close()`` (the tritonserver by PID, then the socket and the
    work directory). A tritonserver that exits meanwhile is started again on the same ports (WATCH_S, doubling
    back-off up to MAX_BACKOFF_S), one log line each."""

    WATCH_S = 0.5
    MAX_BACKOFF_S = 30.0

    def __init__(self, router: Router, bind: str, grpc_port: int, http_port: int = 0, shared: bool = False,
                 passthrough_http: str | None = None, grpc_tls: ServerTls | None = None,
                 avoid: frozenset[int] = frozenset()) -> None:
        self.router, self.bind, self.grpc_port, self.http_port = router, bind, grpc_port, http_port
        self.avoid = avoid  # the sidecar's own ports: it binds them after the front starts, so none may be picked
        self.grpc_tls = grpc_tls  # serve --grpc-use-ssl: the front's tritonserver takes the same flags itself
        self.passthrough_http = passthrough_http  # serve --passthrough-http: its models are forwarded from C
        self.shared = shared  # a worker of serve --workers: its siblings' front ends listen on the same ports
        self.triton: TritonProcess | None = None
        self.restarts = 0
        self._server: asyncio.AbstractServer | None = None
        self._dir: Path | None = None
        self._planned: dict[str, str] = {}  # each planned model's front config, as written (follow() compares)
        self._watcher: asyncio.Task | None = None
        self._closing = asyncio.Event()

    async def start(self, planned_configs: list) -> None:
        library = native_front.library()
        if library is None:
            raise InputError("--native-grpc-port: the native front end could not be built here (the log line above "
                             "says why: no C compiler, or a build error); serve without the flag")
        reclaim_dirs()
        self._dir = Path(tempfile.mkdtemp(prefix=f"{DIR_PREFIX}{os.getpid()}-"))
        sock = self._dir / "front.sock"
        try:
            self._server = await asyncio.get_running_loop().create_unix_server(lambda: _Connection(self.router),
                                                                               path=str(sock))
            forwarded = []
            if self.passthrough_http:
                forwarded = await asyncio.to_thread(passthrough_configs, self.passthrough_http,
                                                    {c.name for c in planned_configs})
            repo = write_front_repository(self._dir / "repository", planned_configs, library, forwarded)
            self._planned = {c.name: config_text(front_config(c)) for c in planned_configs}
            self.triton = TritonProcess(repo, grpc_port=self.grpc_port, http_port=self.http_port, host=self.bind,
                                        env={native_front.SOCKET_ENV: str(sock)},
                                        log_path=self._dir / "tritonserver.log", name="native front end",
                                        shared_ports=self.shared, avoid=self.avoid,
                                        extra_args=self.grpc_tls.triton_args() if self.grpc_tls else ())
            await asyncio.to_thread(self.triton.start)
        except BaseException:
            await self.close()
            raise
        lost = priority_lost(planned_configs)
        if lost:
            log.warning("event=native_front_priority_ignored models=%s reason=Triton's backend API gives the front "
                        "no request priority, so requests on the native port run at the default priority level; "
                        "send prioritised requests to --grpc-port or --http-port", ",".join(lost))
        log.info("event=native_front_listening grpc=%s http=%s models=%d forwarded=%s", self.triton.grpc_url,
                 self.triton.http_url, len(planned_configs), ",".join(c.name for c in forwarded) or "-")
        self._watcher = asyncio.ensure_future(self._watch())

    async def follow(self, planned_configs: list) -> None:
        """After a reload, serve what the new plan serves: its new models loaded, those whose config changed (a
        new max batch size) loaded again, those it dropped unloaded, through the front's repository API."""
        want = {c.name: config_text(front_config(c)) for c in planned_configs}
        changed = [c for c in planned_configs if self._planned.get(c.name) != want[c.name]]
        gone = [name for name in self._planned if name not in want]
        if not changed and not gone:
            return
        repo = self._dir / "repository"
        write_front_repository(repo, changed, native_front.library())
        client = httpaio.InferenceServerClient(self.triton.http_url)  # HTTP: the gRPC port may ask for TLS
        try:
            for c in changed:
                await client.load_model(c.name)
                self._planned[c.name] = want[c.name]
            for name in gone:
                await client.unload_model(name)
                shutil.rmtree(repo / name, ignore_errors=True)
                del self._planned[name]
        finally:
            await client.close()
        log.info("event=native_front_followed_reload loaded=%s unloaded=%s", ",".join(c.name for c in changed) or "-",
                 ",".join(gone) or "-")

    async def _watch(self) -> None:
        """Start the tritonserver again when it exits (a crash, a kill): the native port is back within seconds.
        Runs until close() sets ``_closing``; a restart under way finishes first, so none outlives close()."""
        backoff = self.WATCH_S
        while not await self._closing_within(self.WATCH_S):
            if self.triton.proc is not None and self.triton.exited() is None:
                backoff = self.WATCH_S
                continue
            log.error("event=native_front_exited status=%s restart_in_s=%.1f log=%s", self.triton.exited(), backoff,
                      self.triton.log_path)
            if await self._closing_within(backoff):
                return
            try:
                await asyncio.to_thread(self.triton.stop)  # reaps it and removes what it left
                await asyncio.to_thread(self.triton.start)
            except (OSError, RuntimeError, TimeoutError, InputError) as e:
                log.error("event=native_front_restart_failed error=%s", e)
                backoff = min(2 * backoff, self.MAX_BACKOFF_S)
                continue
            self.restarts += 1
            log.info("event=native_front_restarted grpc=%s restarts=%d", self.triton.grpc_url, self.restarts)

    async def _closing_within(self, seconds: float) -> bool:
        try:
            await asyncio.wait_for(self._closing.wait(), seconds)
        except asyncio.TimeoutError:
            return False
        return True

    async def close(self) -> None:
        self._closing.set()
        if self._watcher is not None:
            await asyncio.gather(self._watcher, return_exceptions=True)
            self._watcher = None
        if self.triton is not None:
            await asyncio.to_thread(self.triton.stop)
            self.triton = None
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
