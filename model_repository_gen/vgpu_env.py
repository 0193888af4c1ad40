"""A vGPU's place and its tritonserver's environment: which device (and share of it) the server computes on.

Every GPU server names its device by index in NVML's order: ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` beside
``CUDA_VISIBLE_DEVICES=<index>``, since CUDA otherwise numbers the fastest GPU first and ``launch`` checks NVML's.
An MPS share's server gets ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``. A MIG instance has no index: its server gets
``POOLPIPE_MIG_GPU`` / ``POOLPIPE_MIG_PROFILE`` / ``POOLPIPE_MIG_START`` (the parent GPU, the profile and its first
memory slice), which ``poolpipe launch`` resolves to the instance's UUID through NVML before it starts the server
(runtime.mig), and ``launch.sh`` takes from ``POOLPIPE_MIG_UUID_<VGPU>``; never a placeholder.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Any

from model_repository_gen.cluster_file import ClusterHost
from plans.split_slots import SizedSlot

MIG_KEYS = ("POOLPIPE_MIG_GPU", "POOLPIPE_MIG_PROFILE", "POOLPIPE_MIG_START")
# The environment that decides which device (and share of it) a server computes on
DEVICE_ENV_KEYS = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
                   "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", *MIG_KEYS)


@dataclass(frozen=True)
class Slot:
    """One vGPU: slot ``slot`` of GPU ``gpu_index`` on ``host``, whose GPU is split into ``v``."""

    host: ClusterHost
    gpu_index: int
    slot: int
    v: int
    size: SizedSlot | None = None  # an unequal share (MPS percentage or MIG instance); None: 1/v
    mig: bool = False

    @property
    def id(self) -> str:
        return f"{self.host.name}-gpu{self.gpu_index}-s{self.slot}"


def vgpu_env(slot: Slot, threads: int) -> dict[str, str]:
    """The environment of a vGPU's tritonserver (module doc)."""
    if not slot.host.on_gpu:
        return {"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": str(max(threads, 1))}
    if slot.size is not None and slot.mig:
        return {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "POOLPIPE_MIG_GPU": str(slot.gpu_index),
                "POOLPIPE_MIG_PROFILE": slot.size.label, "POOLPIPE_MIG_START": str(slot.size.mig_start)}
    return {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": str(slot.gpu_index),
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(mps_percent(slot))}


def mps_percent(slot: Slot) -> int:
    """The MPS thread percentage of a vGPU: its share's, or 100/V (100 on a MIG instance of its own)."""
    if slot.size is not None:
        return 100 if slot.mig else slot.size.mps_percent
    return 100 // slot.v


def mig_uuid_variable(vgpu: str) -> str:
    """The variable launch.sh reads a MIG vGPU's instance UUID from."""
    return "POOLPIPE_MIG_UUID_" + re.sub(r"[^A-Za-z0-9]", "_", vgpu).upper()


def _env_words(s: dict[str, Any]) -> str:
    env = dict(s["env"])
    words = [f"{k}={shlex.quote(v)}" for k, v in env.items()]
    if "POOLPIPE_MIG_GPU" in env:
        var = mig_uuid_variable(s["vgpu"])
        where = f"GPU {env['POOLPIPE_MIG_GPU']}, memory slice {env['POOLPIPE_MIG_START']}"
        words.append(f'CUDA_VISIBLE_DEVICES="${{{var}:?set {var} to the UUID of the {env["POOLPIPE_MIG_PROFILE"]} '
                     f'MIG instance at {where} (nvidia-smi -L), or use poolpipe launch}}"')
    return " ".join(words)


def launch_sh(host: ClusterHost, servers: list[dict[str, Any]]) -> str:
    """launch.sh of a host: its tritonservers as a readable shell script."""
    lines = [
        "#!/usr/bin/env bash",
        f"# The tritonservers of host {host.name} ({host.gpus} x {host.gpu_type}, device {host.device}), "
        "written by 'poolpipe generate'.",
        "# 'poolpipe launch DIR --host NAME' does the same and also checks GPUs/MPS and waits for readiness.",
        "# Explicit model control: 'poolpipe launch' loads the next generation's partitions into a kept server.",
        "# TRITONSERVER / TRITON_BACKEND_DIR: the binary and its backends directory (with the python backend);",
        "# PYTHONPATH must name the site-packages with numpy and onnxruntime (the partition backend adds it).",
        "set -euo pipefail",
        'cd "$(dirname "$0")"',
        'TRITONSERVER="${TRITONSERVER:-/opt/tritonserver/bin/tritonserver}"',
        'TRITON_BACKEND_DIR="${TRITON_BACKEND_DIR:-/opt/tritonserver/backends}"',
        "pids=()",
        'trap \'kill "${pids[@]}" 2>/dev/null || true; wait\' INT TERM EXIT',
    ]
    for s in servers:
        lines += [
            f"# vGPU {s['vgpu']}: GPU {s['gpu_index']} slot {s['slot']} of {s['v']}, models {', '.join(s['models'])}",
            f'{_env_words(s)} "$TRITONSERVER" --model-repository={shlex.quote(s["repository"])} '
            f'--backend-directory="$TRITON_BACKEND_DIR" --http-address={shlex.quote(host.address)} '
            f"--http-port={s['http_port']} --grpc-address={shlex.quote(host.address)} --grpc-port={s['grpc_port']} "
            f"--metrics-address={shlex.quote(host.address)} --metrics-port={s['metrics_port']} "
            "--model-control-mode=explicit --load-model='*' &",
            "pids+=($!)",
        ]
    lines.append("wait")
    return "\n".join(lines) + "\n"
