"""Emulated devices: the backend holds each batch for its profiled latency without spending CPU, outputs carry a
checksum through every hop, and generate needs no ONNX for models that only emulated hosts serve."""

from __future__ import annotations

import json
import os
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException, triton_to_np_dtype

from backends import native
from backends.partition.emulated import EmulatedDevice, emulated_outputs, latency_at, parse_latency_table
from model_repository_gen import triton_config as tc
from model_repository_gen.cluster_file import cluster_from_dict
from model_repository_gen.generate import generate
from model_repository_gen.manifest import Manifest, PipelineInfo, load_manifest
from plans.plan_json import Plan
from poolpipe_common.errors import InputError
from poolpipe_common.tensors import TensorSpec
from profiling.reference import import_ppipe_profile
from runtime.launch import Deployment
from runtime.sidecar_process import SidecarProcess
from runtime.tritonserver import TritonProcess
from scheduler.server.planned.manifest_topology import topology_from_manifest
from scheduler.server.planned.shm_pool import PREFIX
from tests.conftest import REFERENCE_DIR, run_cli
from tests.deploy_helpers import make_plan, write_cluster

MODEL = "googlenet-v3-pytorch"  # the PPipe reference model with the shortest latencies (5 ms on an L4)
# T4 (whole GPU) -> L4 half -> L4 half: one gRPC hop (another address) and one shared-memory hop (same host)
PIPELINE = [((0, 2), "T4", 1, 1), ((2, 5), "L4", 2, 1), ((5, 10), "L4", 2, 1)]
SCALE = 0.01  # 1 % of the profiled tensor bytes: an 8 MB boundary moves as 80 kB


def emulated_hosts(**extra: object) -> list[dict]:
    return [{"name": "t4box", "address": "127.0.0.1", "gpu_type": "T4", "gpus": 1, "bandwidth_gbps": 10,
             "device": "emulated", "base_port": 0, **extra},
            {"name": "l4box", "address": "127.0.0.2", "gpu_type": "L4", "gpus": 1, "bandwidth_gbps": 10,
             "device": "emulated", "base_port": 0, **extra}]


def ppipe_plan(batch: int = 2, slo_us: float = 400_000.0) -> Plan:
    """A small plan for the reference model (latency ~19 ms at batch 2); a generous SLO for a loaded machine."""
    plan = make_plan(import_ppipe_profile(REFERENCE_DIR, MODEL), [PIPELINE], batch=batch)
    return replace(plan, models=(replace(plan.models[0], slo_us=slo_us),))


def expected_chain(pipe: PipelineInfo, x: np.ndarray, order: list[int] | None = None) -> np.ndarray:
    """What the pipeline's emulated stages return for ``x`` when they run in ``order`` (default: all, in order)."""
    tensors = [x]
    for k in order if order is not None else range(len(pipe.stages)):
        specs = [(np.dtype(triton_to_np_dtype(t.datatype)), t.shape) for t in pipe.stages[k].outputs]
        tensors = emulated_outputs(tensors, k, specs)
    return tensors[0]


def test_latency_table_interpolates_and_noise_has_the_asked_spread() -> None:
    table = parse_latency_table('{"1": 1000, "2": 1800, "4": 3000}')
    assert [latency_at(table, b) for b in (1, 2, 3, 4)] == [1000.0, 1800.0, 2400.0, 3000.0]
    assert latency_at(table, 6) == 4200.0  # the last segment's slope
    assert latency_at({2: 1000.0}, 1) == 500.0 and latency_at({2: 1000.0}, 4) == 2000.0
    dev = EmulatedDevice(table, 0, [("y", np.float32, (4,))], cv=0.2, seed=7)
    holds = np.array([dev.hold_us(2) for _ in range(4000)])
    assert abs(holds.mean() / 1800 - 1) < 0.02 and abs(holds.std() / holds.mean() - 0.2) < 0.02
    assert EmulatedDevice(table, 0, [("y", np.float32, (4,))]).hold_us(3) == 2400.0  # cv 0: no noise
    for bad, msg in (("{", "not JSON"), ("{}", "non-empty"), ('{"x": 1}', "not an integer"),
                     ('{"1": -5}', "latency >= 0")):
        with pytest.raises(ValueError, match=msg):
            parse_latency_table(bad)
    with pytest.raises(ValueError, match="variable dims"):
        EmulatedDevice(table, 0, [("y", np.float32, (-1,))])


