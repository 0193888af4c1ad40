"""The inference engines of poolpipe, one module for the profiler and the partition backend.

The profiler imports it from the package (``profiling.engines``); ``poolpipe generate`` copies
it beside ``model.py`` into every partition model, where the backend loads it inside ``tritonserver``.
So it imports nothing of the project, and heavy or optional libraries only when an engine needs them.

Every engine name means the same in a profile (``profile measure --engine``) and in a deployment
(the partition model's ``engine`` parameter), so a profile times the engine that serves:

===========  ==========================================================================================
``ort``      ONNX Runtime: the CPU execution provider on ``cpu``, the CUDA provider on ``cuda``
``ort-trt``  ONNX Runtime's TensorRT execution provider (then CUDA, then CPU for what it lacks); cuda only
``trt``      native TensorRT: an engine built from the ONNX model with a dynamic-batch profile; cuda only
``torch``    the ONNX model converted to PyTorch with onnx2torch; cuda only
===========  ==========================================================================================

``open_engine`` returns an :class:`Engine`: ``run(feeds)`` does one synchronous inference and returns
every output in ``engine.outputs`` order (GPU engines synchronise, so wall time is compute time);
``engine.providers`` says what runs it (ONNX Runtime's execution providers of the session, or the library).
Nothing falls back silently: ONNX Runtime lists CUDA and TensorRT even where their libraries do not load and
then runs on the CPU, so a session whose first provider is not the one asked for is refused (EngineError naming
what ran). TensorRT's parts live in engine_trt.py beside this file (engine and timing caches, profile shapes).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

ENGINES = ("ort", "ort-trt", "trt", "torch")
DEVICES = ("cpu", "cuda")
GPU_ONLY = ("ort-trt", "trt", "torch")
_NEEDS = {"trt": ("tensorrt", "torch"), "torch": ("torch", "onnx2torch")}  # Python packages per engine
_ORT_CHAIN = {("ort", "cpu"): ["CPUExecutionProvider"],
              ("ort", "cuda"): ["CUDAExecutionProvider", "CPUExecutionProvider"],
              ("ort-trt", "cuda"): ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]}


class EngineError(RuntimeError):
    """An engine that cannot run here or cannot load the model; the message says why in one line."""


class Engine:
    """One loaded model: ``inputs`` and ``outputs`` are its tensor names, ``description`` what runs it,
    ``providers`` the execution providers (or library) that actually run it."""

    inputs: list[str]
    outputs: list[str]
    description: str
    providers: list[str]

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        raise NotImplementedError


def _ort_providers() -> list[str]:
    import onnxruntime as ort

    return list(ort.get_available_providers())


def _has(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


def onnxruntime_distributions() -> dict[str, str]:
    """The ONNX Runtime distributions installed (name -> version): they all install the module ``onnxruntime``,
    so more than one leaves whichever was installed last, half overwritten."""
    from importlib import metadata

    out = {}
    for name in ("onnxruntime", "onnxruntime-gpu"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def _torch_cuda_problem() -> str | None:
    """Why PyTorch cannot reach a CUDA device here (a CPU build, no device visible), or None."""
    import torch

    if getattr(getattr(torch, "version", None), "cuda", None) is None:
        return f"PyTorch {getattr(torch, '__version__', '?')} is a CPU build (pip install torch with CUDA)"
    if not torch.cuda.is_available():
        return f"PyTorch {torch.__version__} sees no CUDA device"
    return None


def engine_problem(engine: str, device: str) -> str | None:
    """Why ``engine`` cannot run on ``device`` here (missing package or provider, or a PyTorch without CUDA for
    the engines that hold their buffers in it), or None if it can. Whether a GPU is present at all is the
    caller's check."""
    if engine not in ENGINES:
        return f"engine {engine!r} is not one of {', '.join(ENGINES)}"
    if device not in DEVICES:
        return f"device {device!r} is not one of {', '.join(DEVICES)}"
    if device == "cpu" and engine in GPU_ONLY:
        return f"engine {engine} runs on cuda only; the CPU runs engine ort"
    for lib in _NEEDS.get(engine, ()):
        if not _has(lib):
            return f"engine {engine} needs the Python package '{lib}' (pip install poolpipe[gpu])"
    if "torch" in _NEEDS.get(engine, ()):
        problem = _torch_cuda_problem()
        if problem:
            return f"engine {engine} needs PyTorch with CUDA: {problem}"
    chain = _ORT_CHAIN.get((engine, device))
    both = onnxruntime_distributions()
    if chain and len(both) > 1:
        return (f"engine {engine} needs one ONNX Runtime, and {' and '.join(f'{k} {v}' for k, v in both.items())} "
                "are both installed (one module); pip uninstall -y onnxruntime onnxruntime-gpu, then install "
                "poolpipe[gpu] or poolpipe[cpu]")
    if chain and chain[0] not in _ort_providers():
        return (f"engine {engine} on {device} needs onnxruntime with {chain[0]} (this onnxruntime has "
                f"{', '.join(_ort_providers())}; pip install onnxruntime-gpu)")
    return None


