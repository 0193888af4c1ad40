"""The sidecar in pass-through mode in front of a real tritonserver serving Triton's example ``simple`` model:
the checks of Triton's simple_grpc_* / simple_http_* client examples (health and metadata, sync, async and
asyncio inference, system shared memory), run unchanged against the sidecar."""

from __future__ import annotations

import asyncio
import json
import os
import queue
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
import tritonclient.http.aio as httpaio
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from runtime.sidecar_process import SidecarProcess
from runtime.tritonserver import TritonProcess

pytestmark = pytest.mark.triton
MODELS = Path(__file__).resolve().parent / "models"


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("passthrough")
    with TritonProcess(MODELS, log_path=tmp / "triton.log") as triton:
        with SidecarProcess(passthrough=triton.grpc_url, log_path=tmp / "sidecar.log") as sc:
            yield sc


def _inputs(mod, a: np.ndarray, b: np.ndarray) -> list:
    i0, i1 = mod.InferInput("INPUT0", [1, 16], "INT32"), mod.InferInput("INPUT1", [1, 16], "INT32")
    i0.set_data_from_numpy(a)
    i1.set_data_from_numpy(b)
    return [i0, i1]


A = np.arange(16, dtype=np.int32).reshape(1, 16)
B = np.ones((1, 16), dtype=np.int32)


def _check(result) -> None:
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), A - B)


@pytest.mark.parametrize("mod,url", [(grpcclient, "grpc_url"), (httpclient, "http_url")])
def test_health_and_metadata(sidecar: SidecarProcess, mod, url) -> None:
    c = mod.InferenceServerClient(getattr(sidecar, url))
    assert c.is_server_live() and c.is_server_ready() and c.is_model_ready("simple")
    meta = c.get_server_metadata()
    name = meta.name if mod is grpcclient else meta["name"]
    assert name == "triton"  # Triton's own example insists on this; management calls pass through unchanged
    mm = c.get_model_metadata("simple")
    if mod is grpcclient:
        assert mm.name == "simple" and [i.name for i in mm.inputs] == ["INPUT0", "INPUT1"]
        cfg = c.get_model_config("simple").config
        assert cfg.max_batch_size == 8 and list(cfg.input[0].dims) == [16]
        stats = c.get_inference_statistics("simple")
        assert stats.model_stats[0].name == "simple"
    else:
        assert mm["name"] == "simple" and [i["shape"] for i in mm["inputs"]] == [[-1, 16], [-1, 16]]
        cfg = c.get_model_config("simple")
        assert cfg["max_batch_size"] == 8 and cfg["input"][0]["dims"] == [16]
        stats = c.get_inference_statistics("simple")
        assert stats["model_stats"][0]["name"] == "simple"
    assert not c.is_model_ready("no_such_model")
    with pytest.raises(InferenceServerException, match="no_such_model"):
        c.get_model_metadata("no_such_model")
    assert c.get_trace_settings()  # trace and log settings are management calls: passed through
    log = c.get_log_settings()
    assert "log_verbose_level" in (log.settings if mod is grpcclient else log)
    index = c.get_model_repository_index()
    names = [m.name for m in index.models] if mod is grpcclient else [m["name"] for m in index]
    assert "simple" in names


@pytest.mark.parametrize("mod,url", [(grpcclient, "grpc_url"), (httpclient, "http_url")])
def test_sync_and_async_infer(sidecar: SidecarProcess, mod, url) -> None:
    c = mod.InferenceServerClient(getattr(sidecar, url), concurrency=4) if mod is httpclient else \
        mod.InferenceServerClient(getattr(sidecar, url))
    outputs = [mod.InferRequestedOutput("OUTPUT0"), mod.InferRequestedOutput("OUTPUT1")]
    _check(c.infer("simple", _inputs(mod, A, B), outputs=outputs))
    _check(c.infer("simple", _inputs(mod, A, B)))  # all outputs, default format
    if mod is grpcclient:
        done: queue.Queue = queue.Queue()
        for _ in range(4):
            c.async_infer("simple", _inputs(mod, A, B), lambda result, error: done.put((result, error)),
                          outputs=outputs)
        for _ in range(4):
            r, e = done.get(timeout=30)
            assert e is None
            _check(r)
    else:
        pending = [c.async_infer("simple", _inputs(mod, A, B), outputs=outputs) for _ in range(4)]
        for p in pending:
            _check(p.get_result())
    with pytest.raises(InferenceServerException, match="INPUT0"):
        bad = mod.InferInput("INPUT0", [1, 15], "INT32")
        bad.set_data_from_numpy(np.zeros((1, 15), np.int32))
        c.infer("simple", [bad, _inputs(mod, A, B)[1]])


