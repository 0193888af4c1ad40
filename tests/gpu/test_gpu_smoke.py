"""The GPU smoke (``make gpu-check``, issue 50): every GPU path against the real libraries, failing rather than
printing. Under ten minutes on one GPU: the environment (NVML names to labels to launch's type check, one ONNX
Runtime with CUDA, TensorRT and torch with CUDA, an MPS daemon started and stopped here), each engine on a two-block
zoo cut with fp16 boundaries (the provider that ran is the one asked, outputs match CPU ONNX Runtime at batches 1, 3
and the maximum, the maximum + 1 refused, build time printed), a V=2 deployment on one GPU through launch and serve
(outputs match, every backend process an MPS client, the server logs name the GPU engine, loaded within the launch
timeout, device memory within the estimate), and CUDA shared memory between its two servers."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import replace

import numpy as np
import pytest

from model_repository_gen.cluster_file import cluster_from_dict
from model_repository_gen.cut import cut_partition, partition_io
from model_repository_gen.generate import generate
from model_repository_gen.manifest import load_manifest
from profiling import engines
from profiling.block_memory import DEVICE_MEMORY_GB, vgpu_overhead_bytes
from profiling.devices import mps_running
from profiling.gpu_types import gpu_label, label_matches
from profiling.zoo import build_zoo_model
from runtime.launch import HostLaunch, check_host_hardware, discover_gpus
from runtime.sidecar_process import SidecarProcess
from tests.deploy_helpers import make_plan, make_profile, reference_output

pytestmark = pytest.mark.gpu

MAX_BATCH = 8
ASKED = {"ort": "CUDAExecutionProvider", "ort-trt": "TensorrtExecutionProvider", "trt": "TensorRT", "torch": "torch"}
NP = {"FP32": np.float32, "FP16": np.float16}


def say(line: str) -> None:
    print(f"gpu-check: {line}", flush=True)


def mps_control(command: str | None, env: dict[str, str]) -> str:
    """``nvidia-cuda-mps-control -d`` (None: start the daemon), or one command on its stdin; its answer."""
    args, stdin = (["nvidia-cuda-mps-control", "-d"], None) if command is None else (["nvidia-cuda-mps-control"],
                                                                                     command + "\n")
    r = subprocess.run(args, input=stdin, capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, f"nvidia-cuda-mps-control {command or '-d'}: {r.stdout}{r.stderr}"
    return r.stdout


@pytest.fixture(scope="session", autouse=True)
def gpu_session(tmp_path_factory: pytest.TempPathFactory):
    """An MPS daemon of this session's own (pipe and log directories here), started before anything touches CUDA
    and quit at the end; fresh engine caches; CUDA numbering as NVML's."""
    d = tmp_path_factory.mktemp("mps")
    os.environ.update(CUDA_MPS_PIPE_DIRECTORY=str(d / "pipe"), CUDA_MPS_LOG_DIRECTORY=str(d / "log"),
                      POOLPIPE_ENGINE_CACHE=str(d / "engines"), CUDA_DEVICE_ORDER="PCI_BUS_ID")
    (d / "pipe").mkdir()
    (d / "log").mkdir()
    mps_control(None, dict(os.environ))
    deadline = time.monotonic() + 30
    while not mps_running() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert mps_running(), "the MPS control daemon did not start"
    say(f"MPS daemon started (pipe {d / 'pipe'})")
    yield d
    mps_control("quit", dict(os.environ))
    deadline = time.monotonic() + 30
    while (d / "pipe" / "control").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    say("MPS daemon stopped")


def test_environment() -> None:
    gpus = discover_gpus()
    assert gpus, "NVML lists no GPU"
    for g in gpus:
        label = gpu_label(g.name)
        say(f"GPU {g.index}: {g.name} -> type {label}, {g.memory_bytes / 2**30:.1f} GiB")
        assert label_matches(label, g.name) and label in DEVICE_MEMORY_GB, f"{g.name}: type {label} not in the table"
    label = gpu_label(gpus[0].name)
    check_host_hardware(HostLaunch("h", "127.0.0.1", label, "gpu", 1, True, ()), gpus[:1], mps=True)
    assert list(engines.onnxruntime_distributions()) == ["onnxruntime-gpu"], engines.onnxruntime_distributions()
    import onnxruntime
    import tensorrt
    import torch

    assert "CUDAExecutionProvider" in onnxruntime.get_available_providers()
    assert torch.cuda.is_available() and torch.version.cuda, "torch has no CUDA"
    say(f"onnxruntime-gpu {onnxruntime.__version__}, TensorRT {tensorrt.__version__}, torch {torch.__version__} "
        f"(CUDA {torch.version.cuda})")
    assert engines.default_engine("cuda") == "trt"


