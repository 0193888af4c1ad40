"""Traces of planned requests: `serve --trace-config` (tritonserver's syntax), sampling and the trace extension's
settings, the span tree (OpenTelemetry SDK, in-memory exporter), and a live sidecar exporting over OTLP/HTTP to a
receiver on loopback: one span per stage with its send/compute/response, the hops, and the shed reason."""

from __future__ import annotations

import gzip
import http.server
import json
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from tritonclient.utils import InferenceServerException

from model_repository_gen.generate import generate
from poolpipe_common.errors import InputError
from poolpipe_common.net import free_port
from runtime.launch import Deployment
from runtime.sidecar_process import SidecarProcess
from scheduler.server.common.trace_settings import Sampling, TraceSettings, parse_trace_config
from scheduler.server.common.tracing import CallTrace, DispatchTraces, Tracer
from tests.conftest import run_cli
from tests.deploy_helpers import write_cluster
from tests.test_emulated import MODEL, SCALE, emulated_hosts, ppipe_plan

CLIENT_SPAN = "00f067aa0ba902b7"  # the span id of the client's traceparent


def test_trace_config_takes_tritonservers_syntax():
    cfg = parse_trace_config(["mode=opentelemetry", "level=TIMESTAMPS", "rate=10", "count=5",
                              "opentelemetry,url=127.0.0.1:4318/v1/traces", "opentelemetry,resource=service.name=sc1",
                              "opentelemetry,bsp_schedule_delay=100"])
    assert cfg.sampling == Sampling("TIMESTAMPS", 10, 5)
    assert cfg.url == "http://127.0.0.1:4318/v1/traces" and cfg.resource["service.name"] == "sc1"
    assert cfg.bsp["bsp_schedule_delay"] == 100
    assert parse_trace_config([]).sampling.level == "OFF"  # off by default
    for bad, msg in (("mode=triton", "OpenTelemetry only"), ("triton,file=/tmp/t.json", "OpenTelemetry only"),
                     ("level=TENSORS", "TENSORS level is not supported"), ("rate=x", "expected an integer"),
                     ("count=-2", "must be >= -1"), ("levle=OFF", "unknown setting 'levle'"),
                     ("opentelemetry,urll=x", "unknown opentelemetry setting"), ("rate", "SETTING=VALUE")):
        with pytest.raises(InputError, match=msg):
            parse_trace_config([bad])
    r = run_cli("serve", "--passthrough", "127.0.0.1:1", "--trace-config", "level=TENSORS")
    assert r.returncode == 2 and "TENSORS level is not supported" in r.stderr


def test_sampling_rate_count_and_per_model_settings():
    s = TraceSettings(Sampling("TIMESTAMPS", 3, 2))
    assert [s.sample("m") for _ in range(9)] == [False, False, True, False, False, True, False, False, False]
    assert s.global_.count == 0
    s.update("", {"trace_count": ["-1"], "trace_rate": ["1"]})
    assert all(s.sample("m") for _ in range(3))
    got = s.update("m", {"trace_level": ["OFF"]})  # a model's own settings start from the global ones
    assert got["trace_level"] == ["OFF"] and got["trace_rate"] == ["1"] and not s.sample("m") and s.sample("other")
    assert s.update("m", {})["trace_level"] == ["TIMESTAMPS"]  # no settings: the model follows the global again
    s.update("", {"trace_level": ["OFF"]})
    assert not s.on
    assert s.update("", {"trace_level": None})["trace_level"] == ["TIMESTAMPS"]  # cleared: back to --trace-config
    with pytest.raises(InputError, match="unknown trace setting 'trace_file'"):
        s.update("", {"trace_file": ["/tmp/x"]})


