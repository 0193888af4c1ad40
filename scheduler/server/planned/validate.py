"""Checks of an inference request against a planned model (Triton's wording), and decoding of its inputs."""

from __future__ import annotations

from typing import Any

import numpy as np
from tritonclient.grpc import service_pb2
from tritonclient.utils import triton_to_np_dtype

from model_repository_gen.manifest import ModelInfo
from poolpipe_common.tensors import DTYPE_SIZE, TensorSpec, element_count
from scheduler.server.common.client_shm import ClientShmRegistry
from scheduler.server.common.errors import invalid
from scheduler.server.common.tensors import param_value
from scheduler.server.common.wire import DecodedRequest, InferRequest
from scheduler.server.planned.calls import ClientCall, OutputTarget
from scheduler.server.planned.stage_parameters import custom_parameters

_NP_DTYPES = {t: np.dtype(d) for t in DTYPE_SIZE if (d := triton_to_np_dtype(t)) is not None}


def check(request: InferRequest, model: ModelInfo, shm: ClientShmRegistry) -> ClientCall:
    """The one check of a request against its planned model, in Triton's words (a ServeError when it fails); its
    inputs decoded into the call that carries it to its answer."""
    if request.decoded is not None:
        call = check_decoded(request.decoded, model, shm)
        call.raw = True  # answered with a RawAnswer for the native front end to frame
        return call
    return check_request(request.message(), model, shm)


def check_decoded(req: DecodedRequest, model: ModelInfo, shm: ClientShmRegistry) -> ClientCall:
    """check_request's result for a request Triton checked against this very model: a request that does not match
    it (a reload changed the model meanwhile) goes through check_request, which says what is wrong in Triton's
    words."""
    declared = {t.name: t for t in model.inputs}
    arrays: dict[str, np.ndarray] = {}
    batch = req.inputs[0][2][0] if req.inputs else 0
    try:
        for name, datatype, shape, data in req.inputs:
            spec = declared[name]
            if datatype != spec.datatype or shape[1:] != spec.shape or shape[0] != batch:
                raise ValueError(name)
            arrays[name] = np.frombuffer(data, _NP_DTYPES[datatype]).reshape(shape)  # ValueError: wrong size
        wanted = list(model.outputs)
        if req.outputs:  # a selection (most requests take every output: no lookup table built for them)
            by_name = {t.name: t for t in model.outputs}
            wanted = [by_name[n] for n in req.outputs]
    except (KeyError, ValueError):
        return check_request(req.to_proto(), model, shm)
    if len(arrays) != len(declared) or not 0 < batch <= model.max_batch_size:
        return check_request(req.to_proto(), model, shm)
    timeout = float(req.timeout_us) if req.timeout_us > 0 else None
    return ClientCall(model, req.id, batch, arrays, tuple(OutputTarget(t) for t in wanted), timeout)


