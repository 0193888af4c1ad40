"""The model name read off a serialized ModelInferRequest (pass-through requests are forwarded undecoded)."""

from __future__ import annotations

import grpc
import pytest
from google.protobuf.message import DecodeError
from hypothesis import example, given, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2

from scheduler.server.common.errors import ServeError
from scheduler.server.common.wire import model_name, parse_request, serialize_response


def _request(name: str, tensors: list[bytes]) -> service_pb2.ModelInferRequest:
    req = service_pb2.ModelInferRequest(model_name=name, model_version="1", id="r")
    req.parameters["priority"].int64_param = 3
    req.parameters["timeout"].double_param = 1.5
    for i, raw in enumerate(tensors):
        req.inputs.add(name=f"in{i}", datatype="UINT8", shape=[1, len(raw)])
        req.raw_input_contents.append(raw)
    return req


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300), st.lists(st.binary(max_size=400), max_size=3))
def test_model_name_matches_protobuf(name: str, tensors: list[bytes]) -> None:
    data = _request(name, tensors).SerializeToString()
    assert model_name(data) == name
    assert parse_request(data).model_name == name


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
@example(b";<")  # an empty group of field 7: protobuf skips it as an unknown field (CI's hypothesis found it)
def test_any_bytes_parse_or_fail_cleanly(data: bytes) -> None:
    """Whatever protobuf accepts, the walk accepts with the same name; what it refuses is INVALID_ARGUMENT."""
    try:
        expected = service_pb2.ModelInferRequest.FromString(data).model_name
    except DecodeError:
        expected = None
    try:
        got = model_name(data)
    except ServeError as e:
        assert e.code == grpc.StatusCode.INVALID_ARGUMENT and "not a valid inference.ModelInferRequest" in e.message
        assert expected is None, "protobuf parsed what the walk refused"
        return
    if expected is not None:
        assert got == expected


def test_unknown_groups_are_skipped_as_protobuf_skips_them() -> None:
    name = service_pb2.ModelInferRequest(model_name="m").SerializeToString()
    group_with_a_name = b"\x0b" + service_pb2.ModelInferRequest(model_name="inner").SerializeToString() + b"\x0c"
    for data in (b";<" + name, name + b";C\x0a\x01xD<", name + group_with_a_name, name + b";" * 100 + b"<" * 100):
        assert model_name(data) == "m" == service_pb2.ModelInferRequest.FromString(data).model_name
    for data in (name + b"<", name + b";", name + b";D", name + b";" * 101 + b"<" * 101):
        with pytest.raises(DecodeError):
            service_pb2.ModelInferRequest.FromString(data)
        with pytest.raises(ServeError, match="not a valid inference.ModelInferRequest"):
            model_name(data)


def test_last_model_name_wins_and_errors_name_the_message() -> None:
    a = service_pb2.ModelInferRequest(model_name="first").SerializeToString()
    b = service_pb2.ModelInferRequest(model_name="second").SerializeToString()
    assert model_name(a + b) == "second" == service_pb2.ModelInferRequest.FromString(a + b).model_name
    with pytest.raises(ServeError, match="runs past the end"):
        model_name(a[:-2])
    with pytest.raises(ServeError, match="not a valid inference.ModelInferRequest"):
        parse_request(b"\x0a\x05ab")
    resp = service_pb2.ModelInferResponse(model_name="m")
    assert serialize_response(resp) == resp.SerializeToString() == serialize_response(resp.SerializeToString())
