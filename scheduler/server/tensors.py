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

from scheduler.server.errors import invalid


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


def json_to_numpy(data: Any, datatype: str, shape: list[int], name: str) -> np.ndarray:
    """A JSON ``data`` field (flat or nested list) as an array of the declared datatype and shape."""
    try:
        if datatype == "BYTES":
            items = np.array(data, dtype=object).ravel()
            flat = np.array([d.encode() if isinstance(d, str) else bytes(d) for d in items], dtype=np.object_)
        else:
            flat = np.array(data, dtype=triton_to_np_dtype(datatype)).ravel()
        return flat.reshape(shape)
    except (ValueError, TypeError) as e:
        raise invalid(f"unable to parse 'data' of input '{name}' as {datatype} with shape {shape}: {e}") from None


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