def _shape_str(shape: list[int] | tuple[int, ...]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def _shm_params(params: Any) -> tuple[str, int, int] | None:
    """(region, byte size, offset) of a tensor in client shared memory, as Triton reads them: the region a string,
    the size and offset int64 (a string or double there is a malformed request, not a number to convert)."""
    if "shared_memory_region" not in params:
        return None
    kinds = {"shared_memory_region": "string_param", "shared_memory_byte_size": "int64_param",
             "shared_memory_offset": "int64_param"}
    for key, kind in kinds.items():
        if key in params and params[key].WhichOneof("parameter_choice") != kind:
            raise invalid(f"parameter '{key}' must be {'a string' if kind == 'string_param' else 'an int64'}, got "
                          f"{param_value(params[key])!r}")
    if "shared_memory_byte_size" not in params:
        raise invalid("parameter 'shared_memory_byte_size' is missing for a tensor in shared memory")
    offset = params["shared_memory_offset"].int64_param if "shared_memory_offset" in params else 0
    return params["shared_memory_region"].string_param, params["shared_memory_byte_size"].int64_param, offset


def check_request(req: service_pb2.ModelInferRequest, model: ModelInfo, shm: ClientShmRegistry) -> ClientCall:
    name = model.name
    if req.model_version not in ("", "1"):
        raise invalid(f"Request for unknown model: '{name}' version {req.model_version} is not found")
    declared = {t.name: t for t in model.inputs}
    got = [i.name for i in req.inputs]
    for n in got:
        if n not in declared:
            raise invalid(f"unexpected inference input '{n}' for model '{name}'")
    if len(set(got)) != len(got):
        raise invalid(f"input '{next(n for n in got if got.count(n) > 1)}' is given more than once for model '{name}'")
    missing = [n for n in declared if n not in got]
    if missing:
        raise invalid(f"expected {len(declared)} inputs but got {len(got)} inputs for model '{name}'. Got input(s) "
                      f"{got}, but missing required input(s) {missing}. Please provide all required input(s).")
    n_raw = sum(1 for i in req.inputs if _shm_params(i.parameters) is None)
    if req.raw_input_contents and len(req.raw_input_contents) != n_raw:
        raise invalid(f"expected {n_raw} raw input contents (inputs not in shared memory), "
                      f"got {len(req.raw_input_contents)}")
    batch = None
    arrays: dict[str, np.ndarray] = {}
    raw_index = 0
    for inp in req.inputs:
        spec = declared[inp.name]
        if inp.datatype != spec.datatype:
            raise invalid(f"inference input '{inp.name}' data-type is '{inp.datatype}', but model '{name}' expects "
                          f"'{spec.datatype}'")
        shape = list(inp.shape)
        if len(shape) != len(spec.shape) + 1 or tuple(shape[1:]) != spec.shape or shape[0] < 1:
            raise invalid(f"unexpected shape for input '{inp.name}' for model '{name}'. Expected "
                          f"{_shape_str([-1, *spec.shape])}, got {_shape_str(shape)}")
        if shape[0] > model.max_batch_size:
            raise invalid(f"inference request batch-size must be <= {model.max_batch_size} for '{name}'")
        if batch is not None and shape[0] != batch:
            raise invalid(f"input '{inp.name}' batch size {shape[0]} differs from the other inputs' {batch} "
                          f"for model '{name}'")
        batch = shape[0]
        expected = element_count(shape) * DTYPE_SIZE[spec.datatype]
        where = _shm_params(inp.parameters)
        if where is not None:
            region, size, offset = where
            if size != expected:
                raise invalid(f"input byte size mismatch for input '{inp.name}' for model '{name}'. "
                              f"Expected {expected}, got {size}")
            data = shm.get(region).view(offset, size, f"input '{inp.name}'")
        elif req.raw_input_contents:
            data = req.raw_input_contents[raw_index]
            raw_index += 1
            if len(data) != expected:
                raise invalid(f"input byte size mismatch for input '{inp.name}' for model '{name}'. "
                              f"Expected {expected}, got {len(data)}")
        else:
            data = _typed_contents(inp, spec, expected)
        arr = np.frombuffer(data, dtype=triton_to_np_dtype(spec.datatype)).reshape(shape)
        arrays[inp.name] = arr if isinstance(data, bytes) else arr.copy()  # client shm can change: copy it
    outputs = _check_outputs(req, model, shm, batch or 1)
    timeout = _int_param(req.parameters, "timeout", ("int64_param",))
    priority = _int_param(req.parameters, "priority", ("int64_param", "uint64_param"))
    return ClientCall(model, req.id, batch or 1, arrays, outputs, float(timeout) if timeout > 0 else None, priority,
                      parameters=custom_parameters(req.parameters))


def _int_param(params: Any, key: str, kinds: tuple[str, ...]) -> int:
    """A request's integer parameter (``timeout`` in µs, ``priority``) as Triton reads it; 0 when absent."""
    if key not in params:
        return 0
    kind = params[key].WhichOneof("parameter_choice")
    if kind not in kinds:
        raise invalid(f"invalid value type for '{key}' parameter, expected {' or '.join(kinds)}.")
    value = getattr(params[key], kind)
    if value < 0:
        raise invalid(f"'{key}' parameter must be >= 0, got {value}")
    return int(value)


def _typed_contents(inp: service_pb2.ModelInferRequest.InferInputTensor, spec: TensorSpec, expected: int) -> bytes:
    """KServe's typed ``contents`` fields (clients that do not send raw bytes)."""
    c = inp.contents
    field = {"FP32": c.fp32_contents, "FP64": c.fp64_contents, "INT64": c.int64_contents, "INT32": c.int_contents,
             "INT8": c.int_contents, "UINT8": c.uint_contents, "BOOL": c.bool_contents}.get(spec.datatype)
    if field is None or not len(field):
        raise invalid(f"input '{inp.name}' has no data: send raw_input_contents, typed contents or a shared "
                      "memory region")
    arr = np.array(list(field), dtype=triton_to_np_dtype(spec.datatype))
    if arr.nbytes != expected:
        raise invalid(f"input byte size mismatch for input '{inp.name}'. Expected {expected}, got {arr.nbytes}")
    return arr.tobytes()


def _check_outputs(req: service_pb2.ModelInferRequest, model: ModelInfo, shm: ClientShmRegistry, batch: int
                   ) -> tuple[OutputTarget, ...]:
    declared = {t.name: t for t in model.outputs}
    if not req.outputs:
        return tuple(OutputTarget(t) for t in model.outputs)
    out = []
    for o in req.outputs:
        spec = declared.get(o.name)
        if spec is None:
            raise invalid(f"unexpected inference output '{o.name}' for model '{model.name}'")
        if "classification" in o.parameters:
            raise invalid(f"output '{o.name}' of planned model '{model.name}': the classification extension is "
                          "not supported for planned models")
        where = _shm_params(o.parameters)
        if where is None:
            out.append(OutputTarget(spec))
            continue
        region, size, offset = where
        need = batch * spec.bytes_per_request()
        if size < need:
            raise invalid(f"shared memory size specified with the request for output '{o.name}' ({size} bytes) "
                          f"should be at least {need} bytes to hold the results")
        shm.get(region).view(offset, size, f"output '{o.name}'")  # region exists and the window fits
        out.append(OutputTarget(spec, region, offset, size))
    return tuple(out)