def _cpu_seconds(pgid: int) -> float:
    """User + system CPU time of every live process in a process group (the server and its backend stubs)."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # fields after the name: state ppid pgrp ... utime(11) stime(12)
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def test_emulated_backend_holds_each_batch_for_its_latency_without_cpu(tmp_path: Path) -> None:
    table = ((1, 40_000.0), (2, 60_000.0), (4, 100_000.0))  # µs; batch 3 interpolates to 80 ms
    ins, outs = [TensorSpec("x", "FP32", (16,))], [TensorSpec("y", "FP16", (8,))]
    repo = tmp_path / "repo"
    tc.write_model(repo, tc.partition_config("emu", ins, outs, 4, settings=tc.BackendSettings(
        emulated=tc.EmulatedSettings(table, stage=3))))
    bad = tc.partition_config("bad", ins, outs, 4, settings=tc.BackendSettings(
        emulated=tc.EmulatedSettings(table, stage=0)))
    bad.parameters["emulated_latency_us"].string_value = '{"1": "fast"}'
    tc.write_model(repo, bad)
    assert not (repo / "emu" / "1" / "model.onnx").exists() and (repo / "emu" / "1" / "emulated.py").is_file()
    server = TritonProcess(repo, log_path=tmp_path / "triton.log", name="emulated",
                           extra_args=("--model-control-mode=explicit", "--load-model=emu"))
    with server, grpcclient.InferenceServerClient(server.grpc_url) as client:
        with pytest.raises(InferenceServerException, match="emulated_latency_us: batch 1"):
            client.load_model("bad")  # a bad parameter: a clear load error, and the server keeps serving
        rng = np.random.default_rng(0)
        cpu0, late_us = _cpu_seconds(server.proc.pid), []
        batches = (1, 2, 3, 4, 1, 2, 3, 4)
        for batch in batches:
            x = rng.standard_normal((batch, 16)).astype(np.float32)
            inp = grpcclient.InferInput("x", list(x.shape), "FP32")
            inp.set_data_from_numpy(x)
            res = client.infer("emu", [inp], outputs=[grpcclient.InferRequestedOutput(n)
                                                      for n in ("y", *tc.TIMING_OUTPUTS)])
            want_us = latency_at(dict(table), batch)
            took_us = (res.as_numpy(tc.COMPUTE_END_OUTPUT)[0, 0] - res.as_numpy(tc.COMPUTE_START_OUTPUT)[0, 0]) / 1e3
            assert took_us >= want_us, (batch, took_us)  # never early
            late_us.append(took_us - want_us)
            np.testing.assert_array_equal(res.as_numpy("y"), emulated_outputs([x], 3, [(np.float16, (8,))])[0])
        cpu = _cpu_seconds(server.proc.pid) - cpu0
        # late only by the wake-up lag of a loaded machine: typically well under a millisecond
        assert np.median(late_us) < 10_000 and max(late_us) < 100_000, late_us
        held_s = (sum(latency_at(dict(table), b) for b in batches) + sum(late_us)) / 1e6  # ~0.56 s
        assert cpu < 0.2 * held_s, (cpu, held_s)  # compute that costs (almost) no CPU
        assert server.proc.poll() is None


def test_cluster_file_emulated_hosts() -> None:
    t4 = emulated_hosts(latency_cv=0.1)[0]
    host = cluster_from_dict({"hosts": [t4]}).hosts[0]
    assert host.emulated and not host.on_cpu and not host.on_gpu and host.latency_cv == 0.1
    for bad, msg in (({**t4, "device": "tpu"}, "device: expected one of gpu, cpu, emulated, got 'tpu'"),
                     ({**t4, "latency_cv": -1}, "latency_cv: expected a number 0..10"),
                     ({**t4, "device": "cpu"}, "latency_cv: only emulated hosts"),
                     ({**t4, "emulate_slowdown": 2}, "emulate_slowdown: only CPU hosts")):
        with pytest.raises(InputError, match=msg):
            cluster_from_dict({"hosts": [bad]})


def test_generate_needs_no_onnx_for_emulated_hosts_and_says_when_it_does(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    ppipe_plan().save(plan)
    cluster = write_cluster(tmp_path / "cluster.json", emulated_hosts(latency_cv=0.05))
    r = run_cli("generate", "--plan", plan, "--cluster", cluster, "--out", tmp_path / "out",
                "--emulated-tensor-scale", str(SCALE))
    assert r.returncode == 0, r.stderr
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    model = manifest["models"][0]
    assert model["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [3, 22, 22]}]  # 224 x sqrt(0.01)
    assert model["outputs"] == [{"name": "output", "datatype": "FP32", "shape": [10]}]
    stages = model["pipelines"][0]["stages"]
    assert stages[0]["outputs"] == stages[1]["inputs"] == [{"name": "boundary2", "datatype": "FP32",
                                                             "shape": [8073600 // 4 // 100]}]
    # the shrunk tensors cross links at their profiled size: the scheduler reserves the NIC for those bytes
    assert [s.get("link_bytes_per_request") for s in stages] == [3 * 224 * 224 * 4, 8073600, 1881600]
    topo = topology_from_manifest(load_manifest(tmp_path / "out"))
    assert [s.in_bytes_per_request for s in topo.pipelines[MODEL][0].stages] == [0, 8073600, 1881600]
    stages[1]["link_bytes_per_request"] = -1
    (tmp_path / "out" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(InputError, match=r"stages\[1\]\.link_bytes_per_request: must be >= 0"):
        load_manifest(tmp_path / "out")
    version = next((tmp_path / "out" / "l4box").glob("*/model_repository/*_b2_5/1"))
    cfg = tc.parse_config(version.parent / "config.pbtxt")
    # no ONNX: the native backend's library where it builds (the default), else the Python backend's files
    files = [native.LIBRARY] if cfg.backend == native.BACKEND else ["emulated.py", "engines.py", "model.py"]
    assert sorted(p.name for p in version.iterdir()) == files and cfg.backend == tc.emulated_backend("auto")
    params = {k: v.string_value for k, v in cfg.parameters.items()}
    assert (params["engine"], params["emulated_stage"], params["emulated_latency_cv"]) == ("emulated", "1", "0.05")
    assert json.loads(params["emulated_latency_us"]) == {b: round(us, 3) for b, us in stages[1]["latency_us"].items()}

    # a host with real engines needs the ONNX file; bad scales are refused; all in one line, exit 2
    mixed = write_cluster(tmp_path / "mixed.json", [emulated_hosts()[0], {**emulated_hosts()[1], "device": "cpu"}])
    for args, msg in (((mixed,), "no ONNX file for plan model(s) googlenet-v3-pytorch: host(s) l4box run real engines"),
                      ((cluster, "--emulated-tensor-scale", "0"), "--emulated-tensor-scale 0.0: must be > 0 and <= 1"),
                      ((cluster, "--emulated-tensor-scale", "1.5"), "must be > 0 and <= 1")):
        r = run_cli("generate", "--plan", plan, "--cluster", *args, "--out", tmp_path / "bad")
        assert r.returncode == 2 and msg in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def _infer(url: str, x: np.ndarray) -> np.ndarray:
    with grpcclient.InferenceServerClient(url) as c:
        inp = grpcclient.InferInput("input", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        return c.infer(MODEL, [inp]).as_numpy("output")


@pytest.mark.triton
def test_emulated_ppipe_model_answers_through_the_sidecar_with_checksums_of_every_hop(tmp_path: Path) -> None:
    cluster = write_cluster(tmp_path / "cluster.json", emulated_hosts())
    manifest: Manifest = generate(ppipe_plan(), {}, cluster, tmp_path / "deploy", emulated_tensor_scale=SCALE)
    pipe = manifest.model(MODEL).pipelines[0]
    with Deployment(tmp_path / "deploy", log_dir=tmp_path / "logs"):
        sc = SidecarProcess(manifest=tmp_path / "deploy", log_path=tmp_path / "sidecar.log")
        sc.start()
        try:
            with grpcclient.InferenceServerClient(sc.grpc_url) as c:
                meta = c.get_model_metadata(MODEL, as_json=True)
            assert [(t["name"], t["datatype"], t["shape"]) for t in meta["inputs"]] == [("input", "FP32",
                                                                                        ["-1", "3", "22", "22"])]
            assert [(t["name"], t["shape"]) for t in meta["outputs"]] == [("output", ["-1", "10"])]
            rng = np.random.default_rng(5)
            for n in (2, 2, 1):  # full planned batches go at once; a lone request waits for company first
                x = rng.standard_normal((n, 3, 22, 22)).astype(np.float32)
                t0 = time.monotonic()
                y = _infer(sc.grpc_url, x)
                # held as profiled, and the T4 -> L4 hop for its profiled bytes over a 10 Gbps link (80 kB moved)
                link_us = n * pipe.stages[1].network_bytes_per_request() * 8 / 10e3
                assert time.monotonic() - t0 >= (sum(s.latency_us[n] for s in pipe.stages) + link_us) / 1e6
                np.testing.assert_array_equal(y, expected_chain(pipe, x))
                # the checksum has teeth: a skipped, repeated or swapped hop, or another input, gives another answer
                for order in ([0, 2], [0, 1, 1, 2], [1, 0, 2]):
                    assert not np.array_equal(y, expected_chain(pipe, x, order))
                assert not np.array_equal(y, expected_chain(pipe, x + 1))
            log = (tmp_path / "sidecar.log").read_text()
            assert "event=clock_lead" in log and "Traceback" not in log
        finally:
            pid = sc.proc.pid if sc.proc else None
            assert sc.stop() == 0
    assert pid is not None and not list(Path("/dev/shm").glob(f"{PREFIX}{pid}_*"))