def test_span_tree_of_a_two_stage_request():
    mem = InMemorySpanExporter()
    tracer = Tracer(parse_trace_config(["level=TIMESTAMPS", "rate=1"]), exporter=mem)
    ct = tracer.start("m", "req-1", 1000.0, {"poolpipe.rows": 1})
    call = SimpleNamespace(trace=ct)
    dt = DispatchTraces.of([call, call], 7, "m/0", 1500.0)  # two rows of one call: one trace, once
    t0 = SimpleNamespace(ready_us=1500.0, send_us=1510.0, start_us=1600.0, end_us=2600.0, recv_us=2700.0)
    t1 = SimpleNamespace(ready_us=2700.0, send_us=2750.0, start_us=2800.0, end_us=3800.0, recv_us=3900.0)
    called = [dt.call_context(0), dt.call_context(1)]  # each stage call's traceparent, before it goes out
    dt.stage(0, "m_p0", "a0", "127.0.0.1:1", None, t0)
    dt.stage(1, "m_p1", "b0", "127.0.0.2:1", "grpc", t1)
    tracer.finish(ct, 4000.0)
    spans = {s.name: s for s in mem.get_finished_spans()}
    assert sorted(spans) == sorted(["InferRequest", "queue", "dispatch", "stage 0: m_p0", "stage 1: m_p1", "hop 0->1",
                                    "send", "compute", "response"])  # send/compute/response once per stage (by name)
    assert len(mem.get_finished_spans()) == 12
    root = spans["InferRequest"]
    parent = {s.context.span_id: s for s in mem.get_finished_spans()}
    assert spans["queue"].parent.span_id == root.context.span_id
    assert spans["stage 1: m_p1"].parent.span_id == spans["dispatch"].context.span_id
    assert spans["hop 0->1"].attributes["poolpipe.hop"] == "grpc"
    computes = [s for s in mem.get_finished_spans() if s.name == "compute"]
    assert sorted(parent[s.parent.span_id].name for s in computes) == ["stage 0: m_p0", "stage 1: m_p1"]
    assert (computes[0].end_time - computes[0].start_time) == 1_000_000  # 1000 µs, in ns
    assert spans["queue"].end_time - spans["queue"].start_time == 500_000
    assert root.attributes["triton.model_name"] == "m" and root.status.is_ok
    for k, tp in enumerate(called):  # the request's trace, the stage's span as the parent, sampled
        stage = next(s for s in mem.get_finished_spans() if s.name.startswith(f"stage {k}:"))
        assert tp == f"00-{root.context.trace_id:032x}-{stage.context.span_id:016x}-01"


def test_a_stage_call_of_several_traced_requests_carries_the_first_ones_context():
    mem = InMemorySpanExporter()
    tracer = Tracer(parse_trace_config(["level=TIMESTAMPS", "rate=1"]), exporter=mem)
    client = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    a = SimpleNamespace(trace=CallTrace("m", "a", 1000.0, {}, client))  # came with the client's traceparent
    b = SimpleNamespace(trace=CallTrace("m", "b", 1000.0, {}))
    dt = DispatchTraces.of([a, b], 1, "m/0", 1500.0)
    tp = dt.call_context(0)
    dt.stage(0, "m_p0", "a0", "127.0.0.1:1", None, SimpleNamespace(ready_us=1500.0, send_us=1510.0, start_us=1600.0,
                                                                    end_us=2600.0, recv_us=2700.0))
    tracer.finish(a.trace, 3000.0)
    tracer.finish(b.trace, 3000.0)
    stages = {s.context.trace_id: s for s in mem.get_finished_spans() if s.name == "stage 0: m_p0"}
    first = stages[int(client[3:35], 16)]
    assert tp == f"{client[:35]}-{first.context.span_id:016x}-01"
    assert len(stages) == 2 and f"{stages[b.trace.trace_id].context.span_id:016x}" not in tp  # b's: in b's trace


class _Receiver(http.server.BaseHTTPRequestHandler):
    """An OTLP/HTTP trace receiver: keeps every exported span (the sidecar's, protobuf; tritonserver's, JSON with hex
    ids, kept as dicts in ``triton``)."""

    spans: list = []
    triton: list = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        if self.headers.get("Content-Type") == "application/json":
            for rs in json.loads(body).get("resourceSpans", []):
                for ss in rs.get("scopeSpans", []):
                    type(self).triton.extend(ss.get("spans", []))
        else:
            for rs in ExportTraceServiceRequest.FromString(body).resource_spans:
                for ss in rs.scope_spans:
                    type(self).spans.extend(ss.spans)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def _wait_spans(n_roots: int, timeout_s: float = 20.0) -> list:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if sum(1 for s in _Receiver.spans if s.name == "InferRequest") >= n_roots:
            time.sleep(0.3)  # the rest of that export
            return list(_Receiver.spans)
        time.sleep(0.05)
    return list(_Receiver.spans)


