"""The GPU code paths checked on a CPU machine (issue 50): nothing falls back to the CPU silently, GPU names map to
one table of types, TensorRT's profile shapes, caches and checks, the engine of GPU partitions is the profile's.
What only a GPU can show is in tests/gpu (``make gpu-check``)."""

from __future__ import annotations

import importlib.machinery
import sys
import types
from pathlib import Path

import numpy as np
import onnx
import pytest

from profiling import block_memory, engine_trt, engines
from profiling.gpu_types import GPU_TYPES, gpu_label, gpu_products, label_matches
from profiling.zoo import build_zoo_model
from runtime.launch import gpu_matches

# Names NVML reports (nvidia-smi --query-gpu=name) for the cards poolpipe plans for, and the type each is
NVML_NAMES = {
    "NVIDIA A100-SXM4-80GB": "A100-80", "NVIDIA A100 80GB PCIe": "A100-80", "NVIDIA A100-SXM4-40GB": "A100",
    "NVIDIA A100-PCIE-40GB": "A100", "Tesla V100-SXM2-16GB": "V100", "Tesla V100-PCIE-16GB": "V100",
    "Tesla V100-SXM2-32GB": "V100-32", "Tesla V100S-PCIE-32GB": "V100-32", "NVIDIA H100 80GB HBM3": "H100",
    "NVIDIA H100 PCIe": "H100", "NVIDIA H100 NVL": "H100", "NVIDIA L4": "L4", "Tesla T4": "T4", "NVIDIA T4": "T4",
    "Tesla P4": "P4", "NVIDIA A10": "A10", "NVIDIA H200": "H200",
}


@pytest.mark.parametrize("name", sorted(NVML_NAMES))
def test_nvml_names_map_to_one_table_of_types(name: str) -> None:
    """The label a profile gets by default, the device tables' key and launch's type check agree for every
    variant (the old default label made "NVIDIA A100-SXM4-80GB" into "A100-SXM4-80GB", in no table)."""
    label = gpu_label(name)
    assert label == NVML_NAMES[name]
    assert label in block_memory.DEVICE_MEMORY_GB and label in block_memory.DEVICE_BANDWIDTH_GBS
    assert gpu_matches(label, name) and label_matches(label, name)
    assert name.replace(" ", "-") in gpu_products(label)  # Kubernetes: GPU Feature Discovery's product label


def test_memory_variants_belong_to_their_family_and_other_cards_do_not_match() -> None:
    assert gpu_matches("A100", "NVIDIA A100-SXM4-80GB") and gpu_matches("V100", "Tesla V100-SXM2-32GB")
    assert not gpu_matches("A100-80", "NVIDIA A100-SXM4-40GB") and not gpu_matches("A10", "NVIDIA A100-SXM4-40GB")
    assert not gpu_matches("T4", "NVIDIA RTX A4000") and gpu_label("NVIDIA RTX A4000") == "RTX-A4000"
    assert not gpu_matches("L4", "NVIDIA L40S") and not gpu_matches("P4", "Tesla P40")
    assert block_memory.DEVICE_MEMORY_GB["A100-80"] == 80 and block_memory.DEVICE_MEMORY_GB["V100"] == 16
    assert len({t.label for t in GPU_TYPES}) == len(GPU_TYPES)


def test_default_profile_label_is_the_table_label(monkeypatch: pytest.MonkeyPatch) -> None:
    from profiling import devices, profile_cli

    monkeypatch.setattr(devices, "gpu_names", lambda: ["NVIDIA L4", "NVIDIA A100-SXM4-80GB"])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # CUDA's device 0 is NVML's 1 (PCI bus order)
    assert profile_cli._default_label("cuda") == "A100-80"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert profile_cli._default_label("cuda") == "L4"


@pytest.fixture(scope="module")
def small_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_zoo_model("mobilenet", tmp_path_factory.mktemp("gpu-paths") / "mobilenet.onnx", input_hw=32)


