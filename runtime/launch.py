"""Start and stop the tritonservers of a generated deployment (``poolpipe launch``, tests, demo, benchmarks).

:class:`Deployment` reads ``DIR/manifest.json`` and ``DIR/<host>/launch.json`` (written by
``poolpipe generate``), checks each GPU host's hardware (pynvml: GPU names and count, MPS daemon when
a GPU is split into vGPUs) and that its partitions' engines load in the backend's Python, resolves MIG
vGPUs to their instances (runtime.gpu_preflight), starts every server of the chosen hosts in parallel,
waits until all are ready (long enough for a first TensorRT build where one may happen, reporting
progress), and stops them all on exit, removing their shared-memory regions.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from backends.partition import ENGINE_FILES
from model_repository_gen.manifest import Manifest, load_manifest
from poolpipe_common.errors import InputError
from poolpipe_common.net import port_in_use
from profiling.devices import mps_running
from profiling.gpu_types import gpu_label, label_matches
from runtime.gpu_preflight import (
    discover_mig_instances,
    engine_problems,
    mig_env,
    ready_timeout_s,
    stage_engines,
)
from runtime.launch_files import HostLaunch, ServerLaunch, load_host_launch
from runtime.tritonserver import TritonProcess, find_triton

__all__ = ["Deployment", "GpuInfo", "HostLaunch", "ServerLaunch", "load_host_launch"]
WAIT_REPORT_S = 15.0  # how often on_wait hears which servers are still loading


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    memory_bytes: int


def discover_gpus() -> list[GpuInfo]:
    """The local NVIDIA GPUs via pynvml (InputError when pynvml or the driver is missing)."""
    try:
        import pynvml  # noqa: PLC0415
    except ImportError:
        raise InputError("pynvml is not installed, so the local GPUs cannot be checked: "
                         "pip install nvidia-ml-py (or poolpipe[gpu])") from None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        raise InputError(f"no NVIDIA driver answers on this machine (NVML: {e})") from None
    try:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            out.append(GpuInfo(i, name.decode() if isinstance(name, bytes) else str(name),
                               int(pynvml.nvmlDeviceGetMemoryInfo(h).total)))
        return out
    finally:
        pynvml.nvmlShutdown()


def gpu_matches(gpu_type: str, name: str) -> bool:
    """Whether the card NVML names ``name`` is of ``gpu_type``, by the one table of GPU types (profiling.gpu_types):
    ``A100`` matches "NVIDIA A100-SXM4-80GB" (its family), ``T4`` does not match "NVIDIA RTX A4000"."""
    return label_matches(gpu_type, name)


def check_host_hardware(launch: HostLaunch, gpus: Sequence[GpuInfo], mps: bool) -> None:
    """Refuse a GPU host whose GPUs differ from the cluster file, or that needs MPS without a daemon."""
    if launch.device != "gpu":
        return
    matching = [g for g in gpus if gpu_matches(launch.gpu_type, g.name)]
    if len(matching) < launch.gpus or len(gpus) < launch.gpus:
        found = ", ".join(f"{g.index}: {g.name} (type {gpu_label(g.name)})" for g in gpus) or "none"
        raise InputError(f"host {launch.host}: the cluster file says {launch.gpus} x {launch.gpu_type}, but this "
                         f"machine has {len(matching)} matching GPU(s) (found: {found}); launch it on the right "
                         f"machine or fix the cluster file and re-generate")
    wrong = [g for g in gpus[:launch.gpus] if not gpu_matches(launch.gpu_type, g.name)]
    if wrong:
        raise InputError(f"host {launch.host}: GPU {wrong[0].index} is {wrong[0].name} (type "
                         f"{gpu_label(wrong[0].name)}), not {launch.gpu_type}; "
                         f"GPUs 0..{launch.gpus - 1} must all be {launch.gpu_type}")
    if launch.needs_mps and not mps:
        raise InputError(f"host {launch.host}: the plan splits its GPUs into vGPUs, which needs the MPS daemon; "
                         f"start it with 'nvidia-cuda-mps-control -d' (as the GPUs' owner) and launch again")


class Deployment:
    """All tritonservers of a generated deployment (or of some hosts); a context manager.

    ``on_ready(vgpu_id, ready, total)`` is called as servers become ready (progress display).
    """

    def __init__(self, directory: str | Path, hosts: Sequence[str] | None = None, *, check_hardware: bool = True,
                 timeout_s: float | None = None, log_dir: str | Path | None = None,
                 on_ready: Callable[[str, int, int], None] | None = None,
                 on_wait: Callable[[list[str], float], None] | None = None, triton_args: Sequence[str] = ()) -> None:
        self.hosts = tuple(hosts or ())
        self.triton_args = tuple(triton_args)  # launch --triton-arg: tritonserver flags for every server (TLS)
        self.directory, self.manifest, self.launches = self.read(directory)
        self.check_hardware = check_hardware
        # None: long enough for a first TensorRT build where one of these servers' engines may build one
        self.timeout_s = (timeout_s if timeout_s is not None else
                          ready_timeout_s(self.manifest, {s.vgpu for s in self.server_launches}))
        self.on_wait = on_wait  # (servers not ready yet, seconds waited), every WAIT_REPORT_S while waiting
        self.device_env: dict[str, dict[str, str]] = {}  # vGPU -> its environment with its MIG instance resolved
        self.log_dir = Path(log_dir) if log_dir else None
        self.on_ready = on_ready
        self.servers: dict[str, TritonProcess] = {}
        self.gpus: list[GpuInfo] = []  # the local GPUs found by preflight (GPU hosts only)

    def read(self, directory: str | Path) -> tuple[Path, Manifest, tuple[HostLaunch, ...]]:
        """(resolved directory, manifest, launch files of this deployment's hosts) of a generated directory."""
        resolved = Path(directory).resolve()
        manifest = load_manifest(resolved)
        deployed = [h.name for h in manifest.hosts if (resolved / h.name / "launch.json").is_file()]
        unknown = [h for h in self.hosts if h not in deployed]
        if unknown:
            raise InputError(f"--host {', '.join(unknown)}: not a host with servers in {resolved} "
                             f"(hosts: {', '.join(deployed) or 'none'})")
        return resolved, manifest, tuple(load_host_launch(resolved, h) for h in (self.hosts or deployed))

    @property
    def server_launches(self) -> list[ServerLaunch]:
        return [s for h in self.launches for s in h.servers]

    def preflight(self) -> None:
        """Hardware and port checks, before anything starts."""
        self.check_devices()
        self.check_ports()

    def check_devices(self) -> None:
        """The GPUs, MPS, engines and MIG instances the launch files name are here (one-line InputError if not)."""
        gpu_hosts = [h for h in self.launches if h.device == "gpu"]
        if gpu_hosts and self.check_hardware:
            self.gpus, mps = discover_gpus(), mps_running()
            for h in gpu_hosts:
                check_host_hardware(h, self.gpus, mps)
                self.check_engines(h)
        self.resolve_mig()

    def check_ports(self) -> None:
        """No two vGPUs share a port and none is in use (one-line InputError if not)."""
        owner: dict[tuple[str, int], str] = {}
        for s in self.server_launches:
            for port in (s.http_port, s.grpc_port, s.metrics_port):
                other = owner.setdefault((s.address, port), s.vgpu)
                if other != s.vgpu:
                    raise InputError(f"vGPUs {other} and {s.vgpu} both use port {port} on {s.address}; "
                                     "re-generate with base_ports that do not overlap")
                if port_in_use(port, s.address):
                    raise InputError(f"vGPU {s.vgpu}: port {port} on {s.address} is already in use; stop what "
                                     f"uses it or re-generate with another base_port for host {s.host}")

    def start(self, preflight: bool = True) -> "Deployment":
        """Start every server in parallel and wait until all are ready (all stopped again on failure)."""
        if preflight:
            self.preflight()
        try:
            self.spawn(self.server_launches)
        except BaseException:
            self.stop()
            raise
        return self

    def spawn(self, launches: Sequence[ServerLaunch]) -> dict[str, TritonProcess]:
        """Start these servers in parallel and wait until all are ready (the caller stops them on failure)."""
        started = {}
        for s in launches:
            log = (self.log_dir / f"{s.vgpu}.tritonserver.log" if self.log_dir
                   else s.repository.parent / "tritonserver.log")
            log.parent.mkdir(parents=True, exist_ok=True)
            started[s.vgpu] = self.servers[s.vgpu] = TritonProcess(
                s.repository, s.http_port, s.grpc_port, s.metrics_port, host=s.address, env=self.env_of(s),
                log_path=log, name=f"vGPU {s.vgpu}", extra_args=self.triton_args).spawn()
        self._wait_all_ready(started)
        return started

    def check_engines(self, h: HostLaunch) -> None:
        """The engines of a GPU host's partitions can run in the backend's Python; else one line naming why."""
        install = find_triton()
        if install.python is None:
            return  # the backend's Python is unknown ($POOLPIPE_TRITONSERVER without $POOLPIPE_BACKEND_PYTHON)
        engines = stage_engines(self.manifest, {s.vgpu for s in h.servers})
        problems = engine_problems(install.python, ENGINE_FILES[0], sorted(engines))
        if problems:
            engine, why = sorted(problems.items())[0]
            raise InputError(f"host {h.host}: its GPU partitions run engine {engine}, which cannot load in the Python "
                             f"backend's Python ({install.python}): {why}")

    def resolve_mig(self) -> None:
        """Each MIG vGPU's environment with its instance's UUID (NVML); InputError when one is missing."""
        mig = [s for s in self.server_launches if "POOLPIPE_MIG_GPU" in s.env]
        if not mig:
            return
        if not self.check_hardware:
            raise InputError(f"vGPU {mig[0].vgpu} runs on a MIG instance, which launch finds through NVML; launch "
                             "without --no-hardware-check")
        instances = discover_mig_instances()
        for s in mig:
            self.device_env[s.vgpu] = mig_env(s.vgpu, s.env, instances)

    def env_of(self, s: ServerLaunch) -> dict[str, str]:
        """The environment a vGPU's server starts with (a MIG vGPU's with its instance resolved)."""
        return self.device_env.get(s.vgpu, s.env)

    def _wait_all_ready(self, servers: dict[str, TritonProcess]) -> None:
        pending = dict(servers)
        total = len(pending)
        start = time.monotonic()
        deadline, report = start + self.timeout_s, start + WAIT_REPORT_S
        while pending:
            for vid, srv in list(pending.items()):
                if srv.exited() is not None:
                    srv.wait_ready(0)  # raises with the exit status and the log's last error
                if srv.is_ready():
                    del pending[vid]
                    if self.on_ready:
                        self.on_ready(vid, total - len(pending), total)
            if pending and self.on_wait and time.monotonic() >= report:
                report = time.monotonic() + WAIT_REPORT_S
                self.on_wait(sorted(pending), time.monotonic() - start)
            if pending and time.monotonic() > deadline:
                raise TimeoutError(f"{len(pending)} tritonserver(s) not ready after {self.timeout_s:.0f} s: "
                                   f"{', '.join(pending)} (logs: {next(iter(pending.values())).log_path})")
            if pending:
                time.sleep(0.2)

    def failed(self) -> dict[str, int]:
        """Servers that have exited since they started: vGPU id -> exit status."""
        return {vid: rc for vid, srv in self.servers.items() if (rc := srv.exited()) is not None}

    def stop(self, vgpus: Sequence[str] | None = None) -> None:
        """Stop every server, or those of ``vgpus`` (all SIGTERMed at once, then each awaited), and remove
        their shm regions."""
        chosen = [v for v in (self.servers if vgpus is None else vgpus) if v in self.servers]
        for v in chosen:
            srv = self.servers[v]
            if srv.proc is not None and srv.proc.poll() is None:
                try:
                    os.killpg(srv.proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for v in chosen:
            self.servers.pop(v).stop()

    def __enter__(self) -> "Deployment":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
