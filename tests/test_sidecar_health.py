"""Sidecar health as an operator sees it: started before its Triton servers (emulated, so calibration is quick),
it turns ready within a second of the last server's readiness; and every metric it declares is exported."""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from prometheus_client.parser import text_string_to_metric_families

from runtime.launch import Deployment
from runtime.sidecar_process import SidecarProcess
from runtime.testbed import EMULATED_MODEL, build_emulated_deployment
from scheduler.server.common.metrics import SidecarMetrics

pytestmark = pytest.mark.triton


def _exported(sc: SidecarProcess) -> dict[str, list]:
    with urllib.request.urlopen(f"http://127.0.0.1:{sc.metrics_port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def test_ready_within_a_second_of_its_servers_and_every_metric_exported(tmp_path: Path) -> None:
    deploy = build_emulated_deployment(tmp_path)
    sc = SidecarProcess(manifest=deploy, log_path=tmp_path / "sidecar.log").start()
    try:
        c = grpcclient.InferenceServerClient(sc.grpc_url)
        assert not c.is_server_ready()
        time.sleep(3)  # long enough for gRPC's default reconnect back-off to have grown past a second
        with Deployment(deploy, check_hardware=False, log_dir=tmp_path / "logs"):
            servers_ready = time.monotonic()
            while not c.is_model_ready(EMULATED_MODEL):
                assert time.monotonic() - servers_ready < 10, "the sidecar did not turn ready"
                time.sleep(0.02)
            took = time.monotonic() - servers_ready
            assert took < 1.0, f"ready {took:.2f} s after its servers"

            meta = c.get_model_metadata(EMULATED_MODEL)
            shape = [1, *[int(d) for d in meta.inputs[0].shape[1:]]]
            inp = grpcclient.InferInput(meta.inputs[0].name, shape, meta.inputs[0].datatype)
            inp.set_data_from_numpy(np.zeros(shape, np.float32))
            for _ in range(3):
                c.infer(EMULATED_MODEL, [inp])
            exported = _exported(sc)
            declared = [m.name for m in SidecarMetrics().registry.collect()]
            silent = [name for name in declared if not exported.get(name)]
            assert not silent, f"declared but not exported: {silent}"
            retries = [s for s in exported["poolpipe_sidecar_retries"] if s.labels.get("model") == EMULATED_MODEL]
            assert retries and retries[0].value == 0
            ok = [s for s in exported["poolpipe_sidecar_successes"] if s.name.endswith("_total")]
            assert ok and ok[0].value == 3
    finally:
        assert sc.stop() == 0


def test_liveness_checks_are_spread_over_the_ticks_each_server_once_per_period() -> None:
    from scheduler.server.planned.fleet import HEALTH_PERIOD_S, PROBE_PERIOD_S, live_slice

    servers = [f"s{i}" for i in range(16)]
    ticks = int(HEALTH_PERIOD_S / PROBE_PERIOD_S)  # the ticks within one health period
    turn, seen = 0, []
    for _ in range(ticks):
        turn, live = live_slice(servers, turn)
        assert len(live) < len(servers)  # never the whole fleet at once
        seen += live
    assert set(seen) == set(servers)
    assert live_slice([], 5) == (0, []) and live_slice(["a"], 7)[1] == ["a"]