def default_engine(device: str) -> str:
    """The engine used when none is named: on cuda native TensorRT, else ORT's TensorRT provider, else ORT
    CUDA, else onnx2torch (the first that can run); EngineError, naming each engine's problem, when none can:
    a GPU never falls back to the CPU unasked. ``ort`` on the CPU."""
    if device != "cuda":
        return "ort"
    problems = []
    for engine in ("trt", "ort-trt", "ort", "torch"):
        problem = engine_problem(engine, device)
        if problem is None:
            return engine
        problems.append(problem)
    raise EngineError("no GPU engine can run here: " + "; ".join(problems))


def open_engine(model: str | bytes, engine: str, device: str = "cpu", device_id: int = 0, threads: int = 0,
                inter_threads: int = 1, max_batch: int = 64, shapes: dict[str, list[int]] | None = None) -> Engine:
    """Load ``model`` (an ONNX file path or serialized ONNX bytes) on ``engine``; EngineError if it cannot, or if
    what runs it is not what was asked. ``max_batch``: the largest batch a TensorRT profile covers; ``shapes``:
    input name -> dims after the batch, for dynamic dimensions TensorRT must know."""
    problem = engine_problem(engine, device)
    if problem:
        raise EngineError(problem)
    if engine in ("ort", "ort-trt"):
        chain = _ORT_CHAIN[(engine, device)]
        options = _trt_provider_options(model, max_batch, shapes, device_id) if engine == "ort-trt" else {}
        return _OrtEngine(model, chain, device_id, threads, inter_threads, options, max_batch)
    if engine == "torch":
        return _TorchEngine(model, device_id)
    trt = _trt_module()
    data = model if isinstance(model, bytes) else Path(model).read_bytes()
    try:
        return trt.TrtEngine(data, device_id, max_batch, shapes)
    except trt.TrtError as e:
        raise EngineError(str(e)) from None


def _trt_module() -> Any:
    """engine_trt.py from beside this file (the package's, or the copy in a partition's version directory)."""
    name, path = f"{__name__}_trt", Path(__file__).with_name("engine_trt.py")
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        if not path.is_file() or spec is None or spec.loader is None:
            raise EngineError(f"{path} is missing: 'poolpipe generate' copies engine_trt.py beside engines.py; "
                              "re-generate the model repository")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def _trt_provider_options(model: str | bytes, max_batch: int, shapes: dict[str, list[int]] | None,
                          device_id: int) -> dict[str, Any]:
    """ORT's TensorRT provider options: profile shapes and engine/timing caches keyed as native TensorRT's."""
    trt = _trt_module()
    proto = _onnx_model(model)
    weights = {t.name for t in proto.graph.initializer}
    inputs = {i.name: tuple((d.dim_value if d.HasField("dim_value") else -1) for d in i.type.tensor_type.shape.dim)
              for i in proto.graph.input if i.name not in weights}
    import onnxruntime as ort

    data = model if isinstance(model, bytes) else Path(model).read_bytes()
    try:
        return trt.ort_trt_options(inputs, max_batch, shapes, trt.cache_key(data, _gpu_name(device_id),
                                                                            f"ort{ort.__version__}", 1, max_batch),
                                   device_id)
    except trt.TrtError as e:
        raise EngineError(str(e)) from None


