"""Locust load tests end to end: a headless run against a real tritonserver reports every request."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from loadtest.runner import LoadTest, run_loadtest
from runtime.tritonserver import TritonProcess
from tests.conftest import run_cli
from workloads.arrivals import arrival_times

MODEL_PY = '''
import os, sys
sys.path[:0] = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.fail = "broken" in args["model_name"]

    def execute(self, requests):
        out = []
        for r in requests:
            if self.fail:
                out.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("broken on purpose")))
                continue
            a = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(r, "INPUT1").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", a + b)]))
        return out
'''

CONFIG = '''name: "{name}"
backend: "python"
max_batch_size: 8
input [{{ name: "INPUT0" data_type: TYPE_INT32 dims: [16] }}, {{ name: "INPUT1" data_type: TYPE_INT32 dims: [16] }}]
output [{{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [16] }}]
instance_group [{{ kind: KIND_CPU count: 1 }}]
parameters {{ key: "poolpipe_slo_us" value: {{ string_value: "500000" }} }}
'''


@pytest.fixture(scope="module")
def triton(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    for name in ("simple", "broken"):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(CONFIG.format(name=name))
        (repo / name / "1" / "model.py").write_text(MODEL_PY)
    with TritonProcess(repo, log_path=repo / "triton.log") as t:
        yield t


@pytest.mark.triton
def test_headless_run_reports_every_request(triton, tmp_path):
    expected = len(arrival_times("poisson", 20.0, 3.0, seed=1))
    s = run_loadtest(LoadTest(triton.grpc_url, "simple", 20.0, 3.0, seed=1, senders=4), tmp_path)
    assert s["sent"] == expected and s["succeeded"] == expected and s["unanswered"] == 0
    assert s["slo_ms"] == 500.0 and s["slo_attainment"] == 1.0  # SLO read from the model config
    assert 0 < s["p50_ms"] <= s["p99_ms"] < 500
    assert (tmp_path / "report.html").stat().st_size > 0
    stats = (tmp_path / "locust_stats.csv").read_text()
    assert f"grpc,simple,{expected},0" in stats.replace('"', "")


@pytest.mark.triton
def test_replayed_trace_drives_the_senders_open_loop(triton, tmp_path):
    """replay:azure-code at 20 rps: seed 4 lands on a burst (14 requests in 100 ms, inter-arrival CV 4 in the
    3 s window); every scheduled request is sent, on time, and answered."""
    schedule = arrival_times("replay:azure-code", 20.0, 3.0, seed=4)
    assert np.histogram(schedule, bins=np.arange(0, 3.01, 0.1))[0].max() >= 10
    s = run_loadtest(LoadTest(triton.grpc_url, "simple", 20.0, 3.0, trace="replay:azure-code", seed=4, senders=4),
                     tmp_path)
    assert s["trace"] == "replay:azure-code" and s["sent"] == s["succeeded"] == len(schedule)
    assert s["unanswered"] == 0 and 0 <= s["send_lag_ms_p50"] < 50 and s["send_lag_ms_p99"] < 250


@pytest.mark.triton
def test_failures_carry_the_servers_message(triton, tmp_path):
    r = run_cli("loadtest", "--url", triton.grpc_url, "--model", "broken", "--rate", "10", "--duration-s", "2",
                "--trace", "bursty:2", "--senders", "2", "--out", tmp_path)
    assert r.returncode == 0, r.stderr
    s = json.loads(Path(tmp_path / "summary.json").read_text())
    assert s["sent"] == len(arrival_times("bursty:2", 10.0, 2.0, seed=0)) and s["succeeded"] == 0
    assert s["slo_attainment"] == 0.0 and any("broken on purpose" in m for m in s["errors"])
    assert "broken on purpose" in r.stdout


def test_unknown_model_is_a_clear_error(triton, tmp_path):
    r = run_cli("loadtest", "--url", triton.grpc_url, "--model", "nope", "--rate", "5", "--duration-s", "1",
                "--out", tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr


def test_open_loop_client_runs_without_collector_pauses(triton):
    """The benchmarks' open-loop client turns the cyclic collector off while it measures (a full collection of its
    heap paused it for tens of milliseconds, counted as late answers), and collects what it left once done."""
    import gc
    import weakref

    from loadtest.open_loop import no_collector_pauses, open_loop

    class Node:
        pass

    frozen = gc.get_freeze_count()
    with no_collector_pauses():
        assert not gc.isenabled()
        a, b = Node(), Node()
        a.other, b.other = b, a  # a cycle: only the collector frees it
        gone = weakref.ref(a)
        del a, b
        junk = [[i] for i in range(20_000)]  # enough new containers to trigger collections, were it on
        assert gone() is not None and junk
    assert gc.isenabled() and gone() is None and gc.get_freeze_count() == frozen
    r = open_loop([triton.grpc_url], "simple", arrival_times("poisson", 20.0, 1.0, seed=2), 500.0)
    assert r.offered == r.met > 0 and r.errors == r.late == 0 and gc.isenabled()
