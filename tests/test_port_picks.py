"""Ports picked for a server before it binds them avoid every port another server was given and has not bound yet:
a pick onto one takes it from its owner. CI once saw a sidecar found live refuse its next gRPC call; the likely cause
(not reproduced): its native front end's Triton took the sidecar's HTTP port and answered the health probe, and the
sidecar, which could not bind that port, exited."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from runtime.sidecar_process import SidecarProcess
from runtime.tritonserver import TritonProcess


def _recording(seen: list[set[int]], first: int = 40_001):
    def free_ports(n: int, taken: set[int], host: str = "127.0.0.1") -> list[int]:
        seen.append(set(taken))
        return [p for p in range(first, first + n + len(taken) + 1) if p not in taken][:n]
    return free_ports


def test_a_tritonserver_picks_none_of_the_ports_it_is_told_to_avoid(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[set[int]] = []
    monkeypatch.setattr("poolpipe_common.net.free_ports", _recording(seen))
    t = TritonProcess(tmp_path, grpc_port=40_002, avoid=frozenset({40_001, 40_003}))
    assert seen == [{40_001, 40_002, 40_003}]  # one call: the picks are distinct from each other too
    assert t.grpc_port == 40_002 and {t.http_port, t.metrics_port} == {40_004, 40_005}


def test_a_sidecar_picks_none_of_the_ports_its_extra_flags_name(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[set[int]] = []
    monkeypatch.setattr("poolpipe_common.net.free_ports", _recording(seen))
    sc = SidecarProcess(extra_args=("--native-grpc-port", "40001", "--native-http-port", "40003", "--workers", "2"))
    assert seen == [{40_001, 40_003}]
    assert {sc.grpc_port, sc.http_port, sc.metrics_port} == {40_002, 40_004, 40_005}


class _AlwaysOk(BaseHTTPRequestHandler):
    """Another server on the sidecar's HTTP port: it answers every path 200, the health probe's too."""

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_a_sidecar_whose_http_port_another_server_took_is_started_again_on_other_ports(tmp_path: Path) -> None:
    """The other server's 200 is not the sidecar's: that sidecar exits ("already in use"), and start() picks again
    (before, start() returned as if it were live)."""
    sc = SidecarProcess(passthrough="127.0.0.1:1", log_path=tmp_path / "sidecar.log")
    taken = sc.http_port
    other = ThreadingHTTPServer(("127.0.0.1", taken), _AlwaysOk)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        with sc:
            assert sc.http_port != taken
            assert sc.proc is not None and sc.proc.poll() is None
            assert "already in use" in (tmp_path / "sidecar.log").read_text()
    finally:
        other.shutdown()
        other.server_close()
