"""Run ``poolpipe serve`` as a child process on free loopback ports (tests, benchmarks, demo)."""

from __future__ import annotations

import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from model_repository_gen.manifest import load_manifest
from poolpipe_common.errors import InputError
from poolpipe_common.net import fill_free_ports
from runtime.tritonserver import exit_on_sigterm

ROOT = Path(__file__).resolve().parents[1]  # the repository root (runtime/..)

PORTS = ("grpc_port", "http_port", "metrics_port")
PORT_ATTEMPTS = 3
METRICS_PREFIX = "poolpipe_sidecar_"  # every metric the sidecar exports (scheduler's metrics._P)


@dataclass
class SidecarProcess:
    manifest: Path | None = None
    passthrough: str | None = None
    policy: str = "auto"
    log_path: Path | None = None
    extra_args: tuple[str, ...] = ()
    verbose: bool = False
    grpc_port: int = 0  # 0: a free loopback port, picked again if another process takes it before the sidecar
    http_port: int = 0
    metrics_port: int = 0
    proc: subprocess.Popen | None = None
    # the client side of serve --http-use-ssl (its roots, and a client certificate under mutual TLS): health over
    # HTTPS; None: plaintext HTTP
    http_ssl: ssl.SSLContext | None = None
    # serve --native-grpc-port: clients reach the planned models through Triton's own gRPC front end (infer_url),
    # which takes about a third off the sidecar's CPU per request (docs/serving.md, "The native front end")
    native_front: bool = False
    native_grpc_port: int = 0
    picked: tuple[str, ...] = field(default=(), init=False)

    def __post_init__(self) -> None:
        self.picked = tuple(k for k in self._port_fields() if not getattr(self, k))
        self._pick_ports()

    def _port_fields(self) -> tuple[str, ...]:
        return (*PORTS, "native_grpc_port") if self.native_front else PORTS

    def _pick_ports(self) -> None:
        """Free ports for the ones not given, distinct from each other and from the given ones (two random picks
        of a free port can be the same port, since neither is bound yet), and from the ports the manifest gave its
        servers: those may not be bound yet either (a test that names the sidecar to ``launch`` before it starts
        the servers), and a sidecar picked onto one would have to move where ``launch`` does not look for it."""
        ports = {k: 0 if k in self.picked else getattr(self, k) for k in self._port_fields()}
        for k, port in fill_free_ports(ports, self._server_ports() | self._flag_ports()).items():
            setattr(self, k, port)

    def _flag_ports(self) -> set[int]:
        """The ports ``extra_args`` name (``--native-grpc-port 23456``): chosen by the caller, not bound yet."""
        args = self.extra_args
        return {int(v) for k, v in zip(args, args[1:]) if k.startswith("--") and k.endswith("-port") and v.isdigit()}

    def _server_ports(self) -> set[int]:
        if self.manifest is None:
            return set()
        try:
            return {port for g in load_manifest(self.manifest).vgpus for port in g.ports}
        except (OSError, ValueError, InputError):  # no manifest yet, or one serve will refuse with its own error
            return set()

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def infer_url(self) -> str:
        """Where clients send inference: the native front end's gRPC port when there is one, else the sidecar's."""
        return f"127.0.0.1:{self.native_grpc_port}" if self.native_front else self.grpc_url

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "poolpipe", *(["-v"] if self.verbose else []), "serve",
               "--grpc-port", str(self.grpc_port), "--http-port", str(self.http_port),
               "--metrics-port", str(self.metrics_port), "--policy", self.policy]
        if self.manifest:
            cmd += ["--manifest", str(self.manifest)]
        if self.passthrough:
            cmd += ["--passthrough", self.passthrough]
        if self.native_front:
            cmd += ["--native-grpc-port", str(self.native_grpc_port)]
        return cmd + list(self.extra_args)

    def start(self, timeout_s: float = 60.0) -> "SidecarProcess":
        """Start it and wait until it is live; a port picked for it that another process bound in between (the
        pick and the bind race) is picked again, up to PORT_ATTEMPTS times."""
        for attempt in range(PORT_ATTEMPTS):
            try:
                return self._start_once(timeout_s)
            except RuntimeError as e:
                if "already in use" not in str(e) or not self.picked or attempt == PORT_ATTEMPTS - 1:
                    raise
                self._pick_ports()
        raise AssertionError("unreachable")

    def _start_once(self, timeout_s: float) -> "SidecarProcess":
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        exit_on_sigterm()
        self.proc = subprocess.Popen(self.command(), env=env, stdout=log, stderr=subprocess.STDOUT)
        if self._health_ok("live", timeout_s, 1.0):
            return self
        self.stop()
        raise TimeoutError(f"sidecar not live after {timeout_s:.0f} s")

    def wait_ready(self, timeout_s: float = 120.0) -> "SidecarProcess":
        """Until the sidecar reports ready (its plan calibrated), after :meth:`start` found it live."""
        if self._health_ok("ready", timeout_s, 2.0):
            return self
        raise TimeoutError(f"sidecar not ready after {timeout_s:.0f} s")

    def _health_ok(self, what: str, timeout_s: float, call_timeout_s: float) -> bool:
        """Poll ``/v2/health/<what>`` until it answers 200 (True) or ``timeout_s`` passes (False); a sidecar that
        exits meanwhile is an error with its log's tail."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                tail = Path(self.log_path).read_text()[-2000:] if self.log_path else ""
                raise RuntimeError(f"sidecar exited with status {self.proc.returncode}: {tail}")
            try:
                scheme = "https" if self.http_ssl is not None else "http"
                with urllib.request.urlopen(f"{scheme}://{self.http_url}/v2/health/{what}", timeout=call_timeout_s,
                                            context=self.http_ssl) as r:
                    if r.status == 200 and self._own_metrics(call_timeout_s):
                        return True
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.1)
        return False

    def _own_metrics(self, timeout_s: float) -> bool:
        """Whether the metrics port serves this sidecar's metrics: it binds that port after its gRPC and HTTP
        ports, so the health answer came from it, not from another server that holds its HTTP port (that sidecar
        exits, "already in use", and :meth:`start` picks again)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=timeout_s) as r:
            return r.status == 200 and METRICS_PREFIX in r.read().decode(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 40.0) -> int | None:
        if self.proc is None:
            return None
        p, self.proc = self.proc, None
        if p.poll() is None:
            p.send_signal(sig)
            try:
                p.wait(timeout_s)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        return p.returncode

    def __enter__(self) -> "SidecarProcess":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
