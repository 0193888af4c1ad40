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
every output in ``engine.outputs`` order (GPU engines synchronise, so wall time is compute time).
"""

from __future__ import annotations

import importlib.util
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
    """One loaded model: ``inputs`` and ``outputs`` are its tensor names, ``description`` what runs it."""

    inputs: list[str]
    outputs: list[str]
    description: str

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        raise NotImplementedError


def _ort_providers() -> list[str]:
    import onnxruntime as ort

    return list(ort.get_available_providers())


def _has(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


def engine_problem(engine: str, device: str) -> str | None:
    """Why ``engine`` cannot run on ``device`` here (missing package or provider), or None if it can.
    Whether a GPU is present at all is the caller's check."""
    if engine not in ENGINES:
        return f"engine {engine!r} is not one of {', '.join(ENGINES)}"
    if device not in DEVICES:
        return f"device {device!r} is not one of {', '.join(DEVICES)}"
    if device == "cpu" and engine in GPU_ONLY:
        return f"engine {engine} runs on cuda only; the CPU runs engine ort"
    for lib in _NEEDS.get(engine, ()):
        if not _has(lib):
            return f"engine {engine} needs the Python package '{lib}' (pip install poolpipe[gpu])"
    chain = _ORT_CHAIN.get((engine, device))
    if chain and chain[0] not in _ort_providers():
        return (f"engine {engine} on {device} needs onnxruntime with {chain[0]} (this onnxruntime has "
                f"{', '.join(_ort_providers())}; pip install onnxruntime-gpu)")
    return None


def default_engine(device: str) -> str:
    """The engine used when none is named: on cuda native TensorRT, else ORT's TensorRT provider, else ORT
    CUDA, else onnx2torch (the first that can run); ``ort`` on the CPU and when nothing else can."""
    if device == "cuda":
        for engine in ("trt", "ort-trt", "ort", "torch"):
            if engine_problem(engine, device) is None:
                return engine
    return "ort"


def open_engine(model: str | bytes, engine: str, device: str = "cpu", device_id: int = 0, threads: int = 0,
                inter_threads: int = 1, max_batch: int = 64) -> Engine:
    """Load ``model`` (an ONNX file path or serialized ONNX bytes) on ``engine``; EngineError if it cannot."""
    problem = engine_problem(engine, device)
    if problem:
        raise EngineError(problem)
    if engine in ("ort", "ort-trt"):
        return _OrtEngine(model, _ORT_CHAIN[(engine, device)], device_id, threads, inter_threads)
    if engine == "torch":
        return _TorchEngine(model, device_id)
    return _TrtEngine(model, device_id, max_batch)


def _onnx_model(model: str | bytes) -> Any:
    import onnx

    return onnx.load_from_string(model) if isinstance(model, bytes) else onnx.load(model)


def _graph_io(proto: Any) -> tuple[list[str], list[str]]:
    weights = {t.name for t in proto.graph.initializer}
    return [i.name for i in proto.graph.input if i.name not in weights], [o.name for o in proto.graph.output]


class _OrtEngine(Engine):
    """An ONNX Runtime session on a provider chain, sequential execution."""

    def __init__(self, model: str | bytes, chain: list[str], device_id: int, threads: int, inter: int) -> None:
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.log_severity_level = 3
        if threads:
            so.intra_op_num_threads = threads
        so.inter_op_num_threads = inter
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        providers = [p if p == "CPUExecutionProvider" else (p, {"device_id": device_id})
                     for p in chain if p in _ort_providers()]
        try:
            self.session = ort.InferenceSession(model, sess_options=so, providers=providers)
        except Exception as e:  # noqa: BLE001 - onnxruntime raises several types for a model it cannot load
            raise EngineError(f"onnxruntime cannot load the model: {str(e).splitlines()[0]}") from None
        self.inputs = [i.name for i in self.session.get_inputs()]
        self.outputs = [o.name for o in self.session.get_outputs()]
        self.description = "onnxruntime " + ",".join(self.session.get_providers())

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
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
        self.description = f"onnx2torch on {self.device}"

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        torch = self.torch
        with torch.inference_mode():
            out = self.module(*(torch.from_numpy(np.ascontiguousarray(feeds[n])).to(self.device)
                                for n in self.inputs))
            outs = out if isinstance(out, (list, tuple)) else [out]
            torch.cuda.synchronize(self.device)
            return [o.cpu().numpy() for o in outs]


class _TrtEngine(Engine):
    """A native TensorRT engine built from the ONNX model (batch 1..max_batch); torch holds the buffers."""

    def __init__(self, model: str | bytes, device_id: int, max_batch: int) -> None:
        import tensorrt as trt  # type: ignore[import-not-found]
        import torch

        data = model if isinstance(model, bytes) else Path(model).read_bytes()
        self.torch, self.trt = torch, trt
        self.device = torch.device("cuda", device_id)
        logger = trt.Logger(trt.Logger.ERROR)
        builder = trt.Builder(logger)
        flags = trt.NetworkDefinitionCreationFlag
        network = builder.create_network(1 << int(flags.EXPLICIT_BATCH) if hasattr(flags, "EXPLICIT_BATCH") else 0)
        parser = trt.OnnxParser(network, logger)
        if not parser.parse(data):
            raise EngineError(f"TensorRT cannot parse the model: {parser.get_error(0)}")
        config = builder.create_builder_config()
        prof = builder.create_optimization_profile()
        for i in range(network.num_inputs):
            t = network.get_input(i)
            rest = tuple(t.shape)[1:]
            prof.set_shape(t.name, (1, *rest), (max(1, max_batch // 2), *rest), (max_batch, *rest))
        config.add_optimization_profile(prof)
        with torch.cuda.device(self.device):
            plan = builder.build_serialized_network(network, config)
            if plan is None:
                raise EngineError("TensorRT could not build an engine for the model")
            self.engine = trt.Runtime(logger).deserialize_cuda_engine(plan)
            self.context = self.engine.create_execution_context()
            self.stream = torch.cuda.Stream(self.device)
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        self.inputs = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self.outputs = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT]
        self.description = f"TensorRT {trt.__version__} on {self.device}"

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        torch, trt = self.torch, self.trt
        keep = []
        for n in self.inputs:
            x = torch.from_numpy(np.ascontiguousarray(feeds[n])).to(self.device)
            keep.append(x)
            self.context.set_input_shape(n, tuple(x.shape))
            self.context.set_tensor_address(n, x.data_ptr())
        outs = []
        for n in self.outputs:
            dtype = torch.from_numpy(np.zeros(1, dtype=trt.nptype(self.engine.get_tensor_dtype(n)))).dtype
            y = torch.empty(tuple(self.context.get_tensor_shape(n)), dtype=dtype, device=self.device)
            outs.append(y)
            self.context.set_tensor_address(n, y.data_ptr())
        self.context.execute_async_v3(self.stream.cuda_stream)
        self.stream.synchronize()
        return [y.cpu().numpy() for y in outs]
