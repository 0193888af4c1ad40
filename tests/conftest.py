"""Shared test helpers: the repository root, the reference data, and running the real CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
REFERENCE_DIR = ROOT / "data" / "ppipe"


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 600, env: dict | None = None
            ) -> subprocess.CompletedProcess:
    """Run ``python -m poolpipe ARGS`` as a user would, from this checkout."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run([sys.executable, "-m", "poolpipe", *map(str, args)], cwd=cwd or ROOT,
                          capture_output=True, text=True, timeout=timeout, env=full_env)


@pytest.fixture
def ref_dir() -> Path:
    return REFERENCE_DIR