def test_an_onnxruntime_that_lists_cuda_but_runs_the_cpu_is_refused(small_model: Path, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """onnxruntime-gpu lists CUDAExecutionProvider even where CUDA or cuDNN does not load, then builds a CPU
    session and only logs it (onnxruntime #17801, #23372). This CPU-only onnxruntime, asked for CUDA as that
    listing invites, does the same; the engine must refuse, naming the provider that ran."""
    monkeypatch.setenv("POOLPIPE_ENGINE_CACHE", str(tmp_path))  # ort-trt's engine cache directory
    listed = ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]
    monkeypatch.setattr(engines, "_ort_providers", lambda: listed)
    with pytest.raises(engines.EngineError, match="asked onnxruntime .* for CUDAExecutionProvider, but the session "
                                                  "runs on CPUExecutionProvider"):
        engines.open_engine(str(small_model), "ort", "cuda")
    with pytest.raises(engines.EngineError, match="for TensorrtExecutionProvider, but the session runs on "
                                                  "CPUExecutionProvider"):
        engines.open_engine(str(small_model), "ort-trt", "cuda", max_batch=4)
    cpu = engines.open_engine(str(small_model), "ort", "cpu")
    assert cpu.providers == ["CPUExecutionProvider"]


def test_no_gpu_engine_is_an_error_not_the_cpu() -> None:
    """Here no GPU engine can run: the engine used when none is named is an error naming each engine's problem
    (the backend's 'auto' on a KIND_GPU instance switched to ONNX Runtime on the CPU with a log line)."""
    with pytest.raises(engines.EngineError, match="no GPU engine can run here: engine trt needs") as e:
        engines.default_engine("cuda")
    assert "engine ort on cuda needs onnxruntime with CUDAExecutionProvider" in str(e.value)
    assert engines.default_engine("cpu") == "ort"


def _installed(monkeypatch: pytest.MonkeyPatch, name: str, **attrs: object) -> None:
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    for k, v in attrs.items():
        setattr(module, k, v)
    monkeypatch.setitem(sys.modules, name, module)


def test_trt_and_torch_need_a_pytorch_with_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """TensorRT (buffers in torch) and onnx2torch are chosen only where torch has CUDA. torch and tensorrt are not
    installable on this CPU machine: stand-in modules answer as a CPU build of torch does (torch.version.cuda None,
    torch.cuda.is_available() False)."""
    cpu_torch = types.SimpleNamespace(is_available=lambda: False)
    _installed(monkeypatch, "torch", __version__="2.4.0+cpu", version=types.SimpleNamespace(cuda=None), cuda=cpu_torch)
    _installed(monkeypatch, "tensorrt", __version__="10.3.0")
    _installed(monkeypatch, "onnx2torch")
    for engine in ("trt", "torch"):
        assert engines.engine_problem(engine, "cuda") == (f"engine {engine} needs PyTorch with CUDA: PyTorch "
                                                          "2.4.0+cpu is a CPU build (pip install torch with CUDA)")
    _installed(monkeypatch, "torch", __version__="2.4.0", version=types.SimpleNamespace(cuda="12.4"), cuda=cpu_torch)
    assert engines.engine_problem("trt", "cuda") == "engine trt needs PyTorch with CUDA: PyTorch 2.4.0 sees no CUDA " \
                                                    "device"
    with pytest.raises(engines.EngineError, match="no GPU engine can run here: engine trt needs PyTorch with CUDA"):
        engines.default_engine("cuda")


def test_tensorrt_profile_shapes_cover_every_dynamic_dimension() -> None:
    assert engine_trt.profile_shapes("x", (-1, 3, 32, 32), 8, None) == ((1, 3, 32, 32), (4, 3, 32, 32),
                                                                        (8, 3, 32, 32))
    # a dynamic dimension after the batch takes the config's size; unknown, it is refused, never guessed
    assert engine_trt.profile_shapes("x", (-1, 3, -1, -1), 4, {"x": [3, 64, 48]})[2] == (4, 3, 64, 48)
    with pytest.raises(engine_trt.TrtError, match="input 'x' has a dynamic dimension 2"):
        engine_trt.profile_shapes("x", (-1, 3, -1, 32), 4, None)
    assert engine_trt.profile_shapes("x", (1, 3, 8), 64, None) == ((1, 3, 8),) * 3  # a fixed batch stays fixed
    shapes = {"a": engine_trt.profile_shapes("a", (-1, 2), 16, None), "b": engine_trt.profile_shapes("b", (1, 2), 16,
                                                                                                      None)}
    assert engine_trt.batch_range(shapes) == (1, 1)
    with pytest.raises(engine_trt.TrtError, match="TensorRT execute_async_v3 failed"):
        engine_trt.check(False, "execute_async_v3")  # TensorRT's False returns are no longer ignored