@pytest.fixture(scope="session")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """resnet (64x64) cut in two blocks with fp16 boundaries, and its profile on this GPU's type."""
    d = tmp_path_factory.mktemp("zoo")
    model = build_zoo_model("resnet", d / "resnet.onnx", input_hw=64)
    label = gpu_label(discover_gpus()[0].name)
    prof = make_profile(model, "resnet", 2, {label: (1, 2)})
    parts = [cut_partition(model, prof, i, i + 1, fp16_boundaries=True) for i in (0, 1)]
    return {"model": model, "label": label, "profile": prof, "parts": parts}


def _feeds(part, batch: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    ins, _ = partition_io(part)
    return {t.name: rng.standard_normal((batch, *t.shape)).astype(NP[t.datatype]) for t in ins}


def _close(got: np.ndarray, want: np.ndarray, what: str) -> None:
    got, want = got.astype(np.float32), want.astype(np.float32)
    err = float(np.max(np.abs(got - want)))
    assert err <= 2e-2 * max(1.0, float(np.max(np.abs(want)))), f"{what}: max |error| {err}"


@pytest.mark.parametrize("engine", ["ort", "ort-trt", "trt", "torch"])
def test_engine(engine: str, zoo: dict) -> None:
    if engine == "torch" and engines.engine_problem("torch", "cuda"):
        pytest.skip(f"engine torch not installed: {engines.engine_problem('torch', 'cuda')}")
    rng = np.random.default_rng(0)
    for i, part in enumerate(zoo["parts"]):
        data = part.SerializeToString()
        t0 = time.perf_counter()
        eng = engines.open_engine(data, engine, "cuda", max_batch=MAX_BATCH)
        took = time.perf_counter() - t0
        say(f"engine {engine}, partition {i}: loaded in {took:.1f} s: {eng.description}")
        assert eng.providers[0].startswith(ASKED[engine]), eng.providers
        cpu = engines.open_engine(data, "ort", "cpu")
        for batch in (1, 3, MAX_BATCH):
            feeds = _feeds(part, batch, rng)
            for got, want in zip(eng.run(feeds), cpu.run(feeds)):
                assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, want.shape, got.dtype)
                _close(got, want, f"engine {engine} partition {i} batch {batch}")
        if engine in ("trt", "ort-trt"):
            with pytest.raises(RuntimeError, match=f"batch {MAX_BATCH + 1} is over"):
                eng.run(_feeds(part, MAX_BATCH + 1, rng))
        if engine == "trt":
            again = engines.open_engine(data, engine, "cuda", max_batch=MAX_BATCH)
            assert "from the engine cache" in again.description, again.description


def _mps_clients(env: dict[str, str]) -> set[int]:
    servers = [int(x) for x in mps_control("get_server_list", env).split() if x.isdigit()]
    return {int(x) for s in servers for x in mps_control(f"get_client_list {s}", env).split() if x.isdigit()}


def _stubs(root_pid: int) -> list[int]:
    import psutil

    return [p.pid for p in psutil.Process(root_pid).children(recursive=True)
            if "triton_python_backend_stub" in " ".join(p.cmdline() or [p.name()])]


def _used_bytes() -> int:
    import pynvml

    pynvml.nvmlInit()
    try:
        return int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).used)
    finally:
        pynvml.nvmlShutdown()


@pytest.fixture(scope="session")
def deployment(zoo: dict, tmp_path_factory: pytest.TempPathFactory):
    """Two vGPUs of GPU 0 at V=2 (the two partitions, engine trt as the profile says), through poolpipe launch."""
    d = tmp_path_factory.mktemp("deploy")
    label = zoo["label"]
    prof = replace(zoo["profile"], provenance={"devices": {label: {"engine": "trt", "device": "cuda"}}})
    plan = make_plan(prof, [[((0, 1), label, 2, 1), ((1, 2), label, 2, 1)]], batch=4)
    hosts = [{"name": "gpu", "address": "127.0.0.1", "gpu_type": label, "gpus": 1, "bandwidth_gbps": 10,
              "base_port": 0}]
    generate(plan, {"resnet": zoo["model"]}, cluster_from_dict({"hosts": hosts}), d / "out", fp16_boundaries=True)
    manifest = load_manifest(d / "out")
    before = _used_bytes()
    out = d / "launch.out"
    t0 = time.monotonic()
    with open(out, "wb") as f:
        proc = subprocess.Popen([sys.executable, "-m", "poolpipe", "launch", str(d / "out")], stdout=f,
                                stderr=subprocess.STDOUT, env=dict(os.environ))
    try:
        while "ready:" not in out.read_text():
            assert proc.poll() is None, f"poolpipe launch exited:\n{out.read_text()[-3000:]}"
            assert time.monotonic() - t0 < 480, f"not ready in 480 s:\n{out.read_text()[-3000:]}"
            time.sleep(0.5)
        ready_s = time.monotonic() - t0
        say(f"launch: 2 vGPUs (V=2, engine trt) ready in {ready_s:.1f} s")
        yield {"dir": d / "out", "manifest": manifest, "launch": proc, "ready_s": ready_s, "before": before,
               "out": out}
    finally:
        proc.terminate()
        proc.wait(60)


