"""A planned request's own parameters reach its stage models as Triton request parameters: the client's
(tritonclient's ``parameters=``) and the headers ``serve --grpc-header-forward-pattern`` /
``--http-header-forward-pattern`` turn into parameters. Each stage call carries those its rows agree on under their
own names, and each row's under ``poolpipe_row_parameters``; checked with Python-backend stage models on real
tritonservers that record what ``request.parameters()`` gives them, over HTTP and gRPC stage calls."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2

from model_repository_gen.generate import generate
from runtime.launch import Deployment
from runtime.sidecar_process import SidecarProcess
from scheduler.server.planned.stage_http import encode_call
from scheduler.server.planned.stage_io import infer_request
from scheduler.server.planned.stage_parameters import (
    ROW_PARAMETERS,
    custom_parameters,
    stage_parameters,
)
from tests.deploy_helpers import write_cluster
from tests.test_emulated import MODEL, SCALE, emulated_hosts, ppipe_plan

# A stage model that records each request's parameters (and its rows) before the partition backend runs it.
RECORDING = '''import json, sys
from pathlib import Path
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from partition_model import TritonPythonModel as Partition  # noqa: E402


class TritonPythonModel(Partition):
    def execute(self, requests):
        with open(HERE / "parameters.jsonl", "a") as f:
            for r in requests:
                f.write(json.dumps({"rows": r.inputs()[0].shape()[0], "parameters": json.loads(r.parameters())})
                        + "\\n")
        return super().execute(requests)
'''


def _params(**kinds: object) -> service_pb2.ModelInferRequest:
    req = service_pb2.ModelInferRequest()
    for key, (kind, value) in kinds.items():
        setattr(req.parameters[key], kind, value)
    return req


def test_custom_parameters_leave_out_what_triton_reserves() -> None:
    req = _params(tenant=("string_param", "blue"), n=("int64_param", 3), f=("bool_param", False),
                  priority=("int64_param", 1), timeout=("int64_param", 5), sequence_id=("int64_param", 0),
                  headers=("string_param", "x"), binary_data_output=("bool_param", True),
                  triton_enable_empty_final_response=("bool_param", True), poolpipe_row_parameters=("string_param", ""))
    assert custom_parameters(req.parameters) == {"tenant": "blue", "n": 3, "f": False}
    assert custom_parameters(_params(priority=("int64_param", 1)).parameters) is None


def test_a_stage_call_carries_what_its_rows_agree_on_and_each_rows_parameters() -> None:
    blue, red = {"x-tenant": "blue", "n": 1}, {"x-tenant": "red", "n": 1}
    got = stage_parameters([blue, blue, red, None], pad=1)
    assert {k: v for k, v in got.items() if k != ROW_PARAMETERS} == {}  # the fourth row has neither
    assert json.loads(got[ROW_PARAMETERS]) == [blue, blue, red, {}, {}]  # the padding row: none
    got = stage_parameters([blue, red])
    assert got["n"] == 1 and "x-tenant" not in got
    assert stage_parameters([{"n": 1}, {"n": True}]).keys() == {ROW_PARAMETERS}  # 1 and true differ in type
    assert stage_parameters([blue, blue]) == {**blue, ROW_PARAMETERS: json.dumps([blue, blue], separators=(",", ":"))}
    assert stage_parameters([None, None], pad=2) == {}  # nothing to carry: the call is as before


def test_both_stage_protocols_encode_them(tmp_path: Path) -> None:
    """gRPC takes an integer beyond int64 only as a double (tritonserver refuses a uint64 parameter)."""
    manifest = generate(ppipe_plan(), {}, write_cluster(tmp_path / "cluster.json", emulated_hosts()),
                        tmp_path / "deploy", emulated_tensor_scale=SCALE)
    stage = manifest.model(MODEL).pipelines[0].stages[1]
    params = {"s": "x", "i": -2, "b": True, "d": 0.5, "u": 2**64 - 1}
    req, _ = infer_request(stage, [], None, 1, "r", params)
    kinds = {k: p.WhichOneof("parameter_choice") for k, p in req.parameters.items()}
    assert kinds == {"s": "string_param", "i": "int64_param", "b": "bool_param", "d": "double_param",
                     "u": "double_param"}
    head, _, _ = encode_call(stage, [], None, 1, "r", params)
    assert json.loads(head)["parameters"] == params
    assert "parameters" not in json.loads(encode_call(stage, [], None, 1, "r")[0])


def _recorded(deploy: Path) -> dict[str, list[dict]]:
    """Stage model -> what each of its requests recorded, in order."""
    out: dict[str, list[dict]] = {}
    for f in sorted(deploy.rglob("parameters.jsonl")):
        out.setdefault(f.parents[1].name, []).extend(json.loads(x) for x in f.read_text().splitlines())
    return out


def _infer(mod, url: str, tenant: str, rows: int, **kwargs: object) -> None:
    x = np.zeros((rows, 3, 22, 22), np.float32)
    i = mod.InferInput("input", list(x.shape), "FP32")
    i.set_data_from_numpy(x)
    with mod.InferenceServerClient(url) as c:
        c.infer(MODEL, [i], headers={"x-tenant": tenant, "x-other": "not forwarded"}, **kwargs)


def _split(params: dict, rows: int = 0) -> tuple[dict, list]:
    """A call's parameters as (its own, each row's); with ``rows``: those of a request with ``params`` and ``rows``
    rows, alone in its batch."""
    if rows:
        return params, [params] * rows
    own = dict(params)
    return own, json.loads(own.pop(ROW_PARAMETERS, "[]"))


def _check_calls(calls: list[dict]) -> None:
    """Each call's own parameters are exactly those all its rows agree on, and it lists one entry per row (the
    sidecar's calibration calls carry none)."""
    for call in filter(lambda c: c["parameters"], calls):
        p = dict(call["parameters"])
        rows = json.loads(p.pop(ROW_PARAMETERS))
        assert len(rows) == call["rows"], call
        real = [r for r in rows if r]
        assert p == {k: v for k, v in real[0].items() if all(r.get(k) == v for r in real)}, call


