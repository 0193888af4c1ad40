"""HTTP/REST inference bodies <-> the protobuf request and response both front ends share: KServe v2 JSON and
Triton's binary-tensor extension, read strictly (a field of the wrong JSON type is a 400 naming it, never a
number guessed from a string, a boolean or a float)."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web
from tritonclient.grpc import service_pb2

from scheduler.server.common.errors import invalid
from scheduler.server.common.tensors import json_to_numpy, numpy_to_json, params_to_dict, set_param, to_numpy, to_raw

HEADER_LENGTH = "Inference-Header-Content-Length"
_HTTP_ONLY_PARAMS = ("binary_data", "binary_data_size", "binary_data_output")


def _object(x: Any, what: str) -> dict[str, Any]:
    if not isinstance(x, dict):
        raise invalid(f"{what} must be a JSON object, got {type(x).__name__}")
    return x


def _params(x: Any, what: str) -> dict[str, Any]:
    """An optional ``parameters`` object."""
    return {} if x is None else _object(x, f"'parameters' of {what}")


def _int(x: Any, what: str, lo: int = 0) -> int:
    if isinstance(x, bool) or not isinstance(x, int) or not lo <= x < 2**63:
        raise invalid(f"{what} must be an int64 >= {lo}, got {json.dumps(x)[:40]}")
    return x


def _str(x: Any, what: str) -> str:
    if not isinstance(x, str):
        raise invalid(f"{what} must be a string, got {json.dumps(x)[:40]}")
    return x


def _bool(x: Any, what: str) -> bool:
    if not isinstance(x, bool):
        raise invalid(f"{what} must be true or false, got {json.dumps(x)[:40]}")
    return x


def header_length(value: str | None, body: bytes) -> int:
    """The JSON header's length: the whole body without the binary extension's header."""
    if value is None:
        return len(body)
    if not value.isdigit() or int(value) > len(body):
        raise invalid(f"{HEADER_LENGTH} must be a byte count within the request body ({len(body)} bytes), "
                      f"got {value[:40]!r}")
    return int(value)


def _head(body: bytes, n: int) -> dict[str, Any]:
    try:
        head = json.loads(body[:n])
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise invalid(f"failed to parse the request JSON buffer: {e}") from None
    head = _object(head, "the inference request")
    if not isinstance(head.get("inputs"), list):
        raise invalid("the inference request JSON must be an object with an 'inputs' list")
    return head


def _add_input(req: service_pb2.ModelInferRequest, i: int, t: Any, body: bytes, pos: int) -> int:
    """Adds input ``i``; returns the position of the next input's binary data in ``body``."""
    t = _object(t, f"input {i}")
    for key in ("name", "datatype", "shape"):
        if key not in t:
            raise invalid(f"input {i} must have 'name', 'datatype' and 'shape'")
    name, dt = _str(t["name"], f"the name of input {i}"), _str(t["datatype"], f"the datatype of input {i}")
    if not isinstance(t["shape"], list):
        raise invalid(f"the shape of input '{name}' must be a list of integers")
    shape = [_int(d, f"a dimension of input '{name}'", lo=-(2**63)) for d in t["shape"]]
    tp = _params(t.get("parameters"), f"input '{name}'")
    inp = req.inputs.add(name=name, datatype=dt, shape=shape)
    for k, v in tp.items():
        if k not in _HTTP_ONLY_PARAMS:
            set_param(inp.parameters, k, v)
    if "shared_memory_region" in tp:
        return pos
    if "binary_data_size" in tp:
        size = _int(tp["binary_data_size"], f"binary_data_size of input '{name}'")
        if pos + size > len(body):
            raise invalid(f"unexpected end of the binary data of input '{name}': {size} bytes declared, "
                          f"{len(body) - pos} left in the request body")
        req.raw_input_contents.append(body[pos:pos + size])
        return pos + size
    if "data" in t:
        req.raw_input_contents.append(to_raw(json_to_numpy(t["data"], dt, shape, name), dt))
        return pos
    raise invalid(f"input '{name}' has neither 'data', 'binary_data_size' nor 'shared_memory_region'")


