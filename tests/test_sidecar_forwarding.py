"""A transparent pass-through: what a client sends besides the message (gRPC metadata, HTTP headers, a W3C
``traceparent``) reaches the Triton behind the sidecar, hop-by-hop headers excepted (checked on a Triton started
with its own --grpc-header-forward-pattern, whose model answers the parameters it got); the sidecar's own
--grpc/http-header-forward-pattern turns matching headers into request parameters; a client's traceparent is the
parent of the sidecar's spans."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from runtime.launch import Deployment
from runtime.sidecar_process import SidecarProcess
from runtime.testbed import build_emulated_deployment
from runtime.tritonserver import TritonProcess
from scheduler.server.common.forwarding import forwarded_metadata, header_parameters, set_incoming
from scheduler.server.common.trace_settings import parse_trace_config
from scheduler.server.common.tracing import Tracer
from scheduler.server.front.http_passthrough import forwarded_headers

ECHO = Path(__file__).resolve().parent / "models_echo"
TRACE_ID, PARENT_ID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"


def test_hop_by_hop_and_transport_headers_stay_and_the_pattern_picks_parameters() -> None:
    async def main() -> tuple:
        headers = [("X-Tenant", "blue"), ("Connection", "keep-alive"), ("Keep-Alive", "timeout=5"),
                   ("grpc-timeout", "1S"), ("Content-Type", "application/json"), ("traceparent", TRACEPARENT),
                   ("x-bad", "caf\u00e9"), ("x-key-bin", b"\x00\x01")]
        set_incoming(lambda: headers, re.compile("^x-ten"))
        return forwarded_metadata(), header_parameters()
    metadata, params = asyncio.run(main())
    assert metadata == (("x-tenant", "blue"), ("traceparent", TRACEPARENT), ("x-key-bin", b"\x00\x01"))
    assert params == {"x-tenant": "blue"}
    assert forwarded_metadata() is None and header_parameters() == {}  # outside a request's task: nothing
    kept = forwarded_headers({"Connection": "close", "Content-Type": "application/json", "X-A": "1", "Host": "h"})
    assert kept == {"Content-Type": "application/json", "X-A": "1"}


def test_a_clients_traceparent_is_the_parent_of_the_sidecars_spans() -> None:
    mem = InMemorySpanExporter()
    tracer = Tracer(parse_trace_config(["level=TIMESTAMPS", "rate=1"]), exporter=mem)

    async def traced(headers: list) -> None:
        set_incoming(lambda: headers)
        ct = tracer.start("m", "r", 1000.0, {})
        tracer.finish(ct, 2000.0)
    asyncio.run(traced([("traceparent", TRACEPARENT)]))
    asyncio.run(traced([]))
    asyncio.run(traced([("traceparent", "not a trace context")]))
    roots = [s for s in mem.get_finished_spans() if s.name == "InferRequest"]
    assert f"{roots[0].context.trace_id:032x}" == TRACE_ID and f"{roots[0].parent.span_id:016x}" == PARENT_ID
    assert roots[1].parent is None and roots[2].parent is None  # none, or a malformed one: a trace of its own
    assert f"{roots[1].context.trace_id:032x}" != TRACE_ID


def _echo(client, mod, headers: dict) -> dict:
    inp = mod.InferInput("INPUT", [1], "INT32")
    inp.set_data_from_numpy(np.zeros(1, np.int32))
    out = client.infer("echo_parameters", [inp], headers=headers).as_numpy("PARAMETERS")[0]
    return json.loads(out.decode() if isinstance(out, bytes) else out)


@pytest.mark.triton
def test_headers_reach_the_passthrough_triton_and_become_parameters(tmp_path: Path) -> None:
    triton_pattern = "--grpc-header-forward-pattern=^(x-custom|traceparent|keep-alive|authorization)"
    with TritonProcess(ECHO, log_path=tmp_path / "triton.log", extra_args=(triton_pattern,)) as triton, \
            SidecarProcess(passthrough=triton.grpc_url, log_path=tmp_path / "plain.log") as plain, \
            SidecarProcess(passthrough=triton.grpc_url, log_path=tmp_path / "pattern.log",
                           extra_args=("--grpc-header-forward-pattern", "^x-tenant",
                                       "--http-header-forward-pattern", "tenant")) as patterned:
        sent = {"x-custom": "v1", "traceparent": TRACEPARENT, "authorization": "Bearer k"}
        for mod, url in ((grpcclient, plain.grpc_url), (httpclient, plain.http_url)):
            extra = {"Keep-Alive": "timeout=5"} if mod is httpclient else {}
            got = _echo(mod.InferenceServerClient(url), mod, {**sent, **extra})
            assert {k: got.get(k) for k in sent} == sent, (mod.__name__, got)  # all the way to the model
            assert "keep-alive" not in got  # hop-by-hop: not forwarded
        # the sidecar's own pattern: the matching header is a request parameter the Triton's model sees
        for mod, url in ((grpcclient, patterned.grpc_url), (httpclient, patterned.http_url)):
            got = _echo(mod.InferenceServerClient(url), mod, {"x-tenant": "blue", "x-other": "no"})
            assert got.get("x-tenant") == "blue" and "x-other" not in got, (mod.__name__, got)


@pytest.mark.triton
def test_http_inference_reaches_the_passthrough_triton_as_http(tmp_path: Path) -> None:
    """With --passthrough-http, a header matching only the Triton's *HTTP* forward pattern becomes a parameter
    there (so it came as HTTP), and Triton's own gzip answer passes back as it was sent."""
    with TritonProcess(ECHO, log_path=tmp_path / "triton.log",
                       extra_args=("--http-header-forward-pattern=^x-via-http",)) as triton, \
            SidecarProcess(passthrough=triton.grpc_url, log_path=tmp_path / "sidecar.log",
                           extra_args=("--passthrough-http", triton.http_url)) as sc:
        c = httpclient.InferenceServerClient(sc.http_url)
        inp = httpclient.InferInput("INPUT", [1], "INT32")
        inp.set_data_from_numpy(np.zeros(1, np.int32))
        for coding in (None, "gzip"):
            out = c.infer("echo_parameters", [inp], headers={"x-via-http": "yes"},
                          response_compression_algorithm=coding).as_numpy("PARAMETERS")[0]
            got = json.loads(out.decode() if isinstance(out, bytes) else out)
            assert got.get("x-via-http") == "yes", got
        assert c.is_model_ready("echo_parameters")  # the other calls still go over gRPC


@pytest.mark.triton
def test_global_trace_settings_reach_the_passthrough_triton(tmp_path: Path) -> None:
    """A global trace-settings change on a sidecar with planned models is the sidecar's and the pass-through
    Triton's (before, it stopped at the sidecar)."""
    deploy = build_emulated_deployment(tmp_path, slo_us=3_000_000.0)
    with TritonProcess(ECHO, log_path=tmp_path / "triton.log") as triton, \
            Deployment(deploy, check_hardware=False, log_dir=tmp_path / "logs"), \
            SidecarProcess(manifest=deploy, passthrough=triton.grpc_url, log_path=tmp_path / "sidecar.log",
                           extra_args=("--trace-config", "level=TIMESTAMPS", "--trace-config", "rate=1000")) as sc:
        c = grpcclient.InferenceServerClient(sc.grpc_url)
        got = c.update_trace_settings(settings={"trace_rate": "7"}, as_json=True)["settings"]
        assert got["trace_rate"]["value"] == ["7"]  # the sidecar's own
        upstream = grpcclient.InferenceServerClient(triton.grpc_url).get_trace_settings(as_json=True)["settings"]
        assert upstream["trace_rate"]["value"] == ["7"]
