"""The devices the profiler times on: GPU discovery, the MPS daemon, and the engines behind one-line errors.

The engines themselves are ``profiling.engines`` (the same module the partition backend runs
inside tritonserver), so an engine name means the same in a profile and in a deployment.
``check_engine`` says in one line why a device/engine cannot run here; ``make_runner`` opens an engine
on an in-memory ONNX model.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import onnx

from poolpipe_common.errors import InputError
from profiling import engines
from profiling.engines import DEVICES, ENGINES, Engine, default_engine

__all__ = ["DEVICES", "ENGINES", "Engine", "check_engine", "cuda_device_name", "default_engine", "gpu_names",
           "make_runner", "mps_running"]


def gpu_names() -> list[str]:
    """Names of the NVIDIA GPUs visible here (pynvml, else nvidia-smi); empty without a GPU."""
    try:
        import pynvml  # type: ignore[import-not-found]
        pynvml.nvmlInit()
        try:
            names = [pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))
                     for i in range(pynvml.nvmlDeviceGetCount())]
            return [n.decode() if isinstance(n, bytes) else n for n in names]
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no pynvml, no driver, no GPU: fall back to nvidia-smi
        pass
    smi = shutil.which("nvidia-smi")
    if not smi:
        return []
    try:
        out = subprocess.run([smi, "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip()] if out.returncode == 0 else []


def cuda_device_name() -> str | None:
    """NVML's name of CUDA device 0 of this process: the first of CUDA_VISIBLE_DEVICES where that names an index
    (CUDA counts in PCI bus order, as NVML, once CUDA_DEVICE_ORDER=PCI_BUS_ID), else NVML's first GPU."""
    names = gpu_names()
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    if first.isdigit() and int(first) < len(names):
        return names[int(first)]
    return names[0] if names else None


def check_engine(device: str, engine: str, vgpu_levels: tuple[int, ...] = (1,)) -> None:
    """Raise InputError, in one line, if ``engine`` on ``device`` cannot run on this machine."""
    if device not in DEVICES:
        raise InputError(f"--device {device!r}: choose one of {', '.join(DEVICES)}")
    if engine not in ENGINES:
        raise InputError(f"--engine {engine!r}: choose one of {', '.join(ENGINES)}")
    if device == "cpu":
        if engine != "ort":
            raise InputError(f"--engine {engine} needs --device cuda; the CPU is profiled with ONNX Runtime "
                             "(--engine ort)")
        return
    if not gpu_names():
        raise InputError("--device cuda needs an NVIDIA GPU, and none is visible on this machine "
                         "(no NVML device, no nvidia-smi); profile on a GPU host or use --device cpu")
    problem = engines.engine_problem(engine, device)
    if problem:
        raise InputError(f"--engine {engine}: {problem}")
    if max(vgpu_levels) > 1 and not mps_running():
        raise InputError(f"--vgpu-levels {','.join(map(str, vgpu_levels))} on --device cuda needs the CUDA MPS "
                         "control daemon (nvidia-cuda-mps-control -d); without it the levels do not share the GPU")


def mps_running(proc: Path = Path("/proc")) -> bool:
    """Whether an MPS control daemon runs: its pipe exists or a ``nvidia-cuda-mps-control`` process is alive."""
    pipe = Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")) / "control"
    if pipe.exists():
        return True
    for comm in proc.glob("[0-9]*/comm"):
        try:
            if comm.read_text().strip().startswith("nvidia-cuda-mps"):
                return True
        except OSError:
            continue
    return False


def make_runner(model: onnx.ModelProto, device: str = "cpu", engine: str = "ort", threads: int | None = None,
                max_batch: int = 64) -> Engine:
    """``engine`` on ``model`` (batches up to ``max_batch``); call ``check_engine`` first for a clear error when
    hardware is missing. CUDA numbers devices as NVML does (PCI bus order), so device 0 is the GPU whose name
    labels the profile."""
    if device == "cuda":
        os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    try:
        return engines.open_engine(model.SerializeToString(), engine, device, threads=threads or 0,
                                   max_batch=max_batch)
    except engines.EngineError as e:
        raise InputError(f"--engine {engine}: {e}") from None
