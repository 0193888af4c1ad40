"""Shared test helpers: the repository root, the reference data, running the real CLI and NVIDIA's perf_analyzer."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
REFERENCE_DIR = ROOT / "data" / "ppipe"
PERF_ANALYZER = Path(os.environ.get("PERF_ANALYZER", Path(sys.prefix) / "bin" / "perf_analyzer"))


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 600, env: dict | None = None
            ) -> subprocess.CompletedProcess:
    """Run ``python -m poolpipe ARGS`` as a user would, from this checkout."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run([sys.executable, "-m", "poolpipe", *map(str, args)], cwd=cwd or ROOT,
                          capture_output=True, text=True, timeout=timeout, env=full_env)


def run_perf_analyzer(url: str, model: str, protocol: str, *args: str) -> str:
    """perf_analyzer (installed by ``make perf-analyzer``) against ``url`` with its own defaults (5 s windows, 10 %
    stability, 10 trials), as a Triton team runs it first; its output, after asserting it succeeded."""
    if not PERF_ANALYZER.exists():
        pytest.fail(f"{PERF_ANALYZER} is missing: run 'make perf-analyzer' (or python "
                    "tests/tools/install_perf_analyzer.py --prefix VENV)")
    cmd = [str(PERF_ANALYZER), "-m", model, "-u", url, "-i", protocol, *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    return out.stdout


@pytest.fixture
def ref_dir() -> Path:
    return REFERENCE_DIR
