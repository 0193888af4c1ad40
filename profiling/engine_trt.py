"""TensorRT for the engine module (profiling.engines): the native engine, ONNX Runtime's TensorRT provider options,
the optimisation profile's shapes and the on-disk engine and timing caches.

Loaded by engines.py from beside itself (by path), in the profiler and inside tritonserver, where ``poolpipe
generate`` copies it next to model.py; so it imports nothing of the project, and tensorrt/torch only when an
engine is opened. An engine is built once per (partition hash, GPU name, TensorRT version, batch range,
precision), the cache key, and kept under the cache directory ($POOLPIPE_ENGINE_CACHE, else
~/.cache/poolpipe/engines); the timing cache is shared by every build on one GPU name and TensorRT version. A
server that loads a partition again, or V servers of one GPU type, deserialise instead of building.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

# TensorRT's builder workspace cap: profiling.block_memory.ENGINE_WORKSPACE_BYTES counts it per vGPU (equal, tested)
WORKSPACE_BYTES = 256 << 20
PRECISION = "fp32"  # the builder's precision: no FP16/INT8 flags (an fp16 boundary tensor stays fp16 as typed)


class TrtError(RuntimeError):
    """A TensorRT call that failed; engines.py turns it into an EngineError."""


def cache_dir() -> Path:
    """Where engines and timing caches are kept: $POOLPIPE_ENGINE_CACHE, else ~/.cache/poolpipe/engines, else
    (an unwritable home, as in some containers) the temporary directory."""
    env = os.environ.get("POOLPIPE_ENGINE_CACHE")
    home_cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    base = Path(env) if env else home_cache / "poolpipe" / "engines"
    try:
        base.mkdir(parents=True, exist_ok=True)
        if os.access(base, os.W_OK):
            return base
    except OSError:
        pass
    fallback = Path(tempfile.gettempdir()) / "poolpipe-engines"
    fallback.mkdir(parents=True, exist_ok=True)
    return fallback


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "_", text).strip("_") or "x"


def cache_key(model: bytes, gpu_name: str, trt_version: str, min_batch: int, max_batch: int,
              precision: str = PRECISION) -> str:
    """The name of an engine in the cache: everything that changes what TensorRT builds."""
    digest = hashlib.sha256(model).hexdigest()[:20]
    return f"{digest}-{_safe(gpu_name)}-trt{_safe(trt_version)}-b{min_batch}-{max_batch}-{precision}"


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``path`` so that a concurrent reader (another server building the same engine) never sees half."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def profile_shapes(name: str, shape: tuple[int, ...], max_batch: int, known: dict[str, list[int]] | None
                   ) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """(min, opt, max) shapes of one input for an optimisation profile: the first dimension is the batch (1 ..
    max_batch) where dynamic; every other dynamic dimension takes its size from ``known`` (the config's dims after
    the batch) or the input is refused."""
    if not shape:
        return (), (), ()
    rest = list(shape[1:])
    dims = (known or {}).get(name)
    for i, d in enumerate(rest):
        if d is None or d < 0:
            if dims is None or i >= len(dims) or dims[i] < 1:
                raise TrtError(f"input {name!r} has a dynamic dimension {i + 1} (shape {list(shape)}); TensorRT needs "
                               "its size: export the model with fixed sizes after the batch, or give the config's dims")
            rest[i] = int(dims[i])
    if shape[0] is not None and shape[0] >= 1:  # a fixed batch dimension: one shape
        fixed = (int(shape[0]), *rest)
        return fixed, fixed, fixed
    return (1, *rest), (max(1, max_batch // 2), *rest), (max_batch, *rest)


def _shape_text(shapes: dict[str, tuple[int, ...]]) -> str:
    return ",".join(f"{n}:{'x'.join(map(str, s))}" for n, s in shapes.items())


def ort_trt_options(inputs: dict[str, tuple[int, ...]], max_batch: int, known: dict[str, list[int]] | None,
                    key: str, device_id: int) -> dict[str, Any]:
    """ONNX Runtime's TensorRT provider options: explicit profile shapes (batch 1..max_batch), so it builds once
    and never rebuilds on an unseen batch, and its engine and timing caches under the cache key's directory."""
    prof = {n: profile_shapes(n, s, max_batch, known) for n, s in inputs.items()}
    where = cache_dir() / key
    where.mkdir(parents=True, exist_ok=True)
    return {"device_id": device_id, "trt_max_workspace_size": WORKSPACE_BYTES,
            "trt_engine_cache_enable": True, "trt_engine_cache_path": str(where),
            "trt_timing_cache_enable": True, "trt_timing_cache_path": str(where),
            "trt_profile_min_shapes": _shape_text({n: p[0] for n, p in prof.items()}),
            "trt_profile_opt_shapes": _shape_text({n: p[1] for n, p in prof.items()}),
            "trt_profile_max_shapes": _shape_text({n: p[2] for n, p in prof.items()})}


def check(ok: object, what: str) -> None:
    """TensorRT's setters and execute return False instead of raising: refuse to go on with a wrong shape."""
    if not ok:
        raise TrtError(f"TensorRT {what} failed")


def batch_range(shapes: dict[str, tuple[tuple[int, ...], ...]]) -> tuple[int, int]:
    """(min, max) batch of a profile's shapes."""
    firsts = [p[0][0] for p in shapes.values() if p[0]] or [1]
    lasts = [p[2][0] for p in shapes.values() if p[2]] or [1]
    return max(firsts), min(lasts)