def _add_outputs(req: service_pb2.ModelInferRequest, outputs: Any, default_binary: bool
                 ) -> tuple[dict[str, bool], dict[str, dict[str, Any]]]:
    if not isinstance(outputs, list):
        raise invalid("'outputs' must be a list of objects")
    binary: dict[str, bool] = {}
    shm_outputs: dict[str, dict[str, Any]] = {}
    for i, o in enumerate(outputs):
        o = _object(o, f"output {i}")
        name = _str(o.get("name"), f"the name of output {i}")
        op = _params(o.get("parameters"), f"output '{name}'")
        out = req.outputs.add(name=name)
        for k, v in op.items():
            if k not in _HTTP_ONLY_PARAMS:
                set_param(out.parameters, k, v)
        binary[name] = _bool(op.get("binary_data", default_binary), f"binary_data of output '{name}'")
        if "shared_memory_region" in op:
            shm_outputs[name] = {k: v for k, v in op.items() if k.startswith("shared_memory")}
    return binary, shm_outputs


def parse_infer_request(model: str, version: str, body: bytes, header: str | None
                        ) -> tuple[service_pb2.ModelInferRequest, dict[str, bool], bool, dict[str, dict[str, Any]]]:
    """The protobuf request, per requested output whether it wants binary data, the default, and the outputs
    to be written to shared memory (gRPC responses do not mark those, HTTP ones do)."""
    n = header_length(header, body)
    head = _head(body, n)
    req = service_pb2.ModelInferRequest(model_name=model, model_version=version, id=str(head.get("id", "")))
    params = _params(head.get("parameters"), "the request")
    default_binary = _bool(params.get("binary_data_output", False), "binary_data_output")
    for k, v in params.items():
        if k not in _HTTP_ONLY_PARAMS:
            set_param(req.parameters, k, v)
    pos = n
    for i, t in enumerate(head["inputs"]):
        pos = _add_input(req, i, t, body, pos)
    if pos != len(body):
        raise invalid(f"the request body has {len(body) - pos} bytes after the binary data of its inputs")
    binary, shm_outputs = _add_outputs(req, head.get("outputs") or [], default_binary)
    return req, binary, default_binary, shm_outputs


def infer_response_to_http(resp: service_pb2.ModelInferResponse, binary: dict[str, bool], default_binary: bool,
                           shm_outputs: dict[str, dict[str, Any]]) -> web.Response:
    head: dict[str, Any] = {"model_name": resp.model_name, "model_version": resp.model_version}
    if resp.id:
        head["id"] = resp.id
    if resp.parameters:
        head["parameters"] = params_to_dict(resp.parameters)
    outputs, blobs = [], []
    for i, o in enumerate(resp.outputs):
        d: dict[str, Any] = {"name": o.name, "datatype": o.datatype, "shape": list(o.shape)}
        if o.name in shm_outputs:  # as Triton: no data and no parameters (its C++ client reads parameters as
            outputs.append(d)      # the binary extension's and wants binary_data_size there)
            continue
        p = params_to_dict(o.parameters)
        raw = resp.raw_output_contents[i] if i < len(resp.raw_output_contents) else b""
        if binary.get(o.name, default_binary):
            p["binary_data_size"] = len(raw)
            blobs.append(raw)
        else:
            d["data"] = numpy_to_json(to_numpy(raw, o.datatype, list(o.shape)), o.datatype)
        if p:
            d["parameters"] = p
        outputs.append(d)
    head["outputs"] = outputs
    text = json.dumps(head).encode()
    if not blobs:
        return web.Response(body=text, content_type="application/json")
    return web.Response(body=b"".join([text, *blobs]), headers={HEADER_LENGTH: str(len(text))},
                        content_type="application/octet-stream")
