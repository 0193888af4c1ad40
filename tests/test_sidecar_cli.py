"""``poolpipe serve`` refuses bad flags with one clear line and exit status 2."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from poolpipe_common.net import free_port
from tests.conftest import run_cli


@pytest.mark.parametrize("args,message", [
    ((), "give --manifest DIR/manifest.json, --passthrough HOST:PORT, or both"),
    (("--passthrough", "localhost"), "expected HOST:PORT"),
    (("--manifest", "/nonexistent/manifest.json"), "cannot read manifest /nonexistent/manifest.json"),
    (("--passthrough", "127.0.0.1:8001", "--policy", "lazy"), "--policy lazy: choose one of auto, ppipe"),
    (("--passthrough", "127.0.0.1:8001", "--grpc-port", "70000"), "--grpc-port: 70000 is not a TCP port"),
])
def test_bad_flags(args: tuple[str, ...], message: str) -> None:
    ports = ("--grpc-port", str(free_port()), "--http-port", str(free_port()), "--metrics-port", str(free_port()))
    r = run_cli("serve", *ports, *args, timeout=60)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr and "Traceback" not in r.stderr


def test_port_in_use(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        r = run_cli("serve", "--passthrough", "127.0.0.1:1", "--http-port", str(busy), "--grpc-port",
                    str(free_port()), "--metrics-port", str(free_port()), timeout=60)
    assert r.returncode == 2 and f"--http-port: port {busy} on 127.0.0.1 is already in use" in r.stderr


def test_bad_manifest_names_the_field(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text('{"format": "poolpipe.manifest/1", "hosts": []}')
    r = run_cli("serve", "--manifest", str(tmp_path), "--grpc-port", str(free_port()), "--http-port",
                str(free_port()), "--metrics-port", str(free_port()), timeout=60)
    assert r.returncode == 2 and "missing field 'vgpus'" in r.stderr, r.stderr
