"""Triton ``config.pbtxt`` for partition models and ensembles, built as ``ModelConfig`` protobufs.

Partition models run the poolpipe partition backend (``backends/partition/model.py``, a Python-based
backend); emulated partitions may run the native ``poolpipe_emulated`` backend instead (``backends/native/``,
its library copied into the version directory, where Triton looks first). poolpipe's own deployments have no
``dynamic_batching``: the sidecar forms every batch. The Triton-only baselines in ``ensembles/`` add Triton's
dynamic batcher.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from backends import native
from backends.partition import BACKEND_FILES, MODEL_PY  # noqa: F401 - MODEL_PY re-exported for tests
from poolpipe_common.errors import InputError
from poolpipe_common.tensors import TensorSpec

# Extra outputs of every partition model (see backends/partition/model.py): wall-clock ns of the engine run.
COMPUTE_START_OUTPUT = "POOLPIPE_COMPUTE_START_NS"
COMPUTE_END_OUTPUT = "POOLPIPE_COMPUTE_END_NS"
TIMING_OUTPUTS = (COMPUTE_START_OUTPUT, COMPUTE_END_OUTPUT)
KINDS = ("KIND_CPU", "KIND_GPU")
EMULATED_BACKENDS = ("python", native.BACKEND)  # the backends that emulate a device


@dataclass(frozen=True)
class DynamicBatching:
    """Triton's dynamic batcher settings (only for the Triton-only baselines)."""

    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_delay_us: int = 0


@dataclass(frozen=True)
class EmulatedSettings:
    """An emulated device's parameters (backends/partition/emulated.py): the partition's profiled latency on
    its (GPU type, vGPU level) per batch, its stage index (mixed into the checksum) and latency noise; ``backend``
    serves it: the Python partition backend or the native one (same parameters, same device)."""

    latency_us: tuple[tuple[int, float], ...]  # (batch, µs)
    stage: int
    latency_cv: float = 0.0
    # (levels, ((batch, latencies at the levels), ...)): the distribution of a variable-latency model, if profiled
    quantiles_us: tuple[tuple[float, ...], tuple[tuple[int, tuple[float, ...]], ...]] | None = None
    backend: str = "python"

    def __post_init__(self) -> None:
        if self.backend not in EMULATED_BACKENDS:
            raise ValueError(f"emulated backend {self.backend!r}: expected one of {', '.join(EMULATED_BACKENDS)}")

    def parameters(self) -> dict[str, str]:
        out = {"engine": "emulated",
               "emulated_latency_us": json.dumps({str(b): round(us, 3) for b, us in sorted(self.latency_us)}),
               "emulated_stage": str(self.stage), "emulated_latency_cv": f"{self.latency_cv:g}"}
        if self.quantiles_us is not None:
            levels, table = self.quantiles_us
            out["emulated_latency_quantiles_us"] = json.dumps(
                {"levels": list(levels), "latency_us": {str(b): [round(x, 3) for x in q] for b, q in sorted(table)}})
        return out


def emulated_backend(choice: str) -> str:
    """``--emulated-backend``: auto (native where it builds, else python, with one log line), native (an error
    where it cannot build) or python -> the config.pbtxt ``backend`` of emulated partitions."""
    if choice not in ("auto", "native", "python"):
        raise InputError(f"--emulated-backend {choice!r}: expected auto, native or python")
    if choice == "python":
        return "python"
    if native.library() is not None:
        return native.BACKEND
    if choice == "native":
        raise InputError(f"--emulated-backend native: the {native.BACKEND} backend could not be built here (the "
                         "log line above says why; it needs a C compiler, $CC or cc); use --emulated-backend python")
    return "python"


@dataclass(frozen=True)
class BackendSettings:
    """The partition backend's config ``parameters`` (see backends/partition/model.py)."""

    onnx_file: str = "model.onnx"
    engine: str = "auto"  # auto or a name of profiling/engines.py (ort, ort-trt, trt, torch)
    intra_op_threads: int = 0
    inter_op_threads: int = 1
    mps_thread_percentage: int = 0
    emulate_slowdown: float = 1.0  # CPU hosts emulating a slower device class (see the backend's docstring)
    emulated: EmulatedSettings | None = None  # an emulated device instead of an engine (no ONNX file)
    device: str = ""  # "cpu": the engine runs on the CPU although the instance is KIND_GPU (asked for by name)

    def parameters(self) -> dict[str, str]:
        common = {"intra_op_threads": str(self.intra_op_threads), "inter_op_threads": str(self.inter_op_threads),
                  "mps_thread_percentage": str(self.mps_thread_percentage)}
        if self.emulated is not None:
            return {**common, **self.emulated.parameters()}
        return {"onnx_file": self.onnx_file, "engine": self.engine, **common,
                "emulate_slowdown": f"{self.emulate_slowdown:g}", **({"device": self.device} if self.device else {})}


def _tensor(t: mc.ModelInput | mc.ModelOutput, spec: TensorSpec) -> None:
    t.name = spec.name
    t.data_type = mc.DataType.Value(f"TYPE_{spec.datatype}")
    t.dims.extend(spec.shape)


