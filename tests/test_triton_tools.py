"""A Triton team's tools against the sidecar (emulated servers): perf_analyzer unchanged (gRPC, HTTP, system shared
memory, concurrency and request-rate modes) with its server-side section filled; the statistics extension's
durations and batch statistics; Triton's nv_inference_* metrics counting exactly; server metadata that lists only
what the sidecar serves, and Triton's answers to the rest."""

from __future__ import annotations

import contextlib
import json
import re
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from backends import native_front
from poolpipe_common.net import free_port
from runtime.launch import Deployment
from runtime.sidecar_process import SidecarProcess
from runtime.testbed import EMULATED_MODEL, build_emulated_deployment
from scheduler.server.common.triton_metrics import NAMES
from tests.conftest import run_cli, run_perf_analyzer

pytestmark = pytest.mark.triton
MODEL = EMULATED_MODEL


ADMIN = ("--grpc-restricted-protocol", "shared-memory,model-repository:admin-key=s3cret",
         "--grpc-restricted-protocol", "statistics:stats-key=st",
         "--http-restricted-api", "shared-memory,model-repository,logging:admin-key=s3cret")


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory):
    work = tmp_path_factory.mktemp("tools")
    deploy = build_emulated_deployment(work, slo_us=1_000_000.0, batch=2)
    with Deployment(deploy, check_hardware=False, log_dir=work / "logs"):
        yield deploy, work


def _sidecar(servers: tuple[Path, Path], name: str, *args: str):
    deploy, work = servers
    sc = SidecarProcess(manifest=deploy, log_path=work / f"{name}.log", extra_args=args).start()
    try:
        sc.wait_ready()
        yield sc
    finally:
        assert sc.stop() == 0


@pytest.fixture(scope="module")
def sidecar(servers: tuple[Path, Path]):
    yield from _sidecar(servers, "sidecar")


@pytest.fixture(scope="module")
def restricted(servers: tuple[Path, Path]):
    yield from _sidecar(servers, "restricted", *ADMIN)


def _perf(sc: SidecarProcess, protocol: str, *args: str, url: str | None = None) -> str:
    return run_perf_analyzer(url or (sc.grpc_url if protocol == "grpc" else sc.http_url), MODEL, protocol, *args)


def _server_section(text: str) -> dict[str, int]:
    """perf_analyzer's server-side figures: counts and the average durations (usec)."""
    server = text.split("Server:", 1)[1]
    got = {k: int(v) for k, v in re.findall(r"(Inference count|Successful request count): (\d+)", server)}
    for name in ("queue", "compute input", "compute infer", "compute output"):
        got[name] = int(re.search(rf"{name} (\d+) usec", server).group(1))
    return got


@pytest.mark.parametrize("protocol,args", [
    ("grpc", ("--concurrency-range", "2")),
    ("http", ("--request-rate-range", "20", "--shared-memory", "system")),
    ("grpc", ("--request-rate-range", "20", "--shared-memory", "system")),
], ids=["grpc-concurrency", "http-rate-shm", "grpc-rate-shm"])
def test_perf_analyzer_runs_unchanged(sidecar: SidecarProcess, protocol: str, args: tuple[str, ...]) -> None:
    """No -x: perf_analyzer finds the model's version from the statistics whose queue count grew."""
    text = _perf(sidecar, protocol, *args)
    throughput = float(re.search(r"Throughput: ([\d.]+) infer/sec", text).group(1))
    assert throughput > 5
    s = _server_section(text)
    assert s["Successful request count"] > 0 and s["Inference count"] >= s["Successful request count"]
    # the emulated pipeline computes ~8 ms (googlenet on a T4 then an L4): compute infer carries it
    assert 3000 < s["compute infer"] < 200_000 and s["compute input"] > 0 and s["compute output"] > 0


@pytest.mark.skipif(native_front.library() is None, reason="no C compiler here")
def test_perf_analyzer_runs_unchanged_on_the_native_front(servers: tuple[Path, Path]) -> None:
    """The native front's tritonserver counts each request in its own statistics when the sidecar answers it, so
    perf_analyzer finds the version there too (no -x) and reads the whole planned path as compute infer."""
    port = free_port("127.0.0.1")
    with contextlib.contextmanager(_sidecar)(servers, "native", "--native-grpc-port", str(port)) as sc:
        # what is checked here is the server-side section; stability is test_perf_analyzer_planned.py's: on a CI
        # host, 10 windows once passed without three in a row within the default 10 %
        s = _server_section(_perf(sc, "grpc", "--concurrency-range", "2", "--stability-percentage", "25",
                                  "--max-trials", "20", url=f"127.0.0.1:{port}"))
        assert s["Successful request count"] > 0 and s["Inference count"] >= s["Successful request count"]
        assert 3000 < s["compute infer"] < 200_000


