"""Malformed KServe v2 inference requests for fuzzing a server (the sidecar, or Triton itself) over gRPC and HTTP.

Every case is a valid request of the target model with one thing broken (a name, a datatype, a shape, a byte
count, a dimension, the JSON, the binary-extension header, a shared-memory reference, an output), so a correct
server must answer every case with an error. The choices come from a ``Chooser``: hypothesis in the property
tests, a seeded ``random.Random`` in ``benchmarks/fuzz.py``.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import numpy as np
from tritonclient.grpc import service_pb2

from poolpipe_common.tensors import DTYPE_SIZE, TensorSpec

T = TypeVar("T")
HEADER_LENGTH = "Inference-Header-Content-Length"
BAD_DATATYPES = ("FP16", "FP64", "INT64", "INT32", "INT8", "UINT8", "BOOL", "BYTES", "BF16", "", "fp32", "FLOAT")
HUGE = (2**31, 2**62, 2**63 - 1)


class Chooser(Protocol):
    def pick(self, options: Sequence[T]) -> T: ...

    def number(self, lo: int, hi: int) -> int: ...


class RandomChooser:
    """A seeded Chooser for benchmarks."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def pick(self, options: Sequence[T]) -> T:
        return options[self.rng.randrange(len(options))]

    def number(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)


@dataclass(frozen=True)
class Target:
    """The model under test and two client shared-memory regions registered with the server."""

    model: str
    input: TensorSpec
    outputs: tuple[str, ...]
    max_batch: int
    small_region: str  # registered, ``small_bytes`` long: too small for any input or output
    big_region: str  # registered, large enough for max_batch inputs
    small_bytes: int = 4

    def raw(self, batch: int) -> bytes:
        return np.random.default_rng(batch).standard_normal(batch * self.input.bytes_per_request() // 4
                                                            ).astype(np.float32).tobytes()


@dataclass
class GrpcCase:
    kind: str
    request: service_pb2.ModelInferRequest | None = None
    raw: bytes | None = None  # sent as the serialized message instead of ``request`` (undecodable protobuf)


@dataclass
class HttpCase:
    kind: str
    path: str
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)


# --- gRPC ------------------------------------------------------------------------------------------------

def valid_grpc(t: Target, batch: int = 1) -> service_pb2.ModelInferRequest:
    req = service_pb2.ModelInferRequest(model_name=t.model)
    req.inputs.add(name=t.input.name, datatype=t.input.datatype, shape=[batch, *t.input.shape])
    req.raw_input_contents.append(t.raw(batch))
    return req


def _shm(tensor: Any, region: str, size: Any, offset: Any = 0) -> None:
    tensor.parameters["shared_memory_region"].string_param = region
    for key, value in (("shared_memory_byte_size", size), ("shared_memory_offset", offset)):
        if isinstance(value, str):
            tensor.parameters[key].string_param = value
        elif isinstance(value, float):
            tensor.parameters[key].double_param = value
        else:
            tensor.parameters[key].int64_param = value


def _bad_shape(c: Chooser, t: Target, batch: int) -> list[int]:
    shape = [batch, *t.input.shape]
    how = c.pick(("rank_less", "rank_more", "dim", "batch"))
    if how == "rank_less":
        return shape[:-1]
    if how == "rank_more":
        return [*shape, 1]
    if how == "batch":
        shape[0] = c.pick((0, -1, -(2**63), t.max_batch + 1, *HUGE))
        return shape
    k = c.number(1, len(shape) - 1)
    shape[k] = c.pick((0, -1, shape[k] + 1, shape[k] - 1, *HUGE))
    return shape


