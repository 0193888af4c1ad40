"""The cluster file: the concrete hosts a plan is deployed on (YAML or JSON), validated at load time.

::

    hosts:
      - name: gpu-a                # unique; used in vGPU ids and directory names
        address: 10.0.0.5          # where its tritonservers listen (and the sidecar connects)
        gpu_type: L4               # as in the plan/profile; "cpu" for a CPU-only machine
        gpus: 4                    # GPUs of that type (CPU hosts: CPU device slots)
        bandwidth_gbps: 10         # NIC bandwidth
        device: gpu                # optional: "cpu" serves this GPU type's partitions on the CPU
                                   #   (emulation for tests and demos; default "cpu" iff gpu_type is "cpu");
                                   #   "emulated" holds each batch for the profiled latency of gpu_type
                                   #   (no engine, no GPU, no CPU spent on compute; generate needs no --onnx
                                   #   for models served only by emulated hosts)
        latency_cv: 0.05           # optional, emulated hosts: lognormal latency noise, coefficient of variation
                                   #   (default 0: every batch holds exactly its profiled latency)
        cpu_cores: 16              # optional, CPU devices: cores its vGPUs share (default: this machine's)
        base_port: 8000            # optional: vGPU k gets http base+3k, grpc base+3k+1, metrics base+3k+2;
                                   #   0 picks free ports on this machine now (loopback tests and demos)
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from poolpipe_common.documents import check_fields, need, read_document
from poolpipe_common.errors import InputError

CLUSTER_FILE_FIELDS = ("hosts",)  # each host's fields are ClusterHost's
DEFAULT_BASE_PORT = 8000
DEVICES = ("gpu", "cpu", "emulated")
MAX_LATENCY_CV = 10.0
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class ClusterHost:
    name: str
    address: str
    gpu_type: str
    gpus: int
    bandwidth_gbps: float
    device: str = "gpu"  # one of DEVICES
    cpu_cores: int | None = None
    base_port: int = DEFAULT_BASE_PORT
    emulate_slowdown: float = 1.0  # CPU hosts only: emulate a device class this many times slower
    latency_cv: float = 0.0  # emulated hosts only: latency noise (coefficient of variation)

    @property
    def on_cpu(self) -> bool:
        """Real engines on the CPU."""
        return self.device == "cpu"

    @property
    def emulated(self) -> bool:
        """No engine: the partition backend holds each batch for its profiled latency."""
        return self.device == "emulated"

    @property
    def on_gpu(self) -> bool:
        return self.device == "gpu"


@dataclass(frozen=True)
class Cluster:
    hosts: tuple[ClusterHost, ...]
    source: str = "cluster"

    def gpus_of_type(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for h in self.hosts:
            out[h.gpu_type] = out.get(h.gpu_type, 0) + h.gpus
        return out

    def hosts_of_type(self, gpu_type: str) -> list[ClusterHost]:
        return [h for h in self.hosts if h.gpu_type == gpu_type]


def _int(x: Any, where: str, lo: int, hi: int | None = None) -> int:
    if isinstance(x, bool) or not isinstance(x, int) or x < lo or (hi is not None and x > hi):
        rng = f"{lo}..{hi}" if hi is not None else f">= {lo}"
        raise InputError(f"{where}: expected a whole number {rng}, got {x!r}")
    return x


def host_from_dict(d: Any, where: str) -> ClusterHost:
    check_fields(d, ClusterHost.__dataclass_fields__, where)
    for key in ("name", "address", "gpu_type", "gpus", "bandwidth_gbps"):
        need(d, key, where)
    name = d["name"]
    if not isinstance(name, str) or not _NAME.match(name):
        raise InputError(f"{where}.name: {name!r} must be letters, digits, '_', '.', '-' (it names directories)")
    for key in ("address", "gpu_type"):
        if not isinstance(d[key], str) or not d[key] or d[key] != d[key].strip():
            raise InputError(f"{where}.{key}: expected a non-empty string, got {d[key]!r}")
    bw = d["bandwidth_gbps"]
    if isinstance(bw, bool) or not isinstance(bw, (int, float)) or bw <= 0:
        raise InputError(f"{where}.bandwidth_gbps: expected a number > 0, got {bw!r}")
    device = d.get("device", "cpu" if d["gpu_type"] == "cpu" else "gpu")
    if device not in DEVICES:
        raise InputError(f"{where}.device: expected one of {', '.join(DEVICES)}, got {device!r}")
    if d["gpu_type"] == "cpu" and device == "gpu":
        raise InputError(f"{where}.device: a host of gpu_type 'cpu' cannot have device 'gpu'")
    cores = d.get("cpu_cores")
    cores = None if cores is None else _int(cores, f"{where}.cpu_cores", 1)
    base = d.get("base_port", DEFAULT_BASE_PORT)
    if base != 0:
        _int(base, f"{where}.base_port", 1024, 65000)
    slow = d.get("emulate_slowdown", 1.0)
    if isinstance(slow, bool) or not isinstance(slow, (int, float)) or slow < 1:
        raise InputError(f"{where}.emulate_slowdown: expected a number >= 1, got {slow!r}")
    if slow != 1 and device != "cpu":
        raise InputError(f"{where}.emulate_slowdown: only CPU hosts (device: cpu) emulate a slower device")
    cv = d.get("latency_cv", 0.0)
    if isinstance(cv, bool) or not isinstance(cv, (int, float)) or not 0 <= cv <= MAX_LATENCY_CV:
        raise InputError(f"{where}.latency_cv: expected a number 0..{MAX_LATENCY_CV:g}, got {cv!r}")
    if cv and device != "emulated":
        raise InputError(f"{where}.latency_cv: only emulated hosts (device: emulated) add latency noise")
    return ClusterHost(name, d["address"], d["gpu_type"], _int(d["gpus"], f"{where}.gpus", 1), float(bw),
                       device, cores, int(base), float(slow), float(cv))


def cluster_from_dict(d: Any, source: str = "cluster") -> Cluster:
    if isinstance(d, dict):
        check_fields(d, CLUSTER_FILE_FIELDS, source)
    if not isinstance(d, dict) or not isinstance(d.get("hosts"), list) or not d["hosts"]:
        raise InputError(f"{source}: expected 'hosts:' with a non-empty list of hosts")
    hosts = tuple(host_from_dict(h, f"{source}: hosts[{i}]") for i, h in enumerate(d["hosts"]))
    names = [h.name for h in hosts]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise InputError(f"{source}: host name(s) {', '.join(dup)} appear more than once")
    return Cluster(hosts, source)


def load_cluster(path: str | Path) -> Cluster:
    return cluster_from_dict(read_document(path, "cluster file", yaml_ok=True), str(path))


def cpu_cores(host: ClusterHost) -> int:
    """Cores the host's CPU vGPUs share: the file's ``cpu_cores``, else this machine's usable cores."""
    if host.cpu_cores:
        return host.cpu_cores
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1