def test_http_json_tensors(sidecar: SidecarProcess) -> None:
    """curl-style JSON without the binary extension (inputs and outputs as JSON data)."""
    body = {"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": A.ravel().tolist()},
                       {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": B.tolist()}],
            "outputs": [{"name": "OUTPUT0"}]}
    req = urllib.request.Request(f"http://{sidecar.http_url}/v2/models/simple/infer", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        out = json.loads(r.read())
    assert out["model_name"] == "simple"
    assert out["outputs"] == [{"name": "OUTPUT0", "datatype": "INT32", "shape": [1, 16],
                               "data": (A + B).ravel().tolist()}]
    bad = urllib.request.Request(f"http://{sidecar.http_url}/v2/models/simple/infer", data=b"{not json")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(bad, timeout=10)
    assert e.value.code == 400 and "JSON" in json.loads(e.value.read())["error"]


def test_asyncio_clients(sidecar: SidecarProcess) -> None:
    async def main() -> None:
        g = grpcaio.InferenceServerClient(sidecar.grpc_url)
        h = httpaio.InferenceServerClient(sidecar.http_url)
        try:
            assert await g.is_server_live() and await h.is_server_ready()
            results = await asyncio.gather(*[g.infer("simple", _inputs(grpcclient, A, B)) for _ in range(8)],
                                           *[h.infer("simple", _inputs(httpclient, A, B)) for _ in range(8)])
            for r in results:
                _check(r)
        finally:
            await g.close()
            await h.close()
    asyncio.run(main())


@pytest.mark.parametrize("mod,url", [(grpcclient, "grpc_url"), (httpclient, "http_url")])
def test_system_shared_memory(sidecar: SidecarProcess, mod, url) -> None:
    """As simple_*_shm_client.py: inputs in one region at two offsets, outputs in another."""
    c = mod.InferenceServerClient(getattr(sidecar, url))
    tag = f"{os.getpid()}_{mod.__name__.split('.')[-1]}"
    c.unregister_system_shared_memory()
    nbytes = A.nbytes
    out_h = shm.create_shared_memory_region(f"output_data_{tag}", f"/output_simple_{tag}", nbytes * 2)
    in_h = shm.create_shared_memory_region(f"input_data_{tag}", f"/input_simple_{tag}", nbytes * 2)
    try:
        shm.set_shared_memory_region(in_h, [A])
        shm.set_shared_memory_region(in_h, [B], offset=nbytes)
        c.register_system_shared_memory(f"output_data_{tag}", f"/output_simple_{tag}", nbytes * 2)
        c.register_system_shared_memory(f"input_data_{tag}", f"/input_simple_{tag}", nbytes * 2)
        status = c.get_system_shared_memory_status()
        names = list(status.regions) if mod is grpcclient else [r["name"] for r in status]
        assert sorted(names) == sorted([f"output_data_{tag}", f"input_data_{tag}"])
        inputs = [mod.InferInput("INPUT0", [1, 16], "INT32"), mod.InferInput("INPUT1", [1, 16], "INT32")]
        inputs[0].set_shared_memory(f"input_data_{tag}", nbytes)
        inputs[1].set_shared_memory(f"input_data_{tag}", nbytes, offset=nbytes)
        outputs = [mod.InferRequestedOutput("OUTPUT0", **({} if mod is grpcclient else {"binary_data": True})),
                   mod.InferRequestedOutput("OUTPUT1", **({} if mod is grpcclient else {"binary_data": True}))]
        outputs[0].set_shared_memory(f"output_data_{tag}", nbytes)
        outputs[1].set_shared_memory(f"output_data_{tag}", nbytes, offset=nbytes)
        result = c.infer("simple", inputs, outputs=outputs)
        o0 = result.get_output("OUTPUT0")
        shape = list(o0.shape) if mod is grpcclient else o0["shape"]
        out0 = shm.get_contents_as_numpy(out_h, np.int32, shape)
        out1 = shm.get_contents_as_numpy(out_h, np.int32, shape, offset=nbytes)
        np.testing.assert_array_equal(out0, A + B)
        np.testing.assert_array_equal(out1, A - B)
        c.unregister_system_shared_memory()
        status = c.get_system_shared_memory_status()
        assert len(status.regions if mod is grpcclient else status) == 0
    finally:
        shm.destroy_shared_memory_region(out_h)
        shm.destroy_shared_memory_region(in_h)
