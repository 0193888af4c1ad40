"""poolpipe partition backend: a Triton Python-backend model that runs one ONNX partition or emulates a device.

Copied as ``<repository>/<model>/1/model.py`` by ``poolpipe generate`` (and by ``ensembles/``), with
``engines.py`` (the engines, shared with the profiler) and ``emulated.py`` (the emulated device) beside
it. It reads its settings from the ``parameters`` of its config.pbtxt:

==========================  =====================================================================
``engine``                  ``auto`` (default), ``ort``, ``ort-trt``, ``trt``, ``torch`` (see engines.py; the
                            device is the instance's kind: KIND_GPU -> cuda, KIND_CPU -> cpu), or
                            ``emulated`` (no engine: hold each batch for its profiled latency). ``auto`` on
                            KIND_GPU takes the first GPU engine that runs here, or fails to load naming each
                            engine's problem: never the CPU. ``poolpipe generate`` writes the engine the
                            profile measured.
``device``                  ``cpu``: run the engine (``ort``) on the CPU although the instance is KIND_GPU, only
                            where asked for by name (``generate --engine TYPE=cpu``); empty: the instance's kind
``onnx_file``               ONNX file, relative to the version directory (default ``model.onnx``)
``intra_op_threads``        ONNX Runtime intra-op threads (0 = ONNX Runtime's default)
``inter_op_threads``        ONNX Runtime inter-op threads (default 1)
``mps_thread_percentage``   sets ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` before CUDA starts (0 = leave as is)
``emulate_slowdown``        K >= 1 (default 1): after each engine run, stay busy (sleeping) for (K-1)·t
                            more, t the fastest run seen at that batch size, so a CPU host emulates a
                            device K times slower without spending K times the CPU (the demo's "old
                            GPU" class; ``profile measure --emulate-slowdown K`` records K x the time)
``emulated_latency_us``     engine ``emulated``: JSON batch -> µs of this partition on its (GPU type,
                            vGPU level), from the plan's profile; other batches interpolated
``emulated_stage``          engine ``emulated``: the stage index, mixed into the outputs' checksum
``emulated_latency_quantiles_us``
                            engine ``emulated``, optional: JSON {"levels": [...], "latency_us": {batch: [...]}},
                            the partition's latency distribution (a variable-latency model): each batch is held
                            for the latency at the largest of its requests' uniformly drawn levels
``emulated_latency_cv``     engine ``emulated``: coefficient of variation of lognormal latency noise (0 = none)
``emulated_seed``           engine ``emulated``: seed of that noise (empty = fresh each load)
==========================  =====================================================================

Every request gets, besides the partition's outputs, two extra outputs for the scheduler's feedback:
``POOLPIPE_COMPUTE_START_NS`` and ``POOLPIPE_COMPUTE_END_NS``, INT64 with config dims ``[1]`` (so
``[batch, 1]`` on the wire, every row equal): the wall-clock time (``time.time_ns()``, ns since the
Unix epoch) when the engine run that computed this request began and ended. All requests handed to
one ``execute`` call are concatenated along the batch axis and computed in one engine run. A request
that cannot be computed gets a ``TritonError`` response; the model keeps serving.
"""

import os
import sys