def test_v2_deployment_through_launch_and_serve(deployment: dict, zoo: dict) -> None:
    import tritonclient.grpc as grpcclient

    m = deployment["manifest"]
    assert deployment["ready_s"] < 1800  # launch's timeout where a TensorRT engine may be built first
    used = _used_bytes() - deployment["before"]
    estimate = 2 * vgpu_overhead_bytes(1)
    say(f"device memory of the two vGPUs: {used / 2**30:.2f} GiB measured (MPS server included), estimate "
        f"{estimate / 2**30:.2f} GiB plus weights and activations")
    assert used <= estimate + (768 << 20), "the per-vGPU memory estimate is below what the servers hold"
    stubs = _stubs(deployment["launch"].pid)
    clients = _mps_clients(dict(os.environ))
    assert len(stubs) == 2 and set(stubs) <= clients, f"backend stubs {stubs}, MPS clients {sorted(clients)}"
    for g in m.vgpus:
        log = (deployment["dir"] / g.repository).parent / "tritonserver.log"
        assert "engine trt: TensorRT" in log.read_text(errors="replace"), f"{log} does not name engine trt"
        assert g.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID" and g.env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    with SidecarProcess(manifest=deployment["dir"]) as sc:
        client = grpcclient.InferenceServerClient(sc.grpc_url)
        x = np.random.default_rng(1).standard_normal((3, *m.model("resnet").inputs[0].shape)).astype(np.float32)
        inp = grpcclient.InferInput(m.model("resnet").inputs[0].name, list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        for _ in range(3):
            y = client.infer("resnet", [inp]).as_numpy(m.model("resnet").outputs[0].name)
            _close(y, reference_output(zoo["model"], x), "served through the sidecar")
    say("served through launch and serve: outputs match CPU ONNX Runtime")


def test_cuda_shared_memory_between_two_servers(deployment: dict, zoo: dict) -> None:
    import tritonclient.grpc as grpcclient
    import tritonclient.utils.cuda_shared_memory as cudashm

    m = deployment["manifest"]
    st0, st1 = m.model("resnet").pipelines[0].stages
    a = grpcclient.InferenceServerClient(m.vgpu(st0.vgpus[0]).grpc_url)
    b = grpcclient.InferenceServerClient(m.vgpu(st1.vgpus[0]).grpc_url)
    batch = 2
    x = np.random.default_rng(2).standard_normal((batch, *st0.inputs[0].shape)).astype(np.float32)
    sizes = {"in": x.nbytes, "mid": batch * st0.outputs[0].bytes_per_request(),
             "out": batch * st1.outputs[0].bytes_per_request()}
    regions = {k: cudashm.create_shared_memory_region(f"poolpipe_gpucheck_{k}", n, 0) for k, n in sizes.items()}
    try:
        cudashm.set_shared_memory_region(regions["in"], [x])
        for client, names in ((a, ("in", "mid")), (b, ("mid", "out"))):
            for k in names:
                client.register_cuda_shared_memory(f"poolpipe_gpucheck_{k}", cudashm.get_raw_handle(regions[k]), 0,
                                                   sizes[k])
        for client, st, src, dst in ((a, st0, "in", "mid"), (b, st1, "mid", "out")):
            t = st.inputs[0]
            inp = grpcclient.InferInput(t.name, [batch, *t.shape], t.datatype)
            inp.set_shared_memory(f"poolpipe_gpucheck_{src}", sizes[src])
            out = grpcclient.InferRequestedOutput(st.outputs[0].name)
            out.set_shared_memory(f"poolpipe_gpucheck_{dst}", sizes[dst])
            client.infer(st.triton_model, [inp], outputs=[out])
        y = cudashm.get_contents_as_numpy(regions["out"], NP[st1.outputs[0].datatype], [batch, *st1.outputs[0].shape])
        _close(y, reference_output(zoo["model"], x), "through CUDA shared memory between two servers")
        say("CUDA shared memory between the two servers of GPU 0: outputs match")
    finally:
        for client in (a, b):
            client.unregister_cuda_shared_memory()
        for h in regions.values():
            cudashm.destroy_shared_memory_region(h)
