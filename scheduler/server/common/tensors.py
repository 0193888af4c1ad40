"""Tensor plumbing shared by the front ends: KServe v2 datatypes, raw bytes <-> numpy, parameters, proto -> JSON."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from tritonclient.grpc import service_pb2
from tritonclient.utils import (
    deserialize_bytes_tensor,
    np_to_triton_dtype,
    serialize_byte_tensor,
    triton_to_np_dtype,
)

from scheduler.server.common.errors import invalid


def to_numpy(raw: bytes | memoryview, datatype: str, shape: list[int]) -> np.ndarray:
    """Decode one tensor's raw bytes (BYTES: 4-byte length-prefixed elements)."""
    if datatype == "BYTES":
        return deserialize_bytes_tensor(bytes(raw)).reshape(shape)
    return np.frombuffer(raw, dtype=triton_to_np_dtype(datatype)).reshape(shape)


def to_raw(array: np.ndarray, datatype: str) -> bytes:
    if datatype == "BYTES":
        s = serialize_byte_tensor(array)
        return s.item() if s.size else b""
    return np.ascontiguousarray(array).tobytes()


def _flatten(data: Any) -> list[Any]:
    """The scalars of a (nested) JSON list, in order."""
    out: list[Any] = []
    stack = [iter([data])]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                stack.append(iter(item))
                break
            out.append(item)
        else:
            stack.pop()
    return out


def _json_type_ok(datatype: str, values: list[Any]) -> bool:
    """Whether every JSON scalar has the type KServe v2 requires for ``datatype`` (booleans are not numbers,
    strings are not numbers, integers fit their type)."""
    if datatype == "BOOL":
        return all(isinstance(v, bool) for v in values)
    if datatype == "BYTES":
        return all(isinstance(v, str) for v in values)
    if datatype.startswith(("INT", "UINT")):
        info = np.iinfo(triton_to_np_dtype(datatype))
        return all(isinstance(v, int) and not isinstance(v, bool) and info.min <= v <= info.max for v in values)
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def json_to_numpy(data: Any, datatype: str, shape: list[int], name: str) -> np.ndarray:
    """A JSON ``data`` field (flat or nested list) as an array of the declared datatype and shape."""
    if triton_to_np_dtype(datatype) is None:
        raise invalid(f"input '{name}': unknown datatype '{datatype}'")
    values = _flatten(data)
    count = 1
    for d in shape:
        count *= d
    if len(values) != count:
        raise invalid(f"unable to parse 'data' of input '{name}': {len(values)} values for shape {shape}")
    if not _json_type_ok(datatype, values):
        raise invalid(f"unable to parse 'data' of input '{name}': every value must be a JSON "
                      f"{'boolean' if datatype == 'BOOL' else 'string' if datatype == 'BYTES' else 'number'} "
                      f"that fits {datatype}")
    if datatype == "BYTES":
        return np.array([v.encode() for v in values], dtype=np.object_).reshape(shape)
    return np.array(values, dtype=triton_to_np_dtype(datatype)).reshape(shape)


def numpy_to_json(array: np.ndarray, datatype: str) -> list[Any]:
    if datatype == "BYTES":
        return [b.decode(errors="replace") if isinstance(b, bytes) else str(b) for b in array.ravel()]
    return array.ravel().tolist()


def datatype_of(array: np.ndarray) -> str:
    return np_to_triton_dtype(array.dtype)


# --- InferParameter <-> plain values -----------------------------------------------------------------------

def param_value(p: service_pb2.InferParameter) -> Any:
    kind = p.WhichOneof("parameter_choice")
    return getattr(p, kind) if kind else None


def set_param(target: Any, key: str, value: Any) -> None:
    """Set map<string, InferParameter>[key] from a JSON value."""
    p = target[key]
    if isinstance(value, bool):
        p.bool_param = value
    elif isinstance(value, int):
        p.int64_param = value
    elif isinstance(value, float):
        p.double_param = value
    else:
        p.string_param = str(value)


def params_to_dict(params: Any) -> dict[str, Any]:
    return {k: param_value(v) for k, v in params.items()}


# --- protobuf -> the JSON Triton's HTTP endpoint returns (numbers as numbers, field names as in the proto) ---

_INT_TYPES = {FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_INT32,
              FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_SINT64, FieldDescriptor.TYPE_SINT32,
              FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_FIXED32}


def _scalar(fd: FieldDescriptor, v: Any) -> Any:
    if fd.type == FieldDescriptor.TYPE_ENUM:
        return fd.enum_type.values_by_number[v].name if v in fd.enum_type.values_by_number else v
    if fd.type == FieldDescriptor.TYPE_BYTES:
        return {"b64": base64.b64encode(v).decode()}
    if fd.type == FieldDescriptor.TYPE_MESSAGE:
        return proto_to_json(v)
    if fd.type in _INT_TYPES:
        return int(v)
    return v


def proto_to_json(msg: Message) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for fd, value in msg.ListFields():
        if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
            vfd = fd.message_type.fields_by_name["value"]
            out[fd.name] = {k: _scalar(vfd, v) for k, v in value.items()}
        elif fd.label == FieldDescriptor.LABEL_REPEATED:
            out[fd.name] = [_scalar(fd, v) for v in value]
        else:
            out[fd.name] = _scalar(fd, value)
    return out