# The Python backend stub ignores PYTHONPATH for its sys.path; take it from the environment explicitly
# (before numpy/onnxruntime are imported) so that the server's interpreter packages are found.
for _p in reversed([p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import importlib.util  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402

COMPUTE_START_OUTPUT = "POOLPIPE_COMPUTE_START_NS"
COMPUTE_END_OUTPUT = "POOLPIPE_COMPUTE_END_NS"
TIMING_OUTPUTS = (COMPUTE_START_OUTPUT, COMPUTE_END_OUTPUT)
# The config parameters this backend reads (the table above); any other is ignored, with a warning at load.
PARAMETERS = ("engine", "device", "onnx_file", "intra_op_threads", "inter_op_threads", "mps_thread_percentage",
              "emulate_slowdown", "emulated_latency_us", "emulated_stage", "emulated_latency_quantiles_us",
              "emulated_latency_cv", "emulated_seed")

_NUMPY_TYPES = {
    "TYPE_FP32": np.float32, "TYPE_FP16": np.float16, "TYPE_FP64": np.float64, "TYPE_INT64": np.int64,
    "TYPE_INT32": np.int32, "TYPE_INT8": np.int8, "TYPE_UINT8": np.uint8, "TYPE_BOOL": np.bool_,
}


def _parameters(config):
    """config.pbtxt ``parameters`` as a plain dict of strings."""
    return {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}


def _number(params, key, default, kind=int):
    raw = params.get(key, "")
    if raw == "":
        return default
    try:
        return kind(raw)
    except ValueError:
        raise ValueError(f"config parameter {key}={raw!r} is not {'an integer' if kind is int else 'a number'}"
                         ) from None


def _sibling(version_dir, name):
    """Load ``name.py`` from the version directory (copied beside model.py by poolpipe generate)."""
    path = os.path.join(version_dir, f"{name}.py")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} is missing: 'poolpipe generate' copies {name}.py beside model.py; "
                                "re-generate the model repository")
    spec = importlib.util.spec_from_file_location(f"poolpipe_partition_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _open_engine(engines, args, params, version_dir, max_batch, shapes):
    """The configured engine on this instance's device. A GPU instance runs a GPU engine or fails to load with
    the engine's problem (the missing library); the CPU only where the ``device`` parameter names it."""
    path = os.path.join(version_dir, params.get("onnx_file", "") or "model.onnx")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"ONNX partition {path} not found (config parameter onnx_file)")
    device = "cuda" if args.get("model_instance_kind", "CPU") == "GPU" else "cpu"
    asked = params.get("device", "")
    if asked not in ("", "cpu"):
        raise ValueError(f"config parameter device={asked!r}: only 'cpu' (a CPU engine asked for by name) or empty")
    device = asked or device
    engine = params.get("engine", "") or "auto"
    if engine == "auto":
        engine = engines.default_engine(device)  # EngineError naming every GPU engine's problem: no silent CPU
    elif engine not in engines.ENGINES:
        raise ValueError(f"config parameter engine={engine!r} is not one of auto, emulated, "
                         f"{', '.join(engines.ENGINES)}")
    return engines.open_engine(path, engine, device, int(args.get("model_instance_device_id", 0) or 0),
                               _number(params, "intra_op_threads", 0), _number(params, "inter_op_threads", 1),
                               max_batch, shapes)


def _open_emulated(emulated, params, outputs):
    """The emulated device of this partition from its ``emulated_*`` parameters."""
    table = emulated.parse_latency_table(params.get("emulated_latency_us", ""))
    seed = params.get("emulated_seed", "")
    return emulated.EmulatedDevice(table, _number(params, "emulated_stage", 0),
                                   outputs, _number(params, "emulated_latency_cv", 0.0, float),
                                   int(seed) if seed else None,
                                   emulated.parse_quantile_table(params.get("emulated_latency_quantiles_us", "")))


