"""Triton's reserved sequence parameters on a planned model (stateless: no sequence batcher) are refused with
INVALID_ARGUMENT naming the parameter, over gRPC, HTTP and the native front end; a request without a sequence
(tritonclient's sequence_id 0) is served."""

from __future__ import annotations

from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

from backends import native_front
from poolpipe_common.net import free_ports
from runtime.launch import Deployment
from runtime.sidecar_process import SidecarProcess
from runtime.testbed import EMULATED_MODEL, build_emulated_deployment
from scheduler.server.common.errors import ServeError
from scheduler.server.front.native_front import priority_lost
from scheduler.server.front.reserved import refuse_sequences


@pytest.mark.parametrize("name,value,refused", [("sequence_id", 7, True), ("sequence_id", "abc", True),
                                                ("sequence_start", True, True), ("sequence_end", True, True),
                                                ("sequence_id", 0, False), ("sequence_start", False, False),
                                                ("priority", 1, False)])
def test_only_a_set_sequence_parameter_is_refused(name: str, value, refused: bool) -> None:
    req = service_pb2.ModelInferRequest()
    p = req.parameters[name]
    if isinstance(value, bool):
        p.bool_param = value
    elif isinstance(value, int):
        p.int64_param = value
    else:
        p.string_param = value
    if not refused:
        refuse_sequences("m", req.parameters)
        return
    with pytest.raises(ServeError) as e:
        refuse_sequences("m", req.parameters)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and f"'{name}'" in e.value.message
    assert "stateless" in e.value.message


def test_native_front_names_the_models_whose_priority_it_cannot_carry() -> None:
    from tritonclient.grpc import model_config_pb2 as mc
    plain, levels = mc.ModelConfig(name="a"), mc.ModelConfig(name="b")
    levels.dynamic_batching.priority_levels = 2
    assert priority_lost([plain, levels]) == ["b"]


def _input(mod, client):
    meta = client.get_model_metadata(EMULATED_MODEL)
    first = meta.inputs[0] if mod is grpcclient else meta["inputs"][0]
    name, dims = (first.name, first.shape) if mod is grpcclient else (first["name"], first["shape"])
    shape = [1, *[int(d) for d in dims[1:]]]
    inp = mod.InferInput(name, shape, "FP32")
    inp.set_data_from_numpy(np.zeros(shape, np.float32))
    return inp


@pytest.mark.triton
def test_sequence_parameters_are_refused_on_every_front_end(tmp_path: Path) -> None:
    deploy = build_emulated_deployment(tmp_path, slo_us=3_000_000.0)
    native = native_front.library() is not None
    port, = free_ports(1)
    extra = ("--native-grpc-port", str(port)) if native else ()
    with Deployment(deploy, check_hardware=False, log_dir=tmp_path / "logs"), \
            SidecarProcess(manifest=deploy, log_path=tmp_path / "sidecar.log", extra_args=extra) as sc:
        sc.wait_ready()
        urls = [(grpcclient, sc.grpc_url), (httpclient, sc.http_url)]
        if native:
            urls.append((grpcclient, f"127.0.0.1:{port}"))
        for mod, url in urls:
            c = mod.InferenceServerClient(url)
            inp = _input(mod, c)
            assert c.infer(EMULATED_MODEL, [inp], sequence_id=0) is not None  # no sequence: served
            for kwargs in ({"sequence_id": 42}, {"sequence_id": "abc"}, {"sequence_id": 42, "sequence_start": True}):
                with pytest.raises(InferenceServerException, match="sequence_id") as e:
                    c.infer(EMULATED_MODEL, [inp], **kwargs)
                assert "stateless" in str(e.value), (url, e.value)
                if mod is grpcclient:
                    assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
            assert c.infer(EMULATED_MODEL, [inp]) is not None  # and it keeps serving