def _gpu_name(device_id: int) -> str:
    """The name of CUDA device ``device_id`` as NVML reports it (through CUDA_VISIBLE_DEVICES), for cache keys."""
    try:
        import pynvml  # type: ignore[import-not-found]

        visible = [v for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
        which = visible[device_id] if device_id < len(visible) else str(device_id)
        pynvml.nvmlInit()
        try:
            handle = (pynvml.nvmlDeviceGetHandleByIndex(int(which)) if which.isdigit()
                      else pynvml.nvmlDeviceGetHandleByUUID(which))
            name = pynvml.nvmlDeviceGetName(handle)
            return name.decode() if isinstance(name, bytes) else str(name)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no pynvml or no driver: the key still separates devices by index
        return f"cuda{device_id}"


def _onnx_model(model: str | bytes) -> Any:
    import onnx

    return onnx.load_from_string(model) if isinstance(model, bytes) else onnx.load(model)


def _graph_io(proto: Any) -> tuple[list[str], list[str]]:
    weights = {t.name for t in proto.graph.initializer}
    return [i.name for i in proto.graph.input if i.name not in weights], [o.name for o in proto.graph.output]


def _preload_gpu_libraries(ort: Any, provider: str) -> None:
    """Load the CUDA, cuDNN and TensorRT libraries of pip's nvidia-* and tensorrt wheels, which ONNX Runtime's
    providers do not find on the loader's path by themselves. Where that fails, the session runs on another
    provider and is refused with its name (``_OrtEngine``), so nothing is hidden here."""
    if hasattr(ort, "preload_dlls"):  # onnxruntime >= 1.21: CUDA and cuDNN from the nvidia-* wheels
        try:
            ort.preload_dlls()
        except Exception:  # noqa: BLE001 - the provider check below names what ran instead
            pass
    if provider == "TensorrtExecutionProvider" and _has("tensorrt"):
        import tensorrt  # noqa: F401 - its import loads libnvinfer from the tensorrt wheel for the provider


class _OrtEngine(Engine):
    """An ONNX Runtime session on a provider chain, sequential execution; refused unless the chain's first
    provider is the session's first (what runs the model)."""

    def __init__(self, model: str | bytes, chain: list[str], device_id: int, threads: int, inter: int,
                 first_options: dict[str, Any], max_batch: int) -> None:
        import onnxruntime as ort

        if chain[0] != "CPUExecutionProvider":
            _preload_gpu_libraries(ort, chain[0])
        so = ort.SessionOptions()
        so.log_severity_level = 3
        if threads:
            so.intra_op_num_threads = threads
        so.inter_op_num_threads = inter
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        providers = [p if p == "CPUExecutionProvider" else (p, {"device_id": device_id, **(first_options if i == 0
                                                                                            else {})})
                     for i, p in enumerate(chain) if p in _ort_providers()]
        try:
            self.session = ort.InferenceSession(model, sess_options=so, providers=providers)
        except Exception as e:  # noqa: BLE001 - onnxruntime raises several types for a model it cannot load
            raise EngineError(f"onnxruntime cannot load the model: {str(e).splitlines()[0]}") from None
        self.providers = list(self.session.get_providers())
        if not self.providers or self.providers[0] != chain[0]:
            raise EngineError(f"asked onnxruntime {ort.__version__} for {chain[0]}, but the session runs on "
                              f"{', '.join(self.providers) or 'nothing'}: its libraries did not load (CUDA, cuDNN or "
                              "TensorRT of the versions this onnxruntime needs); install onnxruntime-gpu for this "
                              "CUDA, or ask for the CPU by name")
        self.max_batch = max_batch if chain[0] == "TensorrtExecutionProvider" else 0
        self.inputs = [i.name for i in self.session.get_inputs()]
        self.outputs = [o.name for o in self.session.get_outputs()]
        self.description = "onnxruntime " + ",".join(self.providers)

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        if self.max_batch:  # TensorRT's profile ends there; beyond it the provider would rebuild mid-serving
            batch = max((x.shape[0] for x in feeds.values() if x.ndim), default=1)
            if batch > self.max_batch:
                raise EngineError(f"batch {batch} is over the TensorRT profile (1..{self.max_batch})")
        return self.session.run(self.outputs, feeds)


class _TorchEngine(Engine):
    """The model converted with onnx2torch on one CUDA device; inputs copied in, outputs out, synchronised."""

    def __init__(self, model: str | bytes, device_id: int) -> None:
        import onnx2torch
        import torch

        if not torch.cuda.is_available():
            raise EngineError("engine torch needs a CUDA device visible to PyTorch")
        proto = _onnx_model(model)
        self.inputs, self.outputs = _graph_io(proto)
        self.torch = torch
        self.device = torch.device("cuda", device_id)
        self.module = onnx2torch.convert(proto).to(self.device).eval()
        self.providers = [f"torch {torch.__version__} cuda {torch.version.cuda}"]
        self.description = f"onnx2torch on {self.device} ({torch.cuda.get_device_name(self.device)})"

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        torch = self.torch
        with torch.inference_mode():
            out = self.module(*(torch.from_numpy(np.ascontiguousarray(feeds[n])).to(self.device)
                                for n in self.inputs))
            outs = out if isinstance(out, (list, tuple)) else [out]
            torch.cuda.synchronize(self.device)
            return [o.cpu().numpy() for o in outs]
