"""perf_analyzer with its defaults (5 s windows, stable within 10 % over three, at most 10 trials) measures a
three-stage planned model through the sidecar at concurrency 1 and 4, over gRPC and HTTP, as a Triton team runs it
first: it stabilises at both levels, four clients overlap the pipeline's stages (more throughput), and the server
side shows at least the emulated devices' own compute (emulated GPUs: the profile's latencies, not this CPU's)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from model_repository_gen.generate import generate
from plans.plan_json import Plan
from runtime.launch import Deployment
from runtime.sidecar_process import SidecarProcess
from tests.conftest import run_perf_analyzer
from tests.deploy_helpers import write_cluster
from tests.test_emulated import MODEL, PIPELINE, SCALE, emulated_hosts, ppipe_plan

pytestmark = pytest.mark.triton


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SidecarProcess, Plan]]:
    """T4 -> L4 half -> L4 half (a gRPC hop between addresses, a shared-memory hop on one host), emulated."""
    work = tmp_path_factory.mktemp("pa3")
    plan = ppipe_plan()
    assert len(plan.models[0].pipelines[0].partitions) == len(PIPELINE) == 3
    generate(plan, {}, write_cluster(work / "cluster.json", emulated_hosts()), work / "deploy",
             emulated_tensor_scale=SCALE)
    with Deployment(work / "deploy", check_hardware=False, log_dir=work / "logs"):
        sc = SidecarProcess(manifest=work / "deploy", log_path=work / "sidecar.log").start()
        try:
            sc.wait_ready()
            yield sc, plan
        finally:
            assert sc.stop() == 0


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_perf_analyzer_defaults_stabilise_on_a_three_stage_plan(sidecar: tuple[SidecarProcess, Plan],
                                                                  protocol: str) -> None:
    sc, plan = sidecar
    text = run_perf_analyzer(sc.grpc_url if protocol == "grpc" else sc.http_url, MODEL, protocol,
                             "--concurrency-range", "1:4:3", "-v")
    # its defaults, as it reports them (the tests used to pass 1.5 s windows, 50 % stability and 8 trials)
    assert "Measurement window: 5000 msec" in text and "Stabilizing using average latency" in text, text
    passes = [len(re.findall(r"Pass \[\d+\] throughput", level)) for level in text.split("Request concurrency:")[1:]]
    assert len(passes) == 2 and all(3 <= n <= 10 for n in passes), passes  # three stable windows within 10 trials
    assert "Failed to obtain stable measurement" not in text
    levels = {int(c): float(t) for c, t in re.findall(r"Concurrency: (\d+), throughput: ([\d.]+) infer/sec", text)}
    assert set(levels) == {1, 4} and levels[4] > levels[1] > 0, levels
    compute_us = [int(x) for x in re.findall(r"compute infer (\d+) usec", text)]
    model = plan.models[0]
    held_us = sum(model.profile.latency_us(p.gpu, p.v, 1, *p.blocks) for p in model.pipelines[0].partitions)
    assert len(compute_us) == 2 and all(c >= held_us for c in compute_us), (compute_us, held_us)