def _grpc_input_case(c: Chooser, t: Target, kind: str, req: service_pb2.ModelInferRequest, batch: int) -> None:
    inp = req.inputs[0]
    nbytes = batch * t.input.bytes_per_request()
    if kind == "input_name":
        inp.name = c.pick(("", t.input.name.upper(), t.input.name + "_", "x" * 300, "\0"))
    elif kind == "no_inputs":
        del req.inputs[:]
        del req.raw_input_contents[:]
    elif kind in ("extra_input", "duplicate_input"):
        req.inputs.add(name=t.input.name if kind == "duplicate_input" else "extra", datatype=inp.datatype,
                       shape=inp.shape)
        req.raw_input_contents.append(req.raw_input_contents[0])
    elif kind == "datatype":
        inp.datatype = c.pick([d for d in BAD_DATATYPES if d != t.input.datatype])
    elif kind == "shape":
        inp.ClearField("shape")
        inp.shape.extend(_bad_shape(c, t, batch))
    elif kind == "byte_count":
        delta = c.pick((-nbytes, -c.number(1, 64), c.number(1, 64), nbytes))
        req.raw_input_contents[0] = t.raw(batch * 2)[:nbytes + delta] if delta > 0 else t.raw(batch)[:nbytes + delta]
    elif kind == "raw_count":
        req.raw_input_contents.append(b"\0" * c.pick((0, 4, nbytes)))
    elif kind == "typed_contents":
        del req.raw_input_contents[:]
        n = nbytes // DTYPE_SIZE[t.input.datatype]
        if c.pick((True, False)):
            inp.contents.fp32_contents.extend([0.5] * (n + c.pick((-1, 1, -n))))
        else:
            inp.contents.int64_contents.extend([1] * n)
    elif kind == "no_data":
        del req.raw_input_contents[:]


def _grpc_shm_case(c: Chooser, t: Target, kind: str, req: service_pb2.ModelInferRequest, batch: int) -> None:
    nbytes = batch * t.input.bytes_per_request()
    if kind == "output":
        out = req.outputs.add(name=c.pick(("", "nope", t.outputs[0] + "_")))
        if c.pick((True, False)):
            out.name = t.outputs[0]
            out.parameters["classification"].int64_param = 3
        return
    if kind == "output_shm":
        out = req.outputs.add(name=t.outputs[0])
        _shm(out, c.pick((t.small_region, "unregistered")), c.pick((t.small_bytes, 1, 2**40)))
        return
    del req.raw_input_contents[:]
    inp = req.inputs[0]
    if kind == "shm_unregistered":
        _shm(inp, c.pick(("unregistered", "", t.small_region + "_")), nbytes)
    elif kind == "shm_too_small":
        _shm(inp, t.small_region, nbytes, c.pick((0, 8)))
    elif kind == "shm_window":
        _shm(inp, t.big_region, nbytes, c.pick((-1, -(2**40), 2**40, 2**63 - 1)))
    elif kind == "shm_size":
        _shm(inp, t.big_region, c.pick((nbytes - 4, nbytes + 4, 0, -nbytes, "abc", float(nbytes), str(nbytes))))
    elif kind == "shm_offset_type":
        _shm(inp, t.big_region, nbytes, c.pick(("0", 0.0, "x")))


GRPC_KINDS = ("unknown_model", "version", "input_name", "no_inputs", "extra_input", "duplicate_input", "datatype",
              "shape", "byte_count", "raw_count", "typed_contents", "no_data", "output", "output_shm",
              "shm_unregistered", "shm_too_small", "shm_window", "shm_size", "shm_offset_type", "garbage")


def grpc_case(c: Chooser, t: Target) -> GrpcCase:
    kind = c.pick(GRPC_KINDS)
    batch = c.number(1, t.max_batch)
    req = valid_grpc(t, batch)
    if kind == "unknown_model":
        req.model_name = c.pick(("", "nope", t.model + "x", t.model.upper(), "../" + t.model, "x" * 300))
    elif kind == "version":
        req.model_version = c.pick(("0", "2", "-1", "latest", "1.0", " 1"))
    elif kind == "garbage":
        return GrpcCase(kind, raw=c.pick((b"\xff" * 7, b"\x0a\xff\xff\xff\xff\x0f", b"\x12\x05ab")))
    elif kind.startswith(("shm", "output")):
        _grpc_shm_case(c, t, kind, req, batch)
    else:
        _grpc_input_case(c, t, kind, req, batch)
    return GrpcCase(kind, req)


# --- HTTP ------------------------------------------------------------------------------------------------

def valid_http(t: Target, batch: int = 1, binary: bool = True) -> HttpCase:
    raw = t.raw(batch)
    inp: dict[str, Any] = {"name": t.input.name, "datatype": t.input.datatype, "shape": [batch, *t.input.shape]}
    if not binary:
        inp["data"] = np.frombuffer(raw, np.float32).tolist()
        return HttpCase("valid", f"/v2/models/{t.model}/infer", json.dumps({"inputs": [inp]}).encode())
    inp["parameters"] = {"binary_data_size": len(raw)}
    head = json.dumps({"inputs": [inp], "outputs": [{"name": o, "parameters": {"binary_data": True}}
                                                    for o in t.outputs]}).encode()
    return HttpCase("valid", f"/v2/models/{t.model}/infer", head + raw, {HEADER_LENGTH: str(len(head))})


