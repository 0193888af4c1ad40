"""``make gpu-check`` (``python tests/gpu/run.py``, standard library only): the GPU smoke (tests/gpu, pytest
marker ``gpu``) where an NVIDIA GPU is present; elsewhere one line saying there is none, and exit 0.

A GPU is present where the driver shows one: a /dev/nvidia<N> device or an ``nvidia-smi -L`` that lists one. Where
one is present and the checks cannot reach it (no NVML, no CUDA in ONNX Runtime), they fail: that is what they
are for. The whole run is bounded by ``POOLPIPE_GPU_CHECK_TIMEOUT_S`` (default 600 s).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def gpu_present() -> str | None:
    """What shows a GPU here (a device file or nvidia-smi's first line), or None."""
    devices = sorted(p.name for p in Path("/dev").glob("nvidia[0-9]*"))
    if devices:
        return f"/dev/{devices[0]}"
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        lines = [x for x in out.stdout.splitlines() if x.startswith("GPU ")]
        return lines[0] if out.returncode == 0 and lines else None
    return None


def main(argv: list[str]) -> int:
    """``--probe``: exit 0 after the one line where no GPU is present, 3 where one is (the Makefile then builds the
    GPU environment and runs this again without it)."""
    found = gpu_present()
    if found is None:
        print("gpu-check: no NVIDIA GPU on this machine (no /dev/nvidia* device, no GPU in nvidia-smi -L); "
              "nothing to check")
        return 0
    if "--probe" in argv:
        return 3
    print(f"gpu-check: {found}; running tests/gpu (pytest -m gpu)", flush=True)
    timeout = float(os.environ.get("POOLPIPE_GPU_CHECK_TIMEOUT_S", "600"))
    env = {**os.environ, "POOLPIPE_GPU_CHECK": "1"}
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-p", "no:cacheprovider", "-x", "-s", "-q", "--durations=0",
           str(ROOT / "tests" / "gpu")]
    try:
        return subprocess.run(cmd, cwd=ROOT, env=env, timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        print(f"gpu-check: FAILED, not done within {timeout:.0f} s", flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
