"""Compression as Triton does it: HTTP response bodies in gzip or deflate when Accept-Encoding asks (and compressed
request bodies read), gRPC with --grpc-infer-response-compression-level and compressed requests; both checked on the
wire, by the bytes a TCP relay between tritonclient and the sidecar sees the sidecar send."""

from __future__ import annotations

import asyncio
import gzip
import json
import threading
import urllib.request
import zlib
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from poolpipe_common.net import free_port
from runtime.sidecar_process import SidecarProcess
from runtime.tritonserver import TritonProcess

pytestmark = pytest.mark.triton
MODELS = Path(__file__).resolve().parent / "models"
A = np.arange(16, dtype=np.int32).reshape(1, 16)


@pytest.fixture(scope="module")
def triton(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("compression")
    with TritonProcess(MODELS, log_path=tmp / "triton.log") as t:
        yield t


@pytest.fixture(scope="module")
def sidecar(triton: TritonProcess, tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("compressed")
    with SidecarProcess(passthrough=triton.grpc_url, log_path=tmp / "sidecar.log",
                        extra_args=("--grpc-infer-response-compression-level", "high")) as sc:
        yield sc


class Relay:
    """A TCP relay on loopback in front of ``target`` (HOST:PORT), on its own event loop in a thread: what passes
    through it goes unchanged; ``sent`` counts the bytes the target sent back as they arrive."""

    def __init__(self, target: str) -> None:
        self.host, _, port = target.rpartition(":")
        self.target_port, self.port, self.sent = int(port), free_port(), 0
        self.writers: set[asyncio.StreamWriter] = set()
        self.connections: set[asyncio.Task] = set()
        self.loop = asyncio.new_event_loop()
        self.server = self.loop.run_until_complete(asyncio.start_server(self._connection, "127.0.0.1", self.port))
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, count: bool) -> None:
        try:
            while data := await reader.read(65536):
                if count:
                    self.sent += len(data)
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections.add(asyncio.current_task())  # type: ignore[arg-type]
        up_reader, up_writer = await asyncio.open_connection(self.host, self.target_port)
        self.writers |= {writer, up_writer}
        await asyncio.gather(self._pump(reader, up_writer, False), self._pump(up_reader, writer, True))

    async def _shutdown(self) -> None:
        self.server.close()
        for w in self.writers:  # each pump then reads the end of its stream and returns
            w.close()
        await asyncio.gather(*self.connections, return_exceptions=True)

    def close(self) -> None:
        """Stop relaying: every connection closed, the loop and its thread ended."""
        asyncio.run_coroutine_threadsafe(self._shutdown(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


ZEROS = np.array([[b"0" * 4096] * 64], dtype=np.object_)  # a 256 KiB string tensor of zeros: very compressible


def _identity_bytes(url: str, mod, **kwargs: object) -> int:
    """The bytes the server behind ``url`` sends for one ``simple_identity`` inference of ZEROS (relayed), its answer
    checked."""
    relay = Relay(url)
    try:
        with mod.InferenceServerClient(relay.url) as c:
            inp = mod.InferInput("INPUT0", list(ZEROS.shape), "BYTES")
            inp.set_data_from_numpy(ZEROS)
            got = c.infer("simple_identity", [inp], **kwargs).as_numpy("OUTPUT0")
        np.testing.assert_array_equal(got, ZEROS)
        return relay.sent
    finally:
        relay.close()


def test_grpc_response_compression_shrinks_what_the_sidecar_sends(triton: TritonProcess, sidecar: SidecarProcess,
                                                                  tmp_path: Path) -> None:
    """--grpc-infer-response-compression-level high: the same answer takes a small fraction of the bytes on the wire
    (tritonclient's gRPC client accepts gzip, as every gRPC client announces by default)."""
    with SidecarProcess(passthrough=triton.grpc_url, log_path=tmp_path / "plain.log") as plain:
        uncompressed = _identity_bytes(plain.grpc_url, grpcclient)
    compressed = _identity_bytes(sidecar.grpc_url, grpcclient)
    assert uncompressed > ZEROS.size * 4096, uncompressed  # the whole answer went through the relay
    assert compressed < uncompressed / 20, (compressed, uncompressed)


def test_http_gzip_shrinks_what_the_sidecar_sends(sidecar: SidecarProcess) -> None:
    """An HTTP answer is compressed on the wire only when the client asks (Accept-Encoding)."""
    uncompressed = _identity_bytes(sidecar.http_url, httpclient)
    for coding in ("gzip", "deflate"):
        compressed = _identity_bytes(sidecar.http_url, httpclient, response_compression_algorithm=coding)
        assert compressed < uncompressed / 20, (coding, compressed, uncompressed)
    assert uncompressed > ZEROS.size * 4096, uncompressed


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