def _json_case(c: Chooser, t: Target, kind: str, head: dict[str, Any], batch: int) -> None:
    inp = head["inputs"][0]
    if kind == "inputs_type":
        head["inputs"] = c.pick((None, {}, "x", 3, [3], [[]], [None]))
    elif kind == "input_fields":
        key = c.pick(("name", "datatype", "shape"))
        if c.pick((True, False)):
            del inp[key]
        else:
            inp[key] = c.pick((3, None, [t.input.name], {"a": 1}, True))
    elif kind == "shape_json":
        inp["shape"] = c.pick(("abc", [float(d) + 0.5 for d in inp["shape"]], [str(d) for d in inp["shape"]],
                               [None], {}, [True, *t.input.shape], 5, _bad_shape(c, t, batch)))
    elif kind == "data_json":
        n = batch * t.input.bytes_per_request() // DTYPE_SIZE[t.input.datatype]
        inp.pop("parameters", None)
        inp["data"] = c.pick(([0.5] * (n + c.pick((-1, 1))), ["0.5"] * n, [True] * n, None, {"a": 1}, "0.5",
                              [[0.5]] * (n - 1) + [[0.5, 0.5]]))
    elif kind == "datatype_json":
        inp["datatype"] = c.pick([d for d in BAD_DATATYPES if d != t.input.datatype])
    elif kind == "parameters_json":
        if c.pick((True, False)):
            head["parameters"] = c.pick(([], "x", 3))
        else:
            inp["parameters"] = c.pick(([], "x", 3, {"binary_data_size": c.pick((-1, "abc", 1.5, None, 2**63))}))
    elif kind == "outputs_json":
        head["outputs"] = c.pick(("x", [3], [{"name": "nope"}], [{}], {"a": 1}, [{"name": t.outputs[0],
                                                                                 "parameters": []}]))
    elif kind == "shm_json":
        inp["parameters"] = {"shared_memory_region": c.pick(("unregistered", t.small_region, t.big_region)),
                             "shared_memory_byte_size": c.pick((2**40, -1, "abc", t.small_bytes)),
                             "shared_memory_offset": c.pick((0, -1, 2**40, "x"))}


HTTP_KINDS = ("json_syntax", "inputs_type", "input_fields", "shape_json", "data_json", "datatype_json",
              "parameters_json", "outputs_json", "shm_json", "header_length", "binary_size", "model_path")


def http_case(c: Chooser, t: Target) -> HttpCase:
    kind = c.pick(HTTP_KINDS)
    batch = c.number(1, t.max_batch)
    case = valid_http(t, batch, binary=kind == "binary_size" or kind == "header_length")
    case.kind = kind
    if kind == "json_syntax":
        case.body = c.pick((b"", b"{", b"[]", b"null", b"\xff\xfe{}", b'{"inputs": [', b'{"inputs": []}x', b"{}"))
    elif kind == "model_path":
        case.path = c.pick((f"/v2/models/{t.model}x/infer", f"/v2/models/{t.model}/versions/2/infer",
                            "/v2/models/%00/infer"))
    elif kind == "header_length":
        n = int(case.headers[HEADER_LENGTH])
        case.headers[HEADER_LENGTH] = str(c.pick(("abc", -1, 0, n - 1, n + 1, len(case.body) + 1, 2**63, "1e3",
                                                  "")))
    elif kind == "binary_size":
        n = int(case.headers[HEADER_LENGTH])
        head = json.loads(case.body[:n])
        size = head["inputs"][0]["parameters"]["binary_data_size"]
        head["inputs"][0]["parameters"]["binary_data_size"] = c.pick((size - 4, size + 4, -size, 0, 2**62))
        text = json.dumps(head).encode()
        case.body, case.headers[HEADER_LENGTH] = text + case.body[n:], str(len(text))
    else:
        head = json.loads(case.body)
        _json_case(c, t, kind, head, batch)
        case.body = json.dumps(head).encode()
    return case


def hypothesis_chooser(draw: Callable[[Any], Any]) -> Chooser:
    """A Chooser over a hypothesis ``data.draw`` (imported lazily: hypothesis is a test dependency)."""
    from hypothesis import strategies as st

    class _Drawn:
        def pick(self, options: Sequence[T]) -> T:
            return draw(st.sampled_from(list(options)))

        def number(self, lo: int, hi: int) -> int:
            return draw(st.integers(lo, hi))

    return _Drawn()