@pytest.mark.triton
def test_live_trace_has_one_span_per_stage_and_the_shed_reason(tmp_path: Path) -> None:
    port = free_port()
    receiver = http.server.ThreadingHTTPServer(("127.0.0.1", port), _Receiver)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    _Receiver.spans = []
    cluster = write_cluster(tmp_path / "cluster.json", emulated_hosts())
    manifest = generate(ppipe_plan(), {}, cluster, tmp_path / "deploy", emulated_tensor_scale=SCALE)
    stages = [s.triton_model for s in manifest.model(MODEL).pipelines[0].stages]
    flags = ("--trace-config", "mode=opentelemetry", "--trace-config", "level=TIMESTAMPS", "--trace-config", "rate=1",
             "--trace-config", f"opentelemetry,url=http://127.0.0.1:{port}/v1/traces",
             "--trace-config", "opentelemetry,bsp_schedule_delay=50")
    x = np.zeros((1, 3, 22, 22), np.float32)
    try:
        with Deployment(tmp_path / "deploy", log_dir=tmp_path / "logs"):
            sc = SidecarProcess(manifest=tmp_path / "deploy", log_path=tmp_path / "sidecar.log", extra_args=flags)
            sc.start().wait_ready()
            try:
                with grpcclient.InferenceServerClient(sc.grpc_url) as c:
                    i = grpcclient.InferInput("input", [1, 3, 22, 22], "FP32")
                    i.set_data_from_numpy(x)
                    c.infer(MODEL, [i], request_id="traced-1")
                    spans = _wait_spans(1)
                    with pytest.raises(InferenceServerException, match="shed"):
                        c.infer(MODEL, [i], request_id="shed-1", timeout=1000)  # no path meets 1 ms
                    shed_spans = _wait_spans(2)
                    assert c.get_trace_settings(as_json=True)["settings"]["trace_rate"]["value"] == ["1"]
                    c.update_trace_settings(settings={"trace_level": ["OFF"]})
                    n = len(_wait_spans(2))
                    c.infer(MODEL, [i], request_id="untraced")
                    time.sleep(0.5)
                with httpclient.InferenceServerClient(sc.http_url) as h:
                    got = h.get_trace_settings()
                    assert got["trace_level"] == ["OFF"] and got["trace_mode"] == "opentelemetry"
                    with pytest.raises(InferenceServerException, match="unknown trace setting"):
                        h.update_trace_settings(settings={"trace_file": "/tmp/t.json"})
            finally:
                assert sc.stop() == 0
    finally:
        receiver.shutdown()
        receiver.server_close()
    assert len(_Receiver.spans) == n, "nothing is traced once the level is OFF"
    root = next(s for s in spans if s.name == "InferRequest")
    mine = [s for s in spans if s.trace_id == root.trace_id]
    by_id = {s.span_id: s for s in mine}
    names = [s.name for s in mine]
    for k, m in enumerate(stages):  # one span per stage, with its send, compute and response
        stage = [s for s in mine if s.name == f"stage {k}: {m}"]
        assert len(stage) == 1, names
        kids = sorted(s.name for s in mine if s.parent_span_id == stage[0].span_id)
        assert kids == ["compute", "response", "send"]
        assert by_id[stage[0].parent_span_id].name == "dispatch"
    hops = {s.name: s for s in mine if s.name.startswith("hop")}
    attr = {n: {a.key: a.value.string_value for a in s.attributes}["poolpipe.hop"] for n, s in hops.items()}
    assert attr == {"hop 0->1": "http", "hop 1->2": "shm"}  # T4 box -> L4 box in the HTTP stage call, L4 -> L4 in shm
    assert {a.key: a.value.string_value for a in root.attributes}["triton.request_id"] == "traced-1"
    assert "queue" in names and root.end_time_unix_nano > root.start_time_unix_nano
    shed_root = next(s for s in shed_spans if s.name == "InferRequest" and s.trace_id != root.trace_id)
    assert shed_root.status.code == 2 and "shed to protect the SLO" in shed_root.status.message  # STATUS_CODE_ERROR
    assert "Traceback" not in (tmp_path / "sidecar.log").read_text()