@pytest.mark.triton
def test_forwarded_headers_and_client_parameters_reach_every_stage_model(tmp_path: Path) -> None:
    """Over HTTP and gRPC stage calls, from the sidecar's gRPC and HTTP ports: a request's forwarded header and its
    own parameter reach every stage model (before, no stage call carried any parameter), and concurrent requests of
    different tenants each reach them, whatever batches they shared."""
    manifest = generate(ppipe_plan(slo_us=2_000_000.0), {}, write_cluster(tmp_path / "cluster.json",
                                                                           emulated_hosts()),
                        tmp_path / "deploy", emulated_tensor_scale=SCALE, emulated_backend="python")
    stages = [s.triton_model for s in manifest.model(MODEL).pipelines[0].stages]
    for model_py in (tmp_path / "deploy").rglob("1/model.py"):
        model_py.rename(model_py.with_name("partition_model.py"))
        model_py.write_text(RECORDING)
    pattern = ("--grpc-header-forward-pattern", "^x-tenant", "--http-header-forward-pattern", "^x-tenant")
    with Deployment(tmp_path / "deploy", log_dir=tmp_path / "logs", check_hardware=False):
        for protocol in ("http", "grpc"):
            with SidecarProcess(manifest=tmp_path / "deploy", log_path=tmp_path / f"{protocol}.log",
                                extra_args=(*pattern, "--stage-protocol", protocol)) as sc:
                sc.wait_ready()
                _infer(grpcclient, sc.grpc_url, f"{protocol}-g", 2, parameters={"tag": 7})
                _infer(httpclient, sc.http_url, f"{protocol}-h", 1, parameters={"tag": "h"})
                threads = [threading.Thread(target=_infer, args=(grpcclient, sc.grpc_url, f"{protocol}-{n}", 1))
                           for n in range(6)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
    recorded = _recorded(tmp_path / "deploy")
    assert sorted(recorded) == sorted(stages)
    for model, calls in recorded.items():
        _check_calls(calls)
        for protocol in ("http", "grpc"):
            g = {"x-tenant": f"{protocol}-g", "tag": 7}
            h = {"x-tenant": f"{protocol}-h", "tag": "h"}
            got = [_split(c["parameters"]) for c in calls]
            assert _split(g, 2) in got and _split(h, 1) in got, (model, protocol, got)  # the whole request, alone
            seen = {r.get("x-tenant") for _, rows in got for r in rows}
            assert {f"{protocol}-{n}" for n in range(6)} <= seen, (model, protocol, seen)
        assert all("x-other" not in c["parameters"] for c in calls)  # not matching the pattern: not a parameter