class TrtEngine:
    """A native TensorRT engine of an ONNX model (batch 1..max_batch), built once per cache key; torch holds the
    buffers. Attributes as engines.Engine; ``build_s`` is the seconds spent building (0 when loaded from cache)."""

    def __init__(self, data: bytes, device_id: int, max_batch: int, known: dict[str, list[int]] | None) -> None:
        import tensorrt as trt  # type: ignore[import-not-found]
        import torch

        self.torch, self.trt = torch, trt
        self.device = torch.device("cuda", device_id)
        self.logger = trt.Logger(trt.Logger.ERROR)
        with torch.cuda.device(self.device):
            gpu = torch.cuda.get_device_name(self.device)
            self.engine, self.build_s, self.key, self.max_batch = self._engine(data, gpu, max_batch, known)
            self.context = self.engine.create_execution_context()
            check(self.context is not None, "create_execution_context")
            self.stream = torch.cuda.Stream(self.device)
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        self.inputs = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self.outputs = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT]
        self.providers = [f"TensorRT {trt.__version__}"]
        how = f"built in {self.build_s:.1f} s" if self.build_s else "from the engine cache"
        self.description = f"TensorRT {trt.__version__} on {self.device} ({gpu}), batch 1..{self.max_batch}, {how}"

    def _network(self, data: bytes) -> tuple[Any, Any, Any]:
        trt = self.trt
        builder = trt.Builder(self.logger)
        flags = trt.NetworkDefinitionCreationFlag
        network = builder.create_network(1 << int(flags.EXPLICIT_BATCH) if hasattr(flags, "EXPLICIT_BATCH") else 0)
        parser = trt.OnnxParser(network, self.logger)
        if not parser.parse(data):
            errors = "; ".join(str(parser.get_error(i)) for i in range(min(parser.num_errors, 3)))
            raise TrtError(f"TensorRT cannot parse the model: {errors}")
        return builder, network, parser

    def _engine(self, data: bytes, gpu: str, max_batch: int, known: dict[str, list[int]] | None
                ) -> tuple[Any, float, str, int]:
        trt = self.trt
        builder, network, _parser = self._network(data)
        shapes = {network.get_input(i).name: profile_shapes(network.get_input(i).name,
                                                             tuple(network.get_input(i).shape), max_batch, known)
                  for i in range(network.num_inputs)}
        lo, hi = batch_range(shapes)
        key = cache_key(data, gpu, trt.__version__, lo, hi)
        where = cache_dir()
        runtime = trt.Runtime(self.logger)
        cached = where / f"{key}.engine"
        if cached.is_file():
            engine = runtime.deserialize_cuda_engine(cached.read_bytes())
            if engine is not None:
                return engine, 0.0, key, hi
        config = builder.create_builder_config()
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, WORKSPACE_BYTES)
        prof = builder.create_optimization_profile()
        for name, (mn, opt, mx) in shapes.items():
            prof.set_shape(name, mn, opt, mx)
        check(config.add_optimization_profile(prof) >= 0, "add_optimization_profile")
        timing_file = where / f"timing-{_safe(gpu)}-trt{_safe(trt.__version__)}.cache"
        timing = config.create_timing_cache(timing_file.read_bytes() if timing_file.is_file() else b"")
        check(config.set_timing_cache(timing, ignore_mismatch=False), "set_timing_cache")
        t0 = time.perf_counter()
        plan = builder.build_serialized_network(network, config)
        if plan is None:
            raise TrtError("TensorRT could not build an engine for the model (see its log)")
        took = time.perf_counter() - t0
        write_atomic(cached, bytes(plan))
        write_atomic(timing_file, bytes(config.get_timing_cache().serialize()))
        engine = runtime.deserialize_cuda_engine(plan)
        check(engine is not None, "deserialize_cuda_engine")
        return engine, max(took, 1e-3), key, hi

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        """One inference; copies in, execution and copies out all on the engine's stream, then synchronised."""
        with self.torch.cuda.device(self.device), self.torch.cuda.stream(self.stream):
            return self._run(feeds)

    def _run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        torch, trt, ctx = self.torch, self.trt, self.context
        keep = []
        for n in self.inputs:
            x = np.ascontiguousarray(feeds[n])
            if x.ndim and x.shape[0] > self.max_batch:
                raise TrtError(f"batch {x.shape[0]} is over the engine's optimisation profile (1..{self.max_batch})")
            want = trt.nptype(self.engine.get_tensor_dtype(n))
            if x.dtype != want:
                raise TrtError(f"input {n!r} is {x.dtype}, the engine takes {np.dtype(want)}")
            t = torch.from_numpy(x).to(self.device)
            keep.append(t)
            check(ctx.set_input_shape(n, tuple(t.shape)), f"set_input_shape({n!r}, {tuple(t.shape)})")
            check(ctx.set_tensor_address(n, t.data_ptr()), f"set_tensor_address({n!r})")
        missing = ctx.infer_shapes()
        check(not missing, f"shape inference (inputs without a shape: {missing})")
        outs = []
        for n in self.outputs:
            dtype = torch.from_numpy(np.zeros(1, dtype=trt.nptype(self.engine.get_tensor_dtype(n)))).dtype
            y = torch.empty(tuple(ctx.get_tensor_shape(n)), dtype=dtype, device=self.device)
            outs.append(y)
            check(ctx.set_tensor_address(n, y.data_ptr()), f"set_tensor_address({n!r})")
        check(ctx.execute_async_v3(self.stream.cuda_stream), "execute_async_v3")
        self.stream.synchronize()
        return [y.cpu().numpy() for y in outs]
