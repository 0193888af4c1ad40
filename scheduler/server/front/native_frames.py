"""The frames the native front end (backends/native_front/, frames.h says the layout) and the sidecar exchange:
requests in as DecodedRequests the router takes (raw tensors Triton has checked), answers out as bytes. Pure
functions."""

from __future__ import annotations

import struct

import grpc
from tritonclient.grpc import service_pb2

from scheduler.server.common.wire import DecodedRequest, RawAnswer

HELLO_ID = 0xFFFFFFFF
CANCEL_ID = 0xFFFFFFFE  # a cancel frame: u32 CANCEL_ID, u32 the id of a request the front answered CANCELLED
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")
_ID_CODE = struct.Struct("<II")

# TRITONSERVER_Error_Code of each gRPC status the router raises (Triton maps them back the same way); others
# become INTERNAL. 0 (UNKNOWN) is never sent: it means success on the wire.
TRITON_CODES = {grpc.StatusCode.INTERNAL: 1, grpc.StatusCode.NOT_FOUND: 2, grpc.StatusCode.INVALID_ARGUMENT: 3,
                grpc.StatusCode.UNAVAILABLE: 4, grpc.StatusCode.DEADLINE_EXCEEDED: 4,
                grpc.StatusCode.UNIMPLEMENTED: 5, grpc.StatusCode.ALREADY_EXISTS: 6, grpc.StatusCode.CANCELLED: 7}


class FrameError(ValueError):
    """A frame that does not follow frames.h (the connection is closed: the backend fails what was pending)."""


def split_frames(buf: bytearray) -> tuple[list[bytes], int]:
    """The complete frames at the start of ``buf`` (without their length) and how many bytes they took."""
    frames, at, n = [], 0, len(buf)
    while n - at >= 4:
        (size,) = _U32.unpack_from(buf, at)
        if n - at - 4 < size:
            break
        frames.append(bytes(buf[at + 4:at + 4 + size]))
        at += 4 + size
    return frames, at


def _str(frame: bytes, at: int) -> tuple[str, int]:
    (n,) = _U16.unpack_from(frame, at)
    end = at + 2 + n
    if end > len(frame):
        raise FrameError("string runs past the frame")
    return frame[at + 2:end].decode(), end


def decode_hello(frame: bytes) -> str:
    """The model a connection serves (its first frame)."""
    try:
        (ident,) = _U32.unpack_from(frame, 0)
        model, _ = _str(frame, 4)
    except (struct.error, UnicodeDecodeError) as e:
        raise FrameError(f"bad hello frame: {e}") from None
    if ident != HELLO_ID:
        raise FrameError("the first frame is not a hello")
    return model


def decode_cancel(frame: bytes) -> int | None:
    """The id a cancel frame withdraws; None for any other frame."""
    if len(frame) < 8 or _U32.unpack_from(frame, 0)[0] != CANCEL_ID:
        return None
    return _U32.unpack_from(frame, 4)[0]


def decode_request(model: str, frame: bytes) -> tuple[int, DecodedRequest]:
    """(the frame's id, the request) of one request frame."""
    inputs, outputs = [], []
    try:
        (ident,) = _U32.unpack_from(frame, 0)
        (n_in,), at = _U16.unpack_from(frame, 4), 6
        for _ in range(n_in):
            name, at = _str(frame, at)
            dtype, at = _str(frame, at)
            (dims,) = _U16.unpack_from(frame, at)
            shape = struct.unpack_from(f"<{dims}q", frame, at + 2)
            at += 2 + 8 * dims
            (size,) = _U64.unpack_from(frame, at)
            at += 8
            if at + size > len(frame):
                raise FrameError("tensor bytes run past the frame")
            inputs.append((name, dtype, shape, frame[at:at + size]))
            at += size
        (n_out,) = _U16.unpack_from(frame, at)
        at += 2
        for _ in range(n_out):
            name, at = _str(frame, at)
            outputs.append(name)
        request_id, at = _str(frame, at)
        (timeout_us,) = _U64.unpack_from(frame, at)
    except (struct.error, UnicodeDecodeError) as e:
        raise FrameError(f"bad request frame: {e}") from None
    return ident, DecodedRequest(model, request_id, tuple(inputs), tuple(outputs), timeout_us)


def _frame(body: list[bytes]) -> bytes:
    data = b"".join(body)
    return _U32.pack(len(data)) + data


def _s(text: str) -> bytes:
    b = text.encode()[:65535]
    return _U16.pack(len(b)) + b


def encode_answer(ident: int, answer: RawAnswer | service_pb2.ModelInferResponse) -> bytes:
    """The answer frame of a planned model's RawAnswer, or of a response whose outputs are raw (an application's)."""
    if isinstance(answer, RawAnswer):
        tensors, parameters = answer.outputs, answer.parameters
    elif len(answer.raw_output_contents) == len(answer.outputs):
        tensors = tuple((o.name, o.datatype, o.shape, raw) for o, raw in zip(answer.outputs,
                                                                               answer.raw_output_contents))
        parameters = tuple((k, p.int64_param) for k, p in answer.parameters.items()
                           if p.WhichOneof("parameter_choice") == "int64_param")
    else:
        return encode_error(ident, grpc.StatusCode.INTERNAL, "the answer's outputs are not raw tensors")
    body = [_ID_CODE.pack(ident, 0), _U16.pack(len(tensors))]
    for name, datatype, shape, raw in tensors:
        body += [_s(name), _s(datatype), _U16.pack(len(shape)), struct.pack(f"<{len(shape)}q", *shape),
                 _U64.pack(len(raw)), raw]
    body.append(_U16.pack(len(parameters)))
    body += [_s(name) + _I64.pack(value) for name, value in parameters]
    return _frame(body)


def encode_error(ident: int, code: grpc.StatusCode | None, message: str) -> bytes:
    """The answer frame of an error, with the Triton error code of ``code`` (None: INTERNAL)."""
    return _frame([_ID_CODE.pack(ident, TRITON_CODES.get(code, 1)), _s(message)])
