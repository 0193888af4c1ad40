"""Inference engines the profiler times: ONNX Runtime (CPU or CUDA), TensorRT, PyTorch via onnx2torch.

``make_runner(model, device, engine, threads)`` returns an object with ``run(feeds) -> list[np.ndarray]``
that does one synchronous inference (GPU engines synchronise before returning, so wall time is the
compute time). ``check_engine`` says in one line why a device/engine cannot run here; heavy and
optional libraries are imported only when asked for.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import onnx

from poolpipe_common.errors import InputError

DEVICES = ("cpu", "cuda")
ENGINES = ("ort", "trt", "torch")


class Runner(Protocol):
    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]: ...


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


def default_engine(device: str) -> str:
    """TensorRT where it imports, else ONNX Runtime (the CPU always uses ONNX Runtime)."""
    if device == "cuda" and importlib.util.find_spec("tensorrt") is not None:
        return "trt"
    return "ort"


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
    gpus = gpu_names()
    if not gpus:
        raise InputError("--device cuda needs an NVIDIA GPU, and none is visible on this machine "
                         "(no NVML device, no nvidia-smi); profile on a GPU host or use --device cpu")
    if engine == "ort":
        import onnxruntime as ort
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            raise InputError("--engine ort on --device cuda needs onnxruntime-gpu (CUDAExecutionProvider is "
                             f"not available: {', '.join(ort.get_available_providers())})")
    elif engine == "trt":
        for lib in ("tensorrt", "torch"):
            if importlib.util.find_spec(lib) is None:
                raise InputError(f"--engine trt needs the Python package '{lib}' (pip install poolpipe[gpu])")
    elif engine == "torch":
        for lib in ("torch", "onnx2torch"):
            if importlib.util.find_spec(lib) is None:
                raise InputError(f"--engine torch needs the Python package '{lib}' (pip install poolpipe[gpu])")
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


@dataclass
class _OrtRunner:
    session: object
    outputs: list[str]

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return self.session.run(self.outputs, feeds)  # type: ignore[attr-defined]


def _ort_runner(model: onnx.ModelProto, device: str, threads: int | None) -> _OrtRunner:
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.log_severity_level = 3
    if threads:
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
    providers = ["CUDAExecutionProvider"] if device == "cuda" else ["CPUExecutionProvider"]
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=providers)
    return _OrtRunner(sess, [o.name for o in sess.get_outputs()])


class _TorchRunner:
    """onnx2torch-converted module on the GPU; inputs copied in, outputs copied out, synchronised."""

    def __init__(self, model: onnx.ModelProto) -> None:
        import torch
        from onnx2torch import convert
        self.torch = torch
        self.module = convert(model).eval().cuda()
        self.inputs = [i.name for i in model.graph.input
                       if i.name not in {t.name for t in model.graph.initializer}]

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        torch = self.torch
        with torch.inference_mode():
            out = self.module(*(torch.from_numpy(feeds[n]).cuda() for n in self.inputs))
            outs = out if isinstance(out, (list, tuple)) else [out]
            torch.cuda.synchronize()
            return [o.cpu().numpy() for o in outs]


class _TrtRunner:
    """TensorRT engine built from the ONNX model with a dynamic-batch optimisation profile (torch buffers)."""

    def __init__(self, model: onnx.ModelProto, max_batch: int = 64) -> None:
        import tensorrt as trt  # type: ignore[import-not-found]
        import torch
        self.torch, self.trt = torch, trt
        logger = trt.Logger(trt.Logger.ERROR)
        builder = trt.Builder(logger)
        network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH)) \
            if hasattr(trt.NetworkDefinitionCreationFlag, "EXPLICIT_BATCH") else builder.create_network(0)
        parser = trt.OnnxParser(network, logger)
        if not parser.parse(model.SerializeToString()):
            raise InputError(f"TensorRT cannot parse the model: {parser.get_error(0)}")
        config = builder.create_builder_config()
        prof = builder.create_optimization_profile()
        for i in range(network.num_inputs):
            t = network.get_input(i)
            rest = tuple(t.shape)[1:]
            prof.set_shape(t.name, (1, *rest), (max(1, max_batch // 2), *rest), (max_batch, *rest))
        config.add_optimization_profile(prof)
        plan = builder.build_serialized_network(network, config)
        if plan is None:
            raise InputError("TensorRT could not build an engine for the model")
        self.engine = trt.Runtime(logger).deserialize_cuda_engine(plan)
        self.context = self.engine.create_execution_context()
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        self.inputs = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self.outputs = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT]
        self.stream = torch.cuda.Stream()

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        torch, trt = self.torch, self.trt
        keep = []
        for n in self.inputs:
            x = torch.from_numpy(np.ascontiguousarray(feeds[n])).cuda()
            keep.append(x)
            self.context.set_input_shape(n, tuple(x.shape))
            self.context.set_tensor_address(n, x.data_ptr())
        outs = []
        for n in self.outputs:
            dtype = torch.from_numpy(np.zeros(1, dtype=trt.nptype(self.engine.get_tensor_dtype(n)))).dtype
            y = torch.empty(tuple(self.context.get_tensor_shape(n)), dtype=dtype, device="cuda")
            outs.append(y)
            self.context.set_tensor_address(n, y.data_ptr())
        self.context.execute_async_v3(self.stream.cuda_stream)
        self.stream.synchronize()
        return [y.cpu().numpy() for y in outs]


def make_runner(model: onnx.ModelProto, device: str = "cpu", engine: str = "ort",
                threads: int | None = None) -> Runner:
    """A runner for ``model``; call ``check_engine`` first for a clear error when hardware is missing."""
    if engine == "ort":
        return _ort_runner(model, device, threads)
    if engine == "torch":
        return _TorchRunner(model)
    if engine == "trt":
        return _TrtRunner(model)
    raise InputError(f"--engine {engine!r}: choose one of {', '.join(ENGINES)}")