def partition_config(name: str, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec], max_batch_size: int,
                     kind: str = "KIND_CPU", gpu: int | None = None, settings: BackendSettings = BackendSettings(),
                     dynamic_batching: DynamicBatching | None = None, timing_outputs: bool = True
                     ) -> mc.ModelConfig:
    """A partition model: python backend, ``max_batch_size``, one instance on one GPU (or the CPU)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if kind == "KIND_GPU" and gpu is None:
        raise ValueError("KIND_GPU needs a gpu index")
    if max_batch_size < 1:
        raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
    backend = settings.emulated.backend if settings.emulated is not None else "python"
    cfg = mc.ModelConfig(name=name, backend=backend, max_batch_size=max_batch_size)
    for spec in inputs:
        _tensor(cfg.input.add(), spec)
    for spec in outputs:
        _tensor(cfg.output.add(), spec)
    if timing_outputs:
        for n in TIMING_OUTPUTS:
            _tensor(cfg.output.add(), TensorSpec(n, "INT64", (1,)))
    group = cfg.instance_group.add()
    group.count = 1
    group.kind = mc.ModelInstanceGroup.Kind.Value(kind)
    if kind == "KIND_GPU":
        group.gpus.append(gpu)
    for k, v in settings.parameters().items():
        cfg.parameters[k].string_value = v
    if dynamic_batching is not None:
        cfg.dynamic_batching.preferred_batch_size.extend(dynamic_batching.preferred_batch_sizes)
        cfg.dynamic_batching.max_queue_delay_microseconds = dynamic_batching.max_queue_delay_us
    add_warmup(cfg, inputs, max_batch_size)
    return cfg


def add_warmup(cfg: mc.ModelConfig, inputs: Sequence[TensorSpec], max_batch_size: int) -> None:
    """Triton's ``model_warmup``: run batch 1 and the largest batch once at load, so that the first
    served requests do not pay for the engine's first runs (and do not mislead the scheduler's timings).
    Inputs with variable dimensions (-1) cannot be synthesised, so such models get no warm-up."""
    if any(d < 0 for spec in inputs for d in spec.shape):
        return
    for batch in sorted({1, max_batch_size}):
        w = cfg.model_warmup.add(name=f"warmup_batch{batch}", batch_size=batch)
        for spec in inputs:
            t = w.inputs[spec.name]
            t.data_type = mc.DataType.Value(f"TYPE_{spec.datatype}")
            t.dims.extend(spec.shape)
            t.random_data = True


def ensemble_config(name: str, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec], max_batch_size: int,
                    steps: Sequence[tuple[str, Mapping[str, str], Mapping[str, str]]]) -> mc.ModelConfig:
    """A Triton ensemble; ``steps`` are (model name, input_map, output_map) with model tensor -> ensemble tensor."""
    cfg = mc.ModelConfig(name=name, platform="ensemble", max_batch_size=max_batch_size)
    for spec in inputs:
        _tensor(cfg.input.add(), spec)
    for spec in outputs:
        _tensor(cfg.output.add(), spec)
    for model, in_map, out_map in steps:
        step = cfg.ensemble_scheduling.step.add()
        step.model_name = model
        step.model_version = -1
        for k, v in in_map.items():
            step.input_map[k] = v
        for k, v in out_map.items():
            step.output_map[k] = v
    return cfg


def config_text(cfg: mc.ModelConfig) -> str:
    return text_format.MessageToString(cfg)


def parse_config(path: str | Path) -> mc.ModelConfig:
    """Read a config.pbtxt back into a ModelConfig (InputError naming the file if it does not parse)."""
    p = Path(path)
    try:
        return text_format.Parse(p.read_text(), mc.ModelConfig())
    except OSError as e:
        raise InputError(f"cannot read {p}: {e.strerror or e}") from None
    except text_format.ParseError as e:
        raise InputError(f"{p} is not a valid Triton model config: {e}") from None


def _link_or_copy(src: Path, dst: Path) -> None:
    dst.unlink(missing_ok=True)
    try:
        dst.hardlink_to(src)
    except OSError:
        shutil.copyfile(src, dst)


def write_model(repository: Path, cfg: mc.ModelConfig, onnx_file: Path | None = None) -> Path:
    """Write ``<repository>/<name>/config.pbtxt`` (+ for python models ``1/model.py`` with the modules it loads
    from beside it, and ``1/<onnx>`` when given; for native emulated ones the backend library in ``1/``)."""
    model_dir = repository / cfg.name
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.pbtxt").write_text(config_text(cfg))
    if cfg.backend == "python":
        version = model_dir / "1"
        version.mkdir(exist_ok=True)
        for f in BACKEND_FILES:
            shutil.copyfile(f, version / f.name)
        if onnx_file is not None:
            _link_or_copy(Path(onnx_file), version / cfg.parameters["onnx_file"].string_value)
    elif cfg.backend == native.BACKEND:
        lib = native.library()
        if lib is None:
            raise InputError(f"model {cfg.name}: the native {native.BACKEND} backend could not be built here (see the "
                             "log line above); generate with --emulated-backend python")
        (model_dir / "1").mkdir(exist_ok=True)
        _link_or_copy(lib, model_dir / "1" / native.LIBRARY)
    elif cfg.platform == "ensemble":
        (model_dir / "1").mkdir(exist_ok=True)
    return model_dir
