"""The launch files of a generated deployment (``DIR/<host>/launch.json``): which servers run where, validated."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from model_repository_gen.generate import LAUNCH_FORMAT
from poolpipe_common.documents import read_document
from poolpipe_common.errors import InputError


@dataclass(frozen=True)
class ServerLaunch:
    vgpu: str
    host: str
    address: str
    repository: Path
    http_port: int
    grpc_port: int
    metrics_port: int
    env: dict[str, str]
    models: tuple[str, ...] = ()  # partition models in its repository

    @property
    def http_url(self) -> str:
        return f"{self.address}:{self.http_port}"

    def model_dir(self, model: str) -> Path:
        return self.repository / model


@dataclass(frozen=True)
class HostLaunch:
    host: str
    address: str
    gpu_type: str
    device: str
    gpus: int
    needs_mps: bool
    servers: tuple[ServerLaunch, ...]


def load_host_launch(directory: Path, host: str) -> HostLaunch:
    """``DIR/<host>/launch.json``, validated."""
    p = directory / host / "launch.json"
    if not p.is_file():
        raise InputError(f"cannot read launch file {p}: no such file (run 'poolpipe generate' first)")
    d: Any = read_document(p, "launch file")
    if not isinstance(d, dict) or d.get("format") != LAUNCH_FORMAT:
        raise InputError(f"{p}: not a poolpipe launch file (format {LAUNCH_FORMAT!r})")
    try:
        servers = tuple(ServerLaunch(s["vgpu"], host, d["address"], (p.parent / s["repository"]).resolve(),
                                     int(s["http_port"]), int(s["grpc_port"]), int(s["metrics_port"]),
                                     {str(k): str(v) for k, v in s["env"].items()},
                                     tuple(str(m) for m in s.get("models", ()))) for s in d["servers"])
        return HostLaunch(host, d["address"], d["gpu_type"], d["device"], int(d["gpus"]), bool(d["needs_mps"]),
                          servers)
    except (KeyError, TypeError, ValueError) as e:
        raise InputError(f"{p}: malformed launch file ({type(e).__name__}: {e})") from None
