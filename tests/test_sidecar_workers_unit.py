"""The pieces of ``serve --workers`` that need no server: summing the workers' metrics and statistics, each
worker's command line, and the split check's message."""

from __future__ import annotations

import argparse
import math
import re

import pytest
from tritonclient.grpc import service_pb2

from model_repository_gen.manifest import load_manifest
from poolpipe_common.errors import InputError
from runtime.testbed import build_emulated_deployment
from scheduler.server import serve_cli
from scheduler.server.common.metrics import SidecarMetrics
from scheduler.server.common.metrics_merge import counter_samples, merge_expositions
from scheduler.server.peers import add_statistics
from scheduler.server.planned.manifest_shard import check_split
from scheduler.server.workers import PASSED_ON, worker_command, worker_file


def _value(text: bytes, series: str) -> float:
    m = re.search(rf"^{re.escape(series)} (\S+)$", text.decode(), re.M)
    assert m, series
    return float(m.group(1))


def test_expositions_sum_counters_and_histograms_and_average_attainment() -> None:
    a, b = SidecarMetrics(), SidecarMetrics()
    a.declare(["m"], ["v0"])
    b.declare(["m"], ["v1"])
    a.requests.labels("m", "planned").inc(3)
    b.requests.labels("m", "planned").inc(4)
    a.latency.labels("m", "planned").observe(0.01)
    b.latency.labels("m", "planned").observe(0.2)
    a.finished("m", True)
    b.finished("m", False)
    triton = b'# TYPE nv_inference_count counter\nnv_inference_count{model="m",version="1"} 5\n'
    merged = merge_expositions([a.exposition() + triton, b.exposition() + triton])
    assert _value(merged, 'poolpipe_sidecar_requests_total{model="m",route="planned"}') == 7
    assert _value(merged, 'poolpipe_sidecar_request_latency_seconds_count{model="m",route="planned"}') == 2
    assert _value(merged, 'poolpipe_sidecar_request_latency_seconds_bucket{le="0.025",model="m",route="planned"}') == 1
    assert _value(merged, 'poolpipe_sidecar_slo_attainment{model="m"}') == 0.5  # a mean, not a sum
    assert _value(merged, 'nv_inference_count{model="m",version="1"}') == 10
    assert _value(merged, 'poolpipe_sidecar_vgpu_up{vgpu="v0"}') == 0  # one worker's series passes through
    assert merged.decode().count("# TYPE poolpipe_sidecar_requests_total counter") == 1
    nan = merge_expositions([b'# TYPE poolpipe_sidecar_slo_attainment gauge\npoolpipe_sidecar_slo_attainment 1\n',
                             b'# TYPE poolpipe_sidecar_slo_attainment gauge\npoolpipe_sidecar_slo_attainment NaN\n'])
    assert _value(nan, "poolpipe_sidecar_slo_attainment") == 1
    assert math.isnan(_value(merge_expositions([b"# TYPE poolpipe_sidecar_slo_attainment gauge\n"
                                                b"poolpipe_sidecar_slo_attainment NaN\n"]),
                             "poolpipe_sidecar_slo_attainment"))


def test_a_dead_workers_counters_carry_without_its_gauges() -> None:
    a = SidecarMetrics()
    a.declare(["m"], ["v0"])
    a.requests.labels("m", "planned").inc(5)
    a.queue_length.labels("m").set(9)
    kept = counter_samples(a.exposition())
    assert _value(kept, 'poolpipe_sidecar_requests_total{model="m",route="planned"}') == 5
    assert 'poolpipe_sidecar_queue_length{model="m"}' not in kept.decode()
    assert "_created{" not in kept.decode()


def test_statistics_add_counts_durations_and_batches() -> None:
    def stats(n: int, last: int, batches: dict[int, int]) -> service_pb2.ModelStatistics:
        s = service_pb2.ModelStatistics(name="m", version="1", last_inference=last, inference_count=n,
                                        execution_count=n)
        s.inference_stats.success.count, s.inference_stats.success.ns = n, 1000 * n
        for size, count in batches.items():
            s.batch_stats.add(batch_size=size).compute_infer.count = count
        return s

    total = stats(3, 10, {1: 1, 2: 1})
    add_statistics(total, stats(4, 7, {2: 2, 4: 1}))
    assert (total.name, total.inference_count, total.last_inference) == ("m", 7, 10)
    assert (total.inference_stats.success.count, total.inference_stats.success.ns) == (7, 7000)
    assert {b.batch_size: b.compute_infer.count for b in total.batch_stats} == {1: 1, 2: 3, 4: 1}


def _serve_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    serve_cli.register(parser.add_subparsers())
    return parser.parse_args(["serve", *argv])


def test_each_worker_gets_every_flag_its_share_and_its_own_files(tmp_path) -> None:
    args = _serve_args("--manifest", "d", "--workers", "2", "--batch-log", "b.jsonl", "--overheads-out",
                       str(tmp_path / "o.json"), "--trace-config", "level=TIMESTAMPS", "--passthrough", "h:1",
                       "--native-grpc-port", "7001", "--passthrough-http", "h:2")
    assert set(vars(args)) - {"func"} <= PASSED_ON  # a new serve option must be passed on to the workers
    cmd = worker_command(args, 1, (5001, 5002))
    joined = " ".join(cmd)
    assert "--shard 1/2" in joined and "--worker-of 1:5001,5002" in joined and "--metrics-port 5002" in joined
    assert "--trace-config level=TIMESTAMPS" in joined and "--passthrough h:1" in joined
    assert "--native-grpc-port 7001" in joined and "--passthrough-http h:2" in joined
    assert f"--overheads-out {worker_file(tmp_path / 'o.json', 1)}" in joined
    assert worker_file(tmp_path / "o.json", 1).name == "o.worker1.json"
    assert serve_cli._worker_of("1:5001,5002").peers == ["http://127.0.0.1:5001"]
    with pytest.raises(SystemExit):
        _serve_args("--worker-of", "2:5001,5002")


def test_a_plan_says_how_many_workers_it_supports(tmp_path) -> None:
    manifest = load_manifest(build_emulated_deployment(tmp_path, gpus=2))
    check_split(manifest, 2)
    with pytest.raises(InputError, match="this plan supports at most 2 workers"):
        check_split(manifest, 3)