def _otel_flags(port: int) -> tuple[str, ...]:
    return tuple(f"--trace-config={c}" for c in ("mode=opentelemetry", "level=TIMESTAMPS", "rate=1",
                                                   f"opentelemetry,url=127.0.0.1:{port}/v1/traces",
                                                   "opentelemetry,bsp_schedule_delay=50"))


def _links(trace_id: str, want: set[str], timeout_s: float) -> set[str]:
    """The sidecar's stage spans of one trace that a Triton server's request span names as its parent ("elsewhere":
    a Triton span of the trace whose parent is no stage span), once all of ``want`` are in or ``timeout_s`` passed."""
    end = time.monotonic() + timeout_s
    while True:
        mine = [s for s in _Receiver.spans if s.trace_id.hex() == trace_id]
        stage_spans = {s.span_id.hex(): s.name for s in mine if s.name.startswith("stage ")}
        got = {stage_spans.get(s["parentSpanId"], "elsewhere") for s in list(_Receiver.triton)
               if s["traceId"] == trace_id and s["name"] == "InferRequest"}
        if any(s.name == "InferRequest" for s in mine) and got >= want or time.monotonic() > end:
            return got
        time.sleep(0.05)


def _root(request_id: str, timeout_s: float = 60.0):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        for s in list(_Receiver.spans):
            if s.name == "InferRequest" and any(a.key == "triton.request_id" and a.value.string_value == request_id
                                                for a in s.attributes):
                return s
        time.sleep(0.05)
    raise AssertionError(f"no span of request {request_id}")


@pytest.mark.triton
def test_stage_calls_carry_the_trace_to_the_triton_servers(tmp_path: Path) -> None:
    """Every stage call of a traced request carries a W3C traceparent: a Triton server tracing in OpenTelemetry mode
    shows the client's trace id, with the sidecar's span of that stage as the parent of its own request span; without
    a client traceparent, the sidecar's own trace goes on there. Over HTTP (the default stage protocol) every call;
    over gRPC (--stage-protocol grpc) tritonserver's gRPC front end itself starts a trace of its own for a few calls
    (3 in 80 from tritonclient straight to it), so each stage must show the trace in one of a few requests."""
    port = free_port()
    receiver = http.server.ThreadingHTTPServer(("127.0.0.1", port), _Receiver)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    _Receiver.spans, _Receiver.triton = [], []
    cluster = write_cluster(tmp_path / "cluster.json", emulated_hosts())
    manifest = generate(ppipe_plan(), {}, cluster, tmp_path / "deploy", emulated_tensor_scale=SCALE)
    want = {f"stage {k}: {s.triton_model}" for k, s in enumerate(manifest.model(MODEL).pipelines[0].stages)}
    i = grpcclient.InferInput("input", [1, 3, 22, 22], "FP32")
    i.set_data_from_numpy(np.zeros((1, 3, 22, 22), np.float32))
    got: dict[str, set[str]] = {"http": set(), "own": set(), "grpc": set()}
    try:
        with Deployment(tmp_path / "deploy", log_dir=tmp_path / "logs", triton_args=_otel_flags(port)):
            for protocol in ("http", "grpc"):
                with SidecarProcess(manifest=tmp_path / "deploy", log_path=tmp_path / f"{protocol}.log",
                                    extra_args=(*_otel_flags(port), "--stage-protocol", protocol)) as sc, \
                        grpcclient.InferenceServerClient(sc.wait_ready().grpc_url) as c:
                    for n in range(1 if protocol == "http" else 6):
                        trace_id = f"{'a' if protocol == 'http' else 'b'}{n + 1:031x}"  # the client's
                        c.infer(MODEL, [i], request_id=f"{protocol}-{n}",
                                headers={"traceparent": f"00-{trace_id}-{CLIENT_SPAN}-01"})
                        assert _root(f"{protocol}-{n}").parent_span_id.hex() == CLIENT_SPAN  # the client's span
                        links = _links(trace_id, want, 60.0 if protocol == "http" else 10.0)
                        assert "elsewhere" not in links, links  # never another parent
                        got[protocol] |= links
                        if got[protocol] == want:
                            break
                    if protocol == "http":
                        c.infer(MODEL, [i], request_id="own")
                        got["own"] = _links(_root("own").trace_id.hex(), want, 60.0)
    finally:
        receiver.shutdown()
        receiver.server_close()
    assert got == {"http": want, "own": want, "grpc": want}
