"""What ``launch`` checks and resolves on a GPU host before a tritonserver starts: that the engines its partitions
run can load in the backend's Python, which MIG instance a MIG vGPU is, and how long a first start may take.

- **Engines**: the engine module copied beside every partition (engines.py) is asked, in the Python that runs the
  Python backend, whether each engine of the host's GPU stages can run (``engine_problem``; ``auto``: whether any
  GPU engine can), so a missing library is one line before anything starts rather than a model that fails to load.
- **MIG**: a MIG vGPU names its instance by parent GPU, profile and first memory slice (model_repository_gen.
  vgpu_env); NVML lists the instances, and the one that matches gives ``CUDA_VISIBLE_DEVICES=<its UUID>``.
- **Readiness**: a server whose engine may build a TensorRT engine on first load is waited for as long as the
  Kubernetes startup probe waits (model_repository_gen.k8s_pods.FIRST_BUILD_S), others ``DEFAULT_TIMEOUT_S``.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from model_repository_gen.gpu_engines import BUILDS_TENSORRT
from model_repository_gen.k8s_pods import FIRST_BUILD_S
from model_repository_gen.manifest import Manifest
from poolpipe_common.errors import InputError

DEFAULT_TIMEOUT_S = 180.0
PROBE_TIMEOUT_S = 120.0


def stage_engines(manifest: Manifest, vgpus: set[str]) -> set[str]:
    """The engines of the GPU stages these vGPUs serve."""
    return {s.engine for m in manifest.models for p in m.pipelines for s in p.stages
            if s.engine and vgpus & set(s.vgpus)}


def ready_timeout_s(manifest: Manifest, vgpus: set[str]) -> float:
    """How long to wait for these servers: long enough for a first TensorRT build where one may happen."""
    return float(FIRST_BUILD_S) if stage_engines(manifest, vgpus) & set(BUILDS_TENSORRT) else DEFAULT_TIMEOUT_S


_PROBE = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("poolpipe_preflight_engines", sys.argv[1])
m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
out = {}
for e in sys.argv[2:]:
    if e == "cpu":
        out[e] = m.engine_problem("ort", "cpu")
    elif e == "auto":
        try:
            m.default_engine("cuda"); out[e] = None
        except m.EngineError as x:
            out[e] = str(x)
    else:
        out[e] = m.engine_problem(e, "cuda")
print(json.dumps(out))
"""


def engine_problems(python: str, engines_py: Path, engines: Sequence[str]) -> dict[str, str]:
    """Engine -> why it cannot run, asked of the engine module in the backend's Python (``python``)."""
    if not engines:
        return {}
    try:
        r = subprocess.run([python, "-c", _PROBE, str(engines_py), *sorted(engines)], capture_output=True, text=True,
                           timeout=PROBE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        return {e_: f"the backend's Python {python} did not answer ({type(e).__name__})" for e_ in engines}
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["no output"])[-1]
        return {e: f"the backend's Python {python} cannot load the engine module: {last}" for e in engines}
    return {e: why for e, why in json.loads(r.stdout.strip().splitlines()[-1]).items() if why}


@dataclass(frozen=True)
class MigInstance:
    gpu_index: int  # the parent GPU, NVML's index
    slices: int  # compute slices of its GPU instance profile (1g -> 1)
    start: int  # its first memory slice
    uuid: str


def mig_env(vgpu: str, env: dict[str, str], instances: Sequence[MigInstance]) -> dict[str, str]:
    """``env`` with ``CUDA_VISIBLE_DEVICES`` the UUID of the MIG instance it names; InputError when none matches."""
    if "POOLPIPE_MIG_GPU" not in env:
        return env
    gpu, profile, start = int(env["POOLPIPE_MIG_GPU"]), env["POOLPIPE_MIG_PROFILE"], int(env["POOLPIPE_MIG_START"])
    slices = int(profile.split("g", 1)[0])
    for m in instances:
        if (m.gpu_index, m.slices, m.start) == (gpu, slices, start):
            return {**env, "CUDA_VISIBLE_DEVICES": m.uuid}
    have = ", ".join(f"GPU {m.gpu_index} {m.slices}g at slice {m.start}" for m in instances) or "none"
    raise InputError(f"vGPU {vgpu} runs on the {profile} MIG instance at memory slice {start} of GPU {gpu}, which "
                     f"this machine does not have (MIG instances: {have}); create it (nvidia-smi mig -cgi ... -C) "
                     "or re-plan")


def discover_mig_instances() -> list[MigInstance]:
    """The MIG instances of the local GPUs through NVML (InputError when NVML cannot say)."""
    try:
        import pynvml  # noqa: PLC0415

        pynvml.nvmlInit()
    except Exception as e:  # noqa: BLE001 - no pynvml, no driver
        raise InputError(f"MIG vGPUs need NVML to find their instances ({type(e).__name__}: {e})") from None
    try:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            parent = pynvml.nvmlDeviceGetHandleByIndex(i)
            for j in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(parent)):
                try:
                    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, j)
                except pynvml.NVMLError:
                    continue
                gi = pynvml.nvmlDeviceGetGpuInstanceById(parent, pynvml.nvmlDeviceGetGpuInstanceId(mig))
                info = pynvml.nvmlGpuInstanceGetInfo(gi)
                slices = pynvml.nvmlDeviceGetAttributes(mig).gpuInstanceSliceCount
                uuid = pynvml.nvmlDeviceGetUUID(mig)
                out.append(MigInstance(i, int(slices), int(info.placement.start),
                                       uuid.decode() if isinstance(uuid, bytes) else str(uuid)))
        return out
    except pynvml.NVMLError as e:
        raise InputError(f"cannot read the MIG instances through NVML ({e}); set CUDA_VISIBLE_DEVICES in "
                         "launch.sh (POOLPIPE_MIG_UUID_<VGPU>) instead") from None
    finally:
        pynvml.nvmlShutdown()