class TritonPythonModel:
    """Runs one ONNX partition (or emulates its device); one engine run per ``execute`` call."""

    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = _parameters(config)
        mps = _number(params, "mps_thread_percentage", 0)
        if mps:
            if not 1 <= mps <= 100:
                raise ValueError(f"config parameter mps_thread_percentage={mps} must be 1..100")
            os.environ["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(mps)  # before any CUDA context exists
        self.inputs = [(t["name"], _NUMPY_TYPES[t["data_type"]], [int(d) for d in t["dims"]])
                       for t in config["input"]]
        outputs = [(t["name"], _NUMPY_TYPES[t["data_type"]], [int(d) for d in t["dims"]])
                   for t in config["output"] if t["name"] not in TIMING_OUTPUTS]
        self.outputs = [name for name, _, _ in outputs]
        self.timing = [t["name"] for t in config["output"] if t["name"] in TIMING_OUTPUTS]
        self.logger = pb_utils.Logger
        unknown = sorted(set(params) - set(PARAMETERS))
        if unknown:
            self.logger.log_warn(f"poolpipe partition {args['model_name']}: config parameter(s) {', '.join(unknown)} "
                                 f"ignored: this backend reads {', '.join(PARAMETERS)}")
        version_dir = os.path.join(args["model_repository"], args["model_version"])
        self.slowdown = _number(params, "emulate_slowdown", 1.0, float)
        if not self.slowdown >= 1.0:
            raise ValueError(f"config parameter emulate_slowdown={self.slowdown} must be >= 1")
        self.best_ns = {}  # batch size -> fastest engine run seen (emulate_slowdown stretches by it)
        if (params.get("engine", "") or "auto") == "emulated":
            if self.slowdown != 1.0:
                raise ValueError("config parameters engine=emulated and emulate_slowdown != 1 exclude each other")
            self.engine = None
            self.emulated = _open_emulated(_sibling(version_dir, "emulated"), params, outputs)
            what = self.emulated.description
        else:
            self.emulated = None
            shapes = {name: dims for name, _, dims in self.inputs}
            self.engine = _open_engine(_sibling(version_dir, "engines"), args, params, version_dir,
                                       int(config.get("max_batch_size", 0) or 1), shapes)
            missing = [n for n in self.outputs if n not in self.engine.outputs]
            if missing:
                raise ValueError(f"config output(s) {missing} are not outputs of the ONNX partition "
                                 f"({self.engine.outputs})")
            what = f"engine {params.get('engine', '') or 'auto'}: {self.engine.description}"
        self.logger.log_info(f"poolpipe partition {args['model_name']}: {what}")

    def _feeds(self, request):
        """The request's inputs as numpy arrays, checked against the config (ValueError if wrong)."""
        feeds = {}
        batch = None
        for name, dtype, dims in self.inputs:
            t = pb_utils.get_input_tensor_by_name(request, name)
            if t is None:
                raise ValueError(f"input {name!r} is missing")
            x = t.as_numpy()
            if x.dtype != dtype:
                raise ValueError(f"input {name!r} has dtype {x.dtype}, expected {np.dtype(dtype)}")
            if x.ndim != len(dims) + 1 or any(d not in (-1, s) for d, s in zip(dims, x.shape[1:])):
                raise ValueError(f"input {name!r} has shape {list(x.shape)}, expected [batch, {dims}]")
            if batch is not None and x.shape[0] != batch:
                raise ValueError(f"inputs disagree on the batch size ({batch} vs {x.shape[0]})")
            batch = x.shape[0]
            feeds[name] = x
        return feeds, batch

    def _respond(self, outs, batch, start_ns, end_ns):
        tensors = [pb_utils.Tensor(n, np.ascontiguousarray(o)) for n, o in zip(self.outputs, outs)]
        stamps = {COMPUTE_START_OUTPUT: start_ns, COMPUTE_END_OUTPUT: end_ns}
        tensors += [pb_utils.Tensor(n, np.full((batch, 1), stamps[n], dtype=np.int64)) for n in self.timing]
        return pb_utils.InferenceResponse(output_tensors=tensors)

    def _compute(self, feeds):
        """The config's outputs, in order, for ``feeds``."""
        if self.emulated is not None:
            return self.emulated.run([feeds[name] for name, _, _ in self.inputs])
        outs = dict(zip(self.engine.outputs, self.engine.run(feeds)))
        return [outs[n] for n in self.outputs]

    def _run(self, feeds):
        start = time.time_ns()
        outs = self._compute(feeds)
        if self.slowdown > 1.0:
            # Stretch by the best time seen at this batch size, not this run's: CPU contention on the
            # host must not be multiplied into the emulated device's speed.
            batch = next(iter(feeds.values())).shape[0]
            took = time.time_ns() - start
            best = self.best_ns[batch] = min(self.best_ns.get(batch, took), took)
            time.sleep((self.slowdown - 1.0) * best / 1e9)
        return outs, start, time.time_ns()

    def execute(self, requests):
        responses = [None] * len(requests)
        good = []  # (index, feeds, batch)
        for i, request in enumerate(requests):
            try:
                feeds, batch = self._feeds(request)
                good.append((i, feeds, batch))
            except Exception as e:  # noqa: BLE001 - a bad request must not take the model down
                responses[i] = pb_utils.InferenceResponse(error=pb_utils.TritonError(f"bad request: {e}"))
        if len(good) > 1:
            try:
                feeds = {name: np.concatenate([g[1][name] for g in good]) for name, _, _ in self.inputs}
                outs, start, end = self._run(feeds)
                offset = 0
                for i, _, batch in good:
                    responses[i] = self._respond([o[offset:offset + batch] for o in outs], batch, start, end)
                    offset += batch
                good = []
            except Exception:  # noqa: BLE001 - retry one by one so that only the failing request errs
                pass
        for i, feeds, batch in good:
            try:
                outs, start, end = self._run(feeds)
                responses[i] = self._respond(outs, batch, start, end)
            except Exception as e:  # noqa: BLE001
                responses[i] = pb_utils.InferenceResponse(error=pb_utils.TritonError(f"inference failed: {e}"))
        return responses

    def finalize(self):
        self.engine = self.emulated = None
