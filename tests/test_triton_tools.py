"""A Triton team's tools against the sidecar (emulated servers): perf_analyzer unchanged (gRPC, HTTP, system shared
memory, concurrency and request-rate modes) with its server-side section filled; the statistics extension's
durations and batch statistics; Triton's nv_inference_* metrics counting exactly; server metadata that lists only
what the sidecar serves, and Triton's answers to the rest."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from runtime.launch import Deployment
from runtime.sidecar_process import SidecarProcess
from runtime.testbed import EMULATED_MODEL, build_emulated_deployment
from scheduler.server.common.triton_metrics import NAMES

pytestmark = pytest.mark.triton
MODEL = EMULATED_MODEL
PERF_ANALYZER = Path(os.environ.get("PERF_ANALYZER", Path(sys.prefix) / "bin" / "perf_analyzer"))


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory):
    work = tmp_path_factory.mktemp("tools")
    deploy = build_emulated_deployment(work, slo_us=1_000_000.0, batch=2)
    with Deployment(deploy, check_hardware=False, log_dir=work / "logs"):
        sc = SidecarProcess(manifest=deploy, log_path=work / "sidecar.log").start()
        try:
            sc.wait_ready()
            yield sc
        finally:
            assert sc.stop() == 0


def _perf(sc: SidecarProcess, protocol: str, *args: str) -> str:
    if not PERF_ANALYZER.exists():
        pytest.fail(f"{PERF_ANALYZER} is missing: run 'make perf-analyzer' (or python "
                    "tests/tools/install_perf_analyzer.py --prefix VENV)")
    url = sc.grpc_url if protocol == "grpc" else sc.http_url
    cmd = [str(PERF_ANALYZER), "-m", MODEL, "-u", url, "-i", protocol, "--measurement-interval", "1500",
           "-s", "50", "--max-trials", "8", *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    return out.stdout


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
    assert {"statistics", "system_shared_memory", "binary_tensor_data", "model_configuration", "logging"} <= ext
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
