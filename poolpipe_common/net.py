"""Loopback port helpers for servers poolpipe starts (tests, launch, the demo)."""

from __future__ import annotations

import random
import socket
from pathlib import Path


def free_port(host: str = "127.0.0.1", low: int = 20_000) -> int:
    """A port free now, below the kernel's ephemeral range: a port the kernel picked (bind to port 0) may be
    handed to another socket (a later bind to port 0, an outgoing connection's source port) before the server
    it was chosen for binds it; the kernel never hands out ports below that range by itself."""
    top = 32_768
    try:
        top = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(low, max(low + 1, top))
        if not port_in_use(port, host):
            return port
    return _kernel_port(host)


def free_ports(n: int, taken: set[int] = frozenset(), host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct free ports, none in ``taken`` (two picks of a free port can be the same port, since
    neither is bound yet)."""
    out: list[int] = []
    while len(out) < n:
        port = free_port(host)
        if port not in taken and port not in out:
            out.append(port)
    return out


def fill_free_ports(ports: dict[str, int], taken: set[int] = frozenset(), host: str = "127.0.0.1") -> dict[str, int]:
    """``ports`` with each 0 a free port, distinct from each other, from the ones given and from ``taken`` (ports
    chosen for other servers and not bound yet: a pick onto one would take it from its owner)."""
    unset = [k for k, port in ports.items() if not port]
    given = {port for port in ports.values() if port}
    return {**ports, **dict(zip(unset, free_ports(len(unset), set(taken) | given, host)))}


def _kernel_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_in_use(port: int, host: str = "127.0.0.1", shared: bool = False) -> bool:
    """Whether a server could not listen on ``port``; ``shared``: one that shares it (SO_REUSEPORT) with the
    servers that already listen there sharing it too."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if shared:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False
