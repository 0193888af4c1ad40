"""KServe v2 inference requests as they arrive on the wire: the model name read from the serialized bytes without
decoding the tensors, so that a pass-through request is forwarded as received (no protobuf decode, no re-encode);
and a request Triton's own front end decoded (the native front end), which needs no protobuf message at all."""

from __future__ import annotations

from dataclasses import dataclass

from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2

from scheduler.server.common.errors import ServeError, invalid

INFER_METHOD = "/inference.GRPCInferenceService/ModelInfer"
_REQUEST = service_pb2.ModelInferRequest.DESCRIPTOR.full_name
_MODEL_NAME_FIELD = service_pb2.ModelInferRequest.DESCRIPTOR.fields_by_name["model_name"].number
_VARINT, _FIXED64, _LENGTH_DELIMITED, _START_GROUP, _END_GROUP, _FIXED32 = 0, 1, 2, 3, 4, 5
_MAX_GROUP_DEPTH = 100  # protobuf's own recursion limit: it refuses a message with groups nested deeper


def _undecodable(why: str) -> ServeError:
    return invalid(f"the request is not a valid {_REQUEST} message: {why}")


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """The varint at ``pos`` and the position after it."""
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise _undecodable("truncated varint")
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7


def model_name(data: bytes) -> str:
    """The ``model_name`` of a serialized ModelInferRequest (the last one, as protobuf's parse keeps), found by
    walking its top-level fields and skipping the others (tensors and unknown groups included) without copying
    them."""
    name, pos, end = b"", 0, len(data)
    groups: list[int] = []  # the field numbers of the groups being skipped, innermost last
    while pos < end:
        tag, pos = _varint(data, pos)
        field, kind = tag >> 3, tag & 7
        if field == 0:
            raise _undecodable("field number 0")
        if kind in (_START_GROUP, _END_GROUP):
            _group_tag(groups, field, kind)
            continue
        if kind == _LENGTH_DELIMITED:
            size, pos = _varint(data, pos)
            if pos + size > end:
                raise _undecodable("a field runs past the end of the message")
            if field == _MODEL_NAME_FIELD and not groups:
                name = data[pos:pos + size]
            pos += size
        elif kind == _VARINT:
            _, pos = _varint(data, pos)
        elif kind in (_FIXED64, _FIXED32):
            pos += 8 if kind == _FIXED64 else 4
        else:
            raise _undecodable(f"unsupported wire type {kind}")
        if pos > end:
            raise _undecodable("truncated message")
    if groups:
        raise _undecodable("a group runs past the end of the message")
    try:
        return name.decode()
    except UnicodeDecodeError:
        raise _undecodable("model_name is not UTF-8") from None


def _group_tag(groups: list[int], field: int, kind: int) -> None:
    """Open or close an (unknown, skipped) group as protobuf does: nested at most _MAX_GROUP_DEPTH deep, each closed
    by an end tag of its own field number."""
    if kind == _START_GROUP:
        if len(groups) == _MAX_GROUP_DEPTH:
            raise _undecodable("groups nested too deep")
        groups.append(field)
    elif not groups or groups.pop() != field:
        raise _undecodable("an end-group tag without its group")


def parse_request(data: bytes) -> service_pb2.ModelInferRequest:
    """The whole request (a planned model's, whose tensors the sidecar reads); INVALID_ARGUMENT when malformed."""
    try:
        return service_pb2.ModelInferRequest.FromString(data)
    except DecodeError as e:
        raise _undecodable(str(e)) from None


def serialize_response(resp: service_pb2.ModelInferResponse | bytes) -> bytes:
    """A response built here, or one forwarded from Triton as it came (already bytes)."""
    return resp if isinstance(resp, bytes) else resp.SerializeToString()


@dataclass(frozen=True)
class DecodedRequest:
    """A request that Triton's own front end decoded and checked against this model's configuration (the native
    front end, scheduler/server/front/native_front.py): raw tensors, no protobuf message to build and walk."""

    model_name: str
    id: str
    inputs: tuple[tuple[str, str, tuple[int, ...], bytes], ...]  # (name, datatype, shape, raw bytes)
    outputs: tuple[str, ...]  # the outputs asked for ((): all)
    timeout_us: int = 0  # the client's "timeout" parameter (µs; 0: none)

    def to_proto(self) -> service_pb2.ModelInferRequest:
        """The ModelInferRequest the gRPC front end would have decoded (application models take it)."""
        req = service_pb2.ModelInferRequest(model_name=self.model_name, id=self.id)
        if self.timeout_us:
            req.parameters["timeout"].int64_param = self.timeout_us
        for name, datatype, shape, data in self.inputs:
            req.inputs.add(name=name, datatype=datatype, shape=shape)
            req.raw_input_contents.append(data)
        for name in self.outputs:
            req.outputs.add(name=name)
        return req


@dataclass(frozen=True)
class RawAnswer:
    """The answer to a DecodedRequest: raw output tensors for the native front end to frame (no
    ModelInferResponse to build and read back)."""

    outputs: tuple[tuple[str, str, tuple[int, ...], bytes], ...]  # (name, datatype, shape, raw bytes)
    parameters: tuple[tuple[str, int], ...] = ()  # int64 response parameters (the sidecar's own latency)


class InferRequest:
    """One inference request as every front end hands it to the router (``Router.submit``): the gRPC port's bytes
    as received (decoded only for a planned model: a pass-through one is forwarded as they are), a protobuf message
    (the HTTP port, the gRPC stream) or the native front end's DecodedRequest; and the client's absolute deadline
    on time.monotonic() (None: none)."""

    __slots__ = ("model_name", "deadline_s", "wire", "decoded", "_message")

    def __init__(self, model: str, deadline_s: float | None, *, wire: bytes | None = None,
                 message: service_pb2.ModelInferRequest | None = None, decoded: DecodedRequest | None = None
                 ) -> None:
        self.model_name = model
        self.deadline_s = deadline_s
        self.wire = wire
        self.decoded = decoded
        self._message = message

    @classmethod
    def from_wire(cls, data: bytes, deadline_s: float | None) -> "InferRequest":
        """A serialized ModelInferRequest (its model name read without decoding the tensors)."""
        return cls(model_name(data), deadline_s, wire=data)

    @classmethod
    def from_message(cls, message: service_pb2.ModelInferRequest, deadline_s: float | None) -> "InferRequest":
        return cls(message.model_name, deadline_s, message=message)

    @classmethod
    def from_decoded(cls, decoded: DecodedRequest, deadline_s: float | None) -> "InferRequest":
        return cls(decoded.model_name, deadline_s, decoded=decoded)

    def message(self) -> service_pb2.ModelInferRequest:
        """The request as protobuf: decoded from the wire once (INVALID_ARGUMENT when malformed), or built from a
        DecodedRequest."""
        if self._message is None:
            self._message = parse_request(self.wire) if self.wire is not None else self.decoded.to_proto()  # type: ignore[union-attr]
        return self._message
