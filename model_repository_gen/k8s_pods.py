"""What a tritonserver pod of ``generate --k8s`` needs beyond its container: /dev/shm for the Python backend, a
startup probe that outlasts a first TensorRT build, and a GPU share the NVIDIA device plugin can give.

- **/dev/shm**: the Python backend moves every input and output tensor between tritonserver and its stub
  through shared memory, and a container runtime gives a pod 64 MiB. Each pod mounts an emptyDir of medium
  Memory there, sized from the plan: per stage the vGPU serves, twice (a batch computing, the next arriving)
  its largest batch's input and output bytes, plus the backend's own regions; the pod requests that memory too.
- **Startup**: a vGPU whose engine may build a TensorRT engine on first load (trt, ort-trt, auto) gets a startup
  probe of ``FIRST_BUILD_S``; the others five minutes.
- **Shares**: the device plugin's MPS sharing splits a GPU into equal replicas (100/replicas of the threads each,
  one replica per container) and knows no MIG placement of ours, so an unequal MPS share or a MIG instance is
  refused at generate time, in one line.
"""

from __future__ import annotations

from typing import Any

from model_repository_gen.gpu_engines import BUILDS_TENSORRT
from model_repository_gen.manifest import Manifest, VGpuInfo
from poolpipe_common.errors import InputError

MIB = 1 << 20
SHM_BASE_BYTES = 64 * MIB  # the Python backend's own regions (control, per-instance default and growth)
IN_FLIGHT = 2  # batches whose tensors share /dev/shm at once: one computing, the next arriving
STARTUP_PERIOD_S = 5
STARTUP_S = 300  # a server whose partitions load without building anything
FIRST_BUILD_S = 1800  # TensorRT building engines for V servers at 1/V of the SMs each (poolpipe launch waits as long)


def shm_bytes(manifest: Manifest, vgpu: str) -> int:
    """/dev/shm a vGPU's tritonserver needs (module doc), rounded up to MiB."""
    need = SHM_BASE_BYTES
    for m in manifest.models:
        for p in m.pipelines:
            for s in p.stages:
                if vgpu in s.vgpus:
                    per_request = sum(t.bytes_per_request() for t in (*s.inputs, *s.outputs))
                    need += IN_FLIGHT * p.batch * per_request
    return -(-need // MIB) * MIB


def vgpu_engines(manifest: Manifest, vgpu: str) -> set[str]:
    """The engines of the stages a vGPU serves (empty for emulated and CPU hosts)."""
    return {s.engine for m in manifest.models for p in m.pipelines for s in p.stages if vgpu in s.vgpus and s.engine}


def startup_s(manifest: Manifest, vgpu: str) -> int:
    """Seconds a vGPU's server may take to become live: longer where a TensorRT engine may be built first."""
    return FIRST_BUILD_S if vgpu_engines(manifest, vgpu) & set(BUILDS_TENSORRT) else STARTUP_S


def startup_probe(seconds: int, port: str = "http") -> dict[str, Any]:
    return {"httpGet": {"path": "/v2/health/live", "port": port}, "periodSeconds": STARTUP_PERIOD_S,
            "failureThreshold": -(-seconds // STARTUP_PERIOD_S)}


def shm_volume(size: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the pod's volume, the container's mount) of a memory-backed /dev/shm of ``size`` bytes."""
    return ({"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{size // MIB}Mi"}},
            {"name": "dshm", "mountPath": "/dev/shm"})


def check_device_plugin_share(g: VGpuInfo) -> None:
    """Refuse a GPU vGPU the device plugin cannot give: a MIG instance, or an MPS share other than 100/V."""
    if g.kind != "KIND_GPU":
        return
    if "POOLPIPE_MIG_GPU" in g.env:
        raise InputError(f"vGPU {g.id} is a {g.env['POOLPIPE_MIG_PROFILE']} MIG instance, which generate --k8s does "
                         "not map to the device plugin's MIG resources; plan this GPU type without cluster.vgpu_sizes "
                         "for Kubernetes, or run its host with poolpipe launch")
    share = g.env.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", str(100 // g.v))
    if share != str(100 // g.v):
        raise InputError(f"vGPU {g.id} is a {share} % MPS share of an unequally split {g.gpu_type}, but the NVIDIA "
                         "device plugin splits a GPU into equal replicas only; plan equal vGPU levels for Kubernetes "
                         "(no cluster.vgpu_sizes), or run its host with poolpipe launch")
