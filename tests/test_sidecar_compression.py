"""Compression as Triton does it: HTTP response bodies in gzip or deflate when Accept-Encoding asks (and compressed
request bodies read), gRPC with --grpc-infer-response-compression-level and compressed requests."""

from __future__ import annotations

import gzip
import json
import urllib.request
import zlib
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from runtime.sidecar_process import SidecarProcess
from runtime.tritonserver import TritonProcess

pytestmark = pytest.mark.triton
MODELS = Path(__file__).resolve().parent / "models"
A = np.arange(16, dtype=np.int32).reshape(1, 16)


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("compression")
    with TritonProcess(MODELS, log_path=tmp / "triton.log") as triton, \
            SidecarProcess(passthrough=triton.grpc_url, log_path=tmp / "sidecar.log",
                           extra_args=("--grpc-infer-response-compression-level", "high")) as sc:
        yield sc


def _post(url: str, body: dict, accept: str | None) -> tuple[str | None, bytes]:
    headers = {"Content-Type": "application/json"} | ({"Accept-Encoding": accept} if accept else {})
    req = urllib.request.Request(f"http://{url}/v2/models/simple/infer", data=json.dumps(body).encode(),
                                 headers=headers)
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.headers.get("Content-Encoding"), r.read()


@pytest.mark.parametrize("accept,coding,decompress", [("gzip", "gzip", gzip.decompress),
                                                      ("deflate", "deflate", zlib.decompress),
                                                      (None, None, lambda b: b)])
def test_http_bodies_are_compressed_as_the_client_accepts(sidecar: SidecarProcess, accept, coding,
                                                          decompress) -> None:
    body = {"inputs": [{"name": n, "shape": [1, 16], "datatype": "INT32", "data": A.ravel().tolist()}
                       for n in ("INPUT0", "INPUT1")]}
    got, raw = _post(sidecar.http_url, body, accept)
    assert got == coding
    out = {o["name"]: o["data"] for o in json.loads(decompress(raw))["outputs"]}
    assert out["OUTPUT0"] == (2 * A).ravel().tolist()


def _inputs(mod) -> list:
    inputs = [mod.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    for i in inputs:
        i.set_data_from_numpy(A)
    return inputs


@pytest.mark.parametrize("request_coding,response_coding", [("gzip", "deflate"), ("deflate", "gzip")])
def test_tritonclient_http_compression(sidecar: SidecarProcess, request_coding: str, response_coding: str) -> None:
    c = httpclient.InferenceServerClient(sidecar.http_url)
    r = c.infer("simple", _inputs(httpclient), request_compression_algorithm=request_coding,
                response_compression_algorithm=response_coding)
    np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), 2 * A)


def test_grpc_compressed_both_ways(sidecar: SidecarProcess) -> None:
    c = grpcclient.InferenceServerClient(sidecar.grpc_url)
    for algorithm in ("gzip", "deflate", None):
        r = c.infer("simple", _inputs(grpcclient), compression_algorithm=algorithm)
        np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), 2 * A)