def _infer(c: grpcclient.InferenceServerClient, rows: int) -> None:
    x = grpcclient.InferInput("input", [rows, *_input_shape(c)], "FP32")
    x.set_data_from_numpy(np.zeros((rows, *_input_shape(c)), np.float32))
    c.infer(MODEL, [x])


def _input_shape(c: grpcclient.InferenceServerClient) -> list[int]:
    return [int(d) for d in c.get_model_metadata(MODEL).inputs[0].shape[1:]]


def _triton_metrics(sc: SidecarProcess) -> dict[tuple[str, tuple], float]:
    """The nv_* samples by their names as Prometheus stores them (prometheus_client's parser would add _total)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{sc.metrics_port}/metrics", timeout=5) as r:
        text = r.read().decode()
    assert list(text_string_to_metric_families(text))  # the whole exposition parses
    assert "# TYPE nv_inference_queue_duration_us counter" in text
    got = {}
    for name, labels, value in re.findall(r"^(nv_\w+)\{([^}]*)\} (\S+)$", text, re.M):
        got[(name, tuple(sorted(tuple(kv.split("=", 1)) for kv in labels.replace('"', "").split(","))))] = float(value)
    return got


def test_statistics_and_triton_metrics_count_every_request(sidecar: SidecarProcess) -> None:
    c = grpcclient.InferenceServerClient(sidecar.grpc_url)
    labels = (("model", MODEL), ("version", "1"))
    before, stats0 = _triton_metrics(sidecar), c.get_inference_statistics(MODEL).model_stats[0]
    for rows in (1, 2, 1, 2, 1):
        _infer(c, rows)
    after, stats = _triton_metrics(sidecar), c.get_inference_statistics(MODEL).model_stats[0]
    assert {name for name, _ in after} == set(NAMES)

    def grew(name: str) -> float:
        return after[(name, labels)] - before[(name, labels)]
    assert grew("nv_inference_request_success") == 5 and grew("nv_inference_count") == 7
    assert grew("nv_inference_exec_count") >= 3
    for name in ("queue", "compute_input", "compute_infer", "compute_output"):
        assert grew(f"nv_inference_{name}_duration_us") > 0
    assert grew("nv_inference_compute_infer_duration_us") > 5 * 3000  # ~8 ms of emulated compute each
    assert after[("nv_inference_request_failure", (("model", MODEL), ("reason", "REJECTED"), ("version", "1")))] == 0
    i, i0 = stats.inference_stats, stats0.inference_stats
    assert i.success.count - i0.success.count == 5
    # Triton counts every duration per successful request: perf_analyzer requires the compute counts to agree
    assert i.success.count == i.queue.count == i.compute_input.count == i.compute_infer.count == \
        i.compute_output.count
    assert i.queue.ns + i.compute_input.ns + i.compute_infer.ns + i.compute_output.ns <= i.success.ns
    assert stats.version == "1" and stats.execution_count > 0 and stats.last_inference > 0
    sizes = {b.batch_size: b for b in stats.batch_stats}
    assert sizes and set(sizes) <= {1, 2}
    assert all(b.compute_infer.count > 0 and b.compute_infer.ns > 0 for b in sizes.values())
    h = httpclient.InferenceServerClient(sidecar.http_url).get_inference_statistics(MODEL)["model_stats"][0]
    assert int(h["inference_stats"]["queue"]["count"]) >= 5 and h["batch_stats"]


def test_server_metadata_lists_only_what_is_served(sidecar: SidecarProcess) -> None:
    g, h = grpcclient.InferenceServerClient(sidecar.grpc_url), httpclient.InferenceServerClient(sidecar.http_url)
    ext = set(g.get_server_metadata().extensions)
    assert ext == set(h.get_server_metadata()["extensions"])
    assert {"statistics", "system_shared_memory", "binary_tensor_data", "model_configuration", "logging",
            "schedule_policy", "trace"} <= ext
    assert g.get_trace_settings(as_json=True)["settings"]["trace_level"]["value"] == ["OFF"]  # served, not forwarded
    assert not ext & {"sequence", "classification", "cuda_shared_memory", "model_repository"}
    # CUDA shared memory as a Triton without it: nothing registered, unregister-all succeeds, register refused
    assert len(g.get_cuda_shared_memory_status().regions) == 0 and h.get_cuda_shared_memory_status() == []
    g.unregister_cuda_shared_memory()
    h.unregister_cuda_shared_memory()
    with pytest.raises(InferenceServerException) as e:
        g.register_cuda_shared_memory("r", b"\0" * 64, 0, 64)
    assert e.value.status() == "StatusCode.UNIMPLEMENTED" and "--passthrough" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        g.load_model("other")
    assert e.value.status() == "StatusCode.UNIMPLEMENTED"


def test_logging_extension_sets_the_sidecars_log(sidecar: SidecarProcess) -> None:
    g, h = grpcclient.InferenceServerClient(sidecar.grpc_url), httpclient.InferenceServerClient(sidecar.http_url)
    got = h.get_log_settings()
    assert got["log_info"] is True and got["log_verbose_level"] == 0 and got["log_format"] == "default"
    h.update_log_settings({"log_verbose_level": 1, "log_format": "ISO8601"})
    s = g.get_log_settings(as_json=True)["settings"]
    assert s["log_verbose_level"]["uint32_param"] == 1 and s["log_format"]["string_param"] == "ISO8601"
    with pytest.raises(InferenceServerException, match="log_file cannot be changed"):
        h.update_log_settings({"log_file": "/tmp/x.log"})
    with pytest.raises(InferenceServerException, match="unknown logging setting"):
        g.update_log_settings({"log_colour": True})
    h.update_log_settings({"log_verbose_level": 0, "log_format": "default"})
    assert h.get_log_settings()["log_verbose_level"] == 0


def test_restricted_apis_need_their_header(restricted: SidecarProcess) -> None:
    """tritonserver's flags: a restricted API without the header (or with a wrong value) is refused naming the
    header (gRPC: PERMISSION_DENIED, header with tritonserver's prefix; HTTP: 403); with it, served; the rest open.
    The admin endpoints follow model-repository's key."""
    g, h = grpcclient.InferenceServerClient(restricted.grpc_url), httpclient.InferenceServerClient(restricted.http_url)
    admin_g = {"triton-grpc-protocol-admin-key": "s3cret"}
    for headers in (None, {"triton-grpc-protocol-admin-key": "wrong"}):
        with pytest.raises(InferenceServerException) as e:
            g.get_system_shared_memory_status(headers=headers)
        assert e.value.status() == "StatusCode.PERMISSION_DENIED"
        assert "This protocol is restricted, expecting header 'triton-grpc-protocol-admin-key'" in e.value.message()
    assert len(g.get_system_shared_memory_status(headers=admin_g).regions) == 0
    with pytest.raises(InferenceServerException, match="triton-grpc-protocol-admin-key"):
        g.get_model_repository_index()
    assert MODEL in {m.name for m in g.get_model_repository_index(headers=admin_g).models}
    with pytest.raises(InferenceServerException, match="triton-grpc-protocol-stats-key"):
        g.get_inference_statistics(MODEL, headers=admin_g)  # another group, another key
    assert g.get_inference_statistics(MODEL, headers={"triton-grpc-protocol-stats-key": "st"}).model_stats
    _infer(g, 1)  # inference, health and metadata are not restricted
    assert g.is_server_ready() and h.is_server_live()
    with pytest.raises(InferenceServerException, match="This API is restricted, expecting header 'admin-key'") as e:
        h.get_log_settings()
    assert e.value.status() == "403"
    assert h.get_log_settings(headers={"admin-key": "s3cret"})["log_info"] is True
    for method, path in (("POST", "/v2/poolpipe/reload"), ("GET", "/v2/poolpipe/plan")):
        req = urllib.request.Request(f"http://{restricted.http_url}{path}", method=method)
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(req, timeout=5)
        assert err.value.code == 403 and "'admin-key'" in err.value.read().decode()
    req = urllib.request.Request(f"http://{restricted.http_url}/v2/poolpipe/plan", headers={"admin-key": "s3cret"})
    with urllib.request.urlopen(req, timeout=5) as r:
        assert r.status == 200 and "generation" in json.loads(r.read())


@pytest.mark.parametrize("flag,spec,error", [
    ("--grpc-restricted-protocol", "shared-memory", "expected <api>[,<api>]:<key>=<value>"),
    ("--http-restricted-api", "infer:k=v", "unknown API 'infer'"),
    ("--http-restricted-api", "trace:k=", "expected <api>"),
])
def test_restricted_flag_errors_are_one_line(flag: str, spec: str, error: str) -> None:
    r = run_cli("serve", "--passthrough", "127.0.0.1:1", flag, spec, timeout=60)
    assert r.returncode == 2 and error in r.stderr and flag in r.stderr, r.stderr


def test_an_api_in_two_groups_is_refused_as_tritonserver_does() -> None:
    r = run_cli("serve", "--passthrough", "127.0.0.1:1", "--grpc-restricted-protocol", "trace:a=b",
                "--grpc-restricted-protocol", "trace,logging:c=d", timeout=60)
    assert r.returncode == 2 and "restricted api 'trace' can not be specified in multiple config groups" in r.stderr
