"""tests/tools/libb64.c (libb64's interface, for perf_analyzer): what it encodes is standard base64, streamed in
pieces of any size; it decodes that back, skipping line breaks as libb64 does."""

from __future__ import annotations

import base64
import ctypes
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

SOURCE = Path(__file__).resolve().parent / "tools" / "libb64.c"


class _State(ctypes.Structure):
    _fields_ = [("step", ctypes.c_int), ("result", ctypes.c_char), ("stepcount", ctypes.c_int)]


@pytest.fixture(scope="module")
def lib(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    out = tmp_path_factory.mktemp("b64") / "libb64.so.0d"
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-Wall", "-Werror", "-o", str(out), str(SOURCE)], check=True)
    return ctypes.CDLL(str(out))


def _encode(lib: ctypes.CDLL, data: bytes, piece: int) -> bytes:
    state, out, n = _State(), ctypes.create_string_buffer(2 * len(data) + 8), 0
    lib.base64_init_encodestate(ctypes.byref(state))
    for i in range(0, len(data), piece):
        chunk = data[i:i + piece]
        n += lib.base64_encode_block(chunk, len(chunk), ctypes.byref(out, n), ctypes.byref(state))
    n += lib.base64_encode_blockend(ctypes.byref(out, n), ctypes.byref(state))
    return out.raw[:n]


def _decode(lib: ctypes.CDLL, code: bytes) -> bytes:
    state, out = _State(), ctypes.create_string_buffer(len(code) + 8)
    lib.base64_init_decodestate(ctypes.byref(state))
    n = lib.base64_decode_block(code, len(code), out, ctypes.byref(state))
    return out.raw[:n]


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=300), piece=st.integers(1, 7))
def test_libb64_is_standard_base64(lib: ctypes.CDLL, data: bytes, piece: int) -> None:
    code = _encode(lib, data, piece)
    assert code == base64.b64encode(data)
    wrapped = b"\n".join(code[i:i + 72] for i in range(0, len(code), 72))  # libb64 writes lines of 72
    assert _decode(lib, wrapped) == data