def test_engine_cache_keys_change_with_everything_that_changes_an_engine() -> None:
    base = ("partition".encode(), "NVIDIA L4", "10.3.0", 1, 64, "fp32")
    key = engine_trt.cache_key(*base)
    for i, other in enumerate((b"other", "Tesla T4", "10.4.0", 2, 32, "fp16")):
        changed = list(base)
        changed[i] = other
        assert engine_trt.cache_key(*changed) != key
    assert engine_trt.cache_key(*base) == key and "/" not in key and " " not in key


def test_ort_tensorrt_options_give_profile_shapes_and_caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ONNX Runtime's TensorRT provider builds once for batches 1..max and keeps its engine and timing caches
    under the cache key (without profile shapes it rebuilt on every unseen batch)."""
    monkeypatch.setenv("POOLPIPE_ENGINE_CACHE", str(tmp_path))
    opts = engine_trt.ort_trt_options({"input": (-1, 3, 32, 32), "mask": (-1, 4)}, 16, None, "k1", 0)
    assert opts["trt_profile_min_shapes"] == "input:1x3x32x32,mask:1x4"
    assert opts["trt_profile_opt_shapes"] == "input:8x3x32x32,mask:8x4"
    assert opts["trt_profile_max_shapes"] == "input:16x3x32x32,mask:16x4"
    assert opts["trt_engine_cache_enable"] and opts["trt_timing_cache_enable"]
    assert opts["trt_engine_cache_path"] == opts["trt_timing_cache_path"] == str(tmp_path / "k1")
    assert (tmp_path / "k1").is_dir() and engine_trt.cache_dir() == tmp_path


def test_trt_workspace_is_what_the_memory_estimate_counts() -> None:
    assert engine_trt.WORKSPACE_BYTES == block_memory.ENGINE_WORKSPACE_BYTES
    # one vGPU: tritonserver's context and pool, then a context and a workspace per Python-backend instance
    one, two = block_memory.vgpu_overhead_bytes(1), block_memory.vgpu_overhead_bytes(2)
    assert two - one == block_memory.INSTANCE_CONTEXT_BYTES + block_memory.ENGINE_WORKSPACE_BYTES
    assert one == block_memory.SERVER_CONTEXT_BYTES + two - one == block_memory.CONTEXT_BYTES > 512 << 20


def test_the_backend_carries_the_tensorrt_module(small_model: Path) -> None:
    """generate copies engine_trt.py beside engines.py; engines.py loads it from beside itself."""
    from backends.partition import BACKEND_FILES

    assert {p.name for p in BACKEND_FILES} >= {"model.py", "engines.py", "engine_trt.py", "emulated.py"}
    assert engines._trt_module().cache_key is not None
    proto = onnx.load(str(small_model))
    assert engines.open_engine(proto.SerializeToString(), "ort").run(
        {"input": np.zeros((2, 3, 32, 32), np.float32)})[0].shape[0] == 2


def test_one_onnx_runtime_per_environment() -> None:
    """onnxruntime and onnxruntime-gpu install the same module: the base dependencies name neither, the cpu and
    gpu extras one each (the base named onnxruntime while the GPU recipe added onnxruntime-gpu)."""
    import tomllib

    from tests.conftest import ROOT

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

    def ort(reqs: list[str]) -> set[str]:
        return {r.split(">")[0].split("=")[0].split("[")[0].strip() for r in reqs if r.startswith("onnxruntime")}

    extras = project["optional-dependencies"]
    assert ort(project["dependencies"]) == set()
    assert ort(extras["cpu"]) == {"onnxruntime"} and ort(extras["gpu"]) == {"onnxruntime-gpu"}
    assert all(not ort(reqs) for name, reqs in extras.items() if name not in ("cpu", "gpu"))
    assert {"tensorrt", "torch", "nvidia-ml-py"} <= {r.split(">")[0] for r in extras["gpu"]}
    assert "'.[test,$(ORT)]'" in (ROOT / "Makefile").read_text()
    assert list(engines.onnxruntime_distributions()) == ["onnxruntime"]  # this environment: the cpu extra


def test_gpu_partitions_run_the_engine_their_profile_measured(small_model: Path, tmp_path: Path) -> None:
    """generate resolves the engine of GPU partitions once and prints it: the one the profile measured (here trt on
    L4), auto where the profile records none (never the CPU), the CPU only where asked for by name."""
    import json
    from dataclasses import replace

    from model_repository_gen.triton_config import parse_config
    from tests.conftest import run_cli
    from tests.deploy_helpers import make_plan, make_profile

    prof = make_profile(small_model, "mobilenet", 2, {"L4": (1,), "T4": (1,), "P4": (1,)})
    prof = replace(prof, provenance={"source": "tests", "devices": {"L4": {"engine": "trt", "providers": ["TensorRT"]},
                                                                     "T4": {"source": "reference data"},
                                                                     "P4": {"engine": "ort"}}})
    plan = make_plan(prof, [[((0, 1), "L4", 1, 1), ((1, 2), "T4", 1, 1)], [((0, 2), "P4", 1, 1)]])
    (tmp_path / "plan.json").write_text(json.dumps(plan.to_dict()))
    hosts = [{"name": n, "address": f"10.0.0.{i}", "gpu_type": t, "gpus": 1, "bandwidth_gbps": 10}
             for i, (n, t) in enumerate((("l4", "L4"), ("t4", "T4"), ("p4", "P4")))]
    (tmp_path / "cluster.json").write_text(json.dumps({"hosts": hosts}))
    r = run_cli("generate", "--plan", tmp_path / "plan.json", "--cluster", tmp_path / "cluster.json", "--onnx",
                f"mobilenet={small_model}", "--out", tmp_path / "d", "--engine", "P4=cpu")
    assert r.returncode == 0, r.stderr
    assert "engine of mobilenet on L4: trt (profile)" in r.stdout
    assert "engine of mobilenet on T4: auto (the profile records no engine)" in r.stdout
    assert "engine of mobilenet on P4: cpu (--engine)" in r.stdout

    def params(host: str) -> dict[str, str]:
        cfg = parse_config(next((tmp_path / "d" / host).glob("*/model_repository/*/config.pbtxt")))
        return {k: v.string_value for k, v in cfg.parameters.items() if k in ("engine", "device")}

    assert params("l4") == {"engine": "trt"} and params("t4") == {"engine": "auto"}
    assert params("p4") == {"engine": "ort", "device": "cpu"}
    stages = json.loads((tmp_path / "d" / "manifest.json").read_text())["models"][0]["pipelines"]
    assert [[s["engine"] for s in p["stages"]] for p in stages] == [["trt", "auto"], ["cpu"]]
    for bad, why in ((["--engine", "L4=fast"], "ENGINE one of"), (["--engine", "V100=trt"], "no partition")):
        r = run_cli("generate", "--plan", tmp_path / "plan.json", "--cluster", tmp_path / "cluster.json", "--onnx",
                    f"mobilenet={small_model}", "--out", tmp_path / "e", *bad)
        assert r.returncode == 2 and why in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_generate_checks_each_vgpu_against_its_gpu_and_mps_share(small_model: Path, tmp_path: Path) -> None:
    """Weights, activations at the planned batch, tritonserver's context and pool and one context and workspace
    per backend instance, against 1/V of the GPU (the MPS limit) and the whole GPU; checked before writing."""
    from dataclasses import replace

    from model_repository_gen.cluster_file import cluster_from_dict
    from model_repository_gen.generate import generate
    from poolpipe_common.errors import InputError
    from profiling.block_memory import BlockMemory
    from tests.deploy_helpers import make_plan, make_profile

    base = make_profile(small_model, "mobilenet", 2, {"L4": (1, 2)})
    hosts = [{"name": "g", "address": "10.0.0.1", "gpu_type": "L4", "gpus": 2, "bandwidth_gbps": 10}]

    def gen(activation_gb: float, v: int, out: str) -> None:
        prof = replace(base, memory=BlockMemory((10 << 20, 10 << 20), (int(activation_gb * 1e9), 1 << 20)))
        plan = make_plan(prof, [[((0, 1), "L4", v, 1), ((1, 2), "L4", v, 1)]], batch=2)
        generate(plan, {"mobilenet": small_model}, cluster_from_dict({"hosts": hosts}), tmp_path / out)

    gen(6.0, 1, "whole")  # 12 GB of activations and ~1 GB of processes fit a whole 24 GB L4
    with pytest.raises(InputError, match=r"vGPU g-gpu0-s0 needs 13\.\d\d GB .*tritonserver and 1 backend instance"
                                         r"\(s\) 1\.01 GB\) but a 1/2 share \(the MPS limit\) of a L4 has 12\.00 GB"):
        gen(6.0, 2, "half")
    assert not (tmp_path / "half").exists()  # refused before anything was written
    with pytest.raises(InputError, match=r"needs 25\.\d\d GB .* but a whole L4 has 24\.00 GB"):
        gen(12.0, 1, "over")
