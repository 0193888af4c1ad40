"""``launch`` on GPU hosts, checked on a CPU machine (issue 50): the backend's Python keeps its own packages, MIG
vGPUs start only on their resolved instance, engines are checked before anything starts, readiness waits cover a
first TensorRT build and report progress."""

from __future__ import annotations

import sys
import sysconfig
from pathlib import Path

import pytest

from backends.partition import ENGINE_FILES
from model_repository_gen.cluster_file import cluster_from_dict
from model_repository_gen.generate import generate
from poolpipe_common.errors import InputError
from profiling.zoo import build_zoo_model
from runtime import launch as launch_mod
from runtime.gpu_preflight import MigInstance, engine_problems, mig_env
from runtime.launch import Deployment
from runtime.tritonserver import TritonProcess, find_triton, server_env
from tests.deploy_helpers import make_plan, make_profile
from tests.test_generate import cpu_hosts

PIPELINES = [[((0, 1), "T4", 1, 1), ((1, 3), "L4", 2, 2)]]


def gpu_hosts() -> list[dict]:
    return [{**h, "device": "gpu", "address": "10.0.0.1", "base_port": 8000 + 100 * i}
            for i, h in enumerate(cpu_hosts())]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    d = tmp_path_factory.mktemp("gpu-launch")
    onnx_path = build_zoo_model("resnet", d / "resnet.onnx", input_hw=32)
    return onnx_path, make_profile(onnx_path, "resnet", 3, {"L4": (1, 2), "T4": (1,)})


def test_another_pythons_backend_keeps_its_own_packages(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """NGC's tritonserver runs its Python backend on its own python3: this launcher's site-packages (another Python
    version, another numpy/onnxruntime ABI) must not come first on its path. The wheel's stub runs this very
    interpreter, which keeps them."""
    site = sysconfig.get_paths()["purelib"]
    assert site in server_env(find_triton())["PYTHONPATH"].split(":")  # the wheel: this interpreter
    monkeypatch.setenv("POOLPIPE_TRITONSERVER", str(tmp_path / "opt" / "tritonserver" / "bin" / "tritonserver"))
    monkeypatch.setenv("PYTHONPATH", "/user/chosen")
    env = server_env(find_triton())
    assert env["PYTHONPATH"] == "/user/chosen" and site not in env["PYTHONPATH"]
    monkeypatch.setenv("POOLPIPE_BACKEND_PYTHON", sys.executable)  # told it is this interpreter: they are kept
    assert site in server_env(find_triton())["PYTHONPATH"].split(":")


def test_mig_vgpus_start_only_on_their_resolved_instance(tmp_path: Path) -> None:
    env = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "POOLPIPE_MIG_GPU": "0", "POOLPIPE_MIG_PROFILE": "3g.20gb",
           "POOLPIPE_MIG_START": "4"}
    found = [MigInstance(0, 4, 0, "MIG-aaaa"), MigInstance(0, 3, 4, "MIG-bbbb"), MigInstance(1, 3, 4, "MIG-cccc")]
    assert mig_env("g-gpu0-s1", env, found)["CUDA_VISIBLE_DEVICES"] == "MIG-bbbb"
    with pytest.raises(InputError, match="3g.20gb MIG instance at memory slice 4 of GPU 0, which this machine does "
                                         "not have"):
        mig_env("g-gpu0-s1", env, found[:1])
    # never started with the instance unresolved (it would compute on every GPU)
    with pytest.raises(InputError, match="a MIG vGPU whose instance is not resolved"):
        TritonProcess(tmp_path, env=env).spawn()


def test_engines_are_checked_in_the_backends_python(model: tuple[Path, object], tmp_path: Path) -> None:
    """Before a GPU host starts, the engine module beside its partitions is asked, in the Python backend's
    interpreter, whether each of their engines can run: one line naming the engine and the missing library."""
    problems = engine_problems(sys.executable, ENGINE_FILES[0], ["trt", "auto", "cpu"])
    assert set(problems) == {"trt", "auto"}
    assert problems["trt"] == "engine trt needs the Python package 'tensorrt' (pip install poolpipe[gpu])"
    assert problems["auto"].startswith("no GPU engine can run here")
    onnx_path, prof = model
    hosts = gpu_hosts()
    generate(make_plan(prof, PIPELINES), {"resnet": onnx_path}, cluster_from_dict({"hosts": hosts}), tmp_path / "d",
             engines={"T4": "trt"})
    dep = Deployment(tmp_path / "d", check_hardware=False)
    host = next(h for h in dep.launches if h.host == "t4box")
    with pytest.raises(InputError, match=r"host t4box: its GPU partitions run engine trt, which cannot load in the "
                                         r"Python backend's Python .*: engine trt needs the Python package 'tensorrt'"):
        dep.check_engines(host)


def test_readiness_waits_cover_a_first_tensorrt_build(model: tuple[Path, object], tmp_path: Path) -> None:
    onnx_path, prof = model
    plan = make_plan(prof, PIPELINES)
    gpu = gpu_hosts()
    generate(plan, {"resnet": onnx_path}, cluster_from_dict({"hosts": gpu}), tmp_path / "trt", engines={"T4": "trt"})
    assert Deployment(tmp_path / "trt", check_hardware=False).timeout_s == 1800  # was 180 s for every deployment
    assert Deployment(tmp_path / "trt", check_hardware=False, timeout_s=60).timeout_s == 60
    generate(plan, {"resnet": onnx_path}, cluster_from_dict({"hosts": gpu}), tmp_path / "ort",
             engines={"T4": "ort", "L4": "torch"})
    assert Deployment(tmp_path / "ort", check_hardware=False).timeout_s == 180


@pytest.mark.triton
def test_launch_reports_the_servers_still_loading(model: tuple[Path, object], tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """While servers load (here two CPU servers; on a GPU a first TensorRT build), the deployment says which are
    not ready yet, as often as WAIT_REPORT_S (made 0 here: every poll of a server that cannot be ready yet)."""
    from runtime.launch_cli import waiting_line

    onnx_path, prof = model
    generate(make_plan(prof, [[((0, 3), "T4", 1, 1)], [((0, 3), "L4", 1, 1)]]), {"resnet": onnx_path},
             cluster_from_dict({"hosts": cpu_hosts(1, 1)}), tmp_path / "d")
    monkeypatch.setattr(launch_mod, "WAIT_REPORT_S", 0.0)
    seen: list[tuple[list[str], float]] = []
    dep = Deployment(tmp_path / "d", on_wait=lambda pending, waited: seen.append((pending, waited)))
    lines = []
    dep.on_wait = lambda pending, waited: (seen.append((pending, waited)), lines.append(waiting_line(dep, pending,
                                                                                                    waited)))
    try:
        dep.start()
    finally:
        dep.stop()
    assert seen and set(seen[0][0]) == {"l4box-gpu0-s0", "t4box-gpu0-s0"} and seen[0][1] >= 0
    assert lines[0].startswith("still loading after 0 s of 180: l4box-gpu0-s0, t4box-gpu0-s0")
