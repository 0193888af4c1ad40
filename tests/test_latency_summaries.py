"""Triton's latency summaries (``--metrics-config summary_latencies=true``) for the planned models: Triton's family
names, types, labels and quantiles; the quantiles are the measured ones (a client that times the same requests
never sees less); off by default; tritonserver's syntax with one-line errors; serve --workers' merge bounds them."""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from prometheus_client.parser import text_string_to_metric_families

from poolpipe_common.errors import InputError
from runtime.launch import Deployment
from runtime.sidecar_process import SidecarProcess
from runtime.testbed import EMULATED_MODEL, build_emulated_deployment
from scheduler.server.common import latency_summary
from scheduler.server.common.latency_summary import (
    FAMILIES,
    SummarySettings,
    parse_metrics_config,
    summary_exposition,
)
from scheduler.server.common.metrics_merge import counter_samples, merge_expositions
from scheduler.server.common.model_stats import ModelStats, RequestMarks


def test_metrics_config_takes_tritonservers_syntax() -> None:
    assert parse_metrics_config([]) == SummarySettings()
    s = parse_metrics_config(["summary_latencies=true", "summary_quantiles=0.5:0.05,0.999:0.0001"])
    assert s.enabled and s.quantiles == ((0.5, 0.05), (0.999, 0.0001))
    for bad, msg in (("summary_latencies=maybe", "expected true or false"), ("counter_latencies=true", "not a "
                     "setting"), ("summary_quantiles=0.5", "QUANTILE:ERROR"), ("summary_quantiles=2:0.1", "within"),
                     ("summary_latencies", "SETTING=VALUE")):
        with pytest.raises(InputError, match=msg):
            parse_metrics_config([bad])


def test_quantiles_are_exact_over_the_window_and_off_by_default() -> None:
    stats = ModelStats()
    latencies = np.random.default_rng(1).exponential(1000.0, 500)
    saved = latency_summary.SETTINGS[0]
    try:
        latency_summary.configure(SummarySettings())
        stats.succeeded(0.0, RequestMarks(), 10.0, 1)
        assert summary_exposition({"m": stats.summaries}) == "" and stats.summaries.windows[0].count == 0
        latency_summary.configure(SummarySettings(enabled=True))
        for lat in latencies:
            stats.succeeded(0.0, RequestMarks(), float(lat), 1)
        text = summary_exposition({"m": stats.summaries})
    finally:
        latency_summary.configure(saved)
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    request = fams["nv_inference_request_summary_us"]
    assert request.type == "summary" and set(fams) == {name for name, _ in FAMILIES}
    got = {s.labels.get("quantile"): s.value for s in request.samples if s.name.endswith("summary_us")}
    for q in ("0.5", "0.9", "0.95", "0.99"):
        assert got[q] == pytest.approx(np.quantile(latencies, float(q)))
    count = next(s for s in request.samples if s.name.endswith("_count"))
    assert count.value == 500 and count.labels == {"model": "m", "version": "1"}


def test_workers_merge_takes_the_highest_quantile_and_keeps_no_dead_workers_quantiles() -> None:
    a = (b'# HELP x_us h\n# TYPE x_us summary\nx_us{model="m",version="1",quantile="0.99"} 10\n'
         b'x_us_sum{model="m",version="1"} 100\nx_us_count{model="m",version="1"} 4\n')
    b = a.replace(b"} 10\n", b"} 30\n").replace(b"} 100\n", b"} 50\n")
    merged = merge_expositions([a, b]).decode()
    assert 'quantile="0.99"} 30' in merged and 'x_us_sum{model="m",version="1"} 150' in merged
    assert "quantile" not in counter_samples(a).decode()


@pytest.mark.triton
def test_live_summaries_hold_against_the_clients_own_timing(tmp_path: Path) -> None:
    deploy = build_emulated_deployment(tmp_path, slo_us=3_000_000.0)
    with Deployment(deploy, check_hardware=False, log_dir=tmp_path / "logs"), \
            SidecarProcess(manifest=deploy, log_path=tmp_path / "sidecar.log",
                           extra_args=("--metrics-config", "summary_latencies=true")) as sc:
        sc.wait_ready()
        c = grpcclient.InferenceServerClient(sc.grpc_url)
        meta = c.get_model_metadata(EMULATED_MODEL)
        shape = [1, *[int(d) for d in meta.inputs[0].shape[1:]]]
        inp = grpcclient.InferInput(meta.inputs[0].name, shape, "FP32")
        inp.set_data_from_numpy(np.zeros(shape, np.float32))
        client_us = []
        for _ in range(20):
            t0 = time.perf_counter()
            c.infer(EMULATED_MODEL, [inp])
            client_us.append((time.perf_counter() - t0) * 1e6)
        with urllib.request.urlopen(f"http://127.0.0.1:{sc.metrics_port}/metrics", timeout=10) as r:
            fams = {f.name: f for f in text_string_to_metric_families(r.read().decode())}
    for name, _ in FAMILIES:
        samples = [s for s in fams[name].samples if s.labels.get("model") == EMULATED_MODEL]
        assert fams[name].type == "summary" and next(s for s in samples if s.name.endswith("_count")).value == 20
    request = {s.labels["quantile"]: s.value for s in fams["nv_inference_request_summary_us"].samples
               if "quantile" in s.labels and s.labels["model"] == EMULATED_MODEL}
    assert 0 < request["0.5"] <= request["0.99"]
    # the sidecar's request duration is inside the client's: its quantiles never exceed the client's
    assert request["0.5"] <= np.quantile(client_us, 0.5) and request["0.99"] <= max(client_us)
    compute = {s.labels["quantile"]: s.value for s in fams["nv_inference_compute_infer_summary_us"].samples
               if "quantile" in s.labels and s.labels["model"] == EMULATED_MODEL}
    assert 0 < compute["0.5"] <= request["0.5"]
