"""The GPU smoke runs only under ``make gpu-check`` (tests/gpu/run.py sets POOLPIPE_GPU_CHECK=1 where a GPU is
present): selected any other way (``pytest -m gpu`` on a CPU machine), its tests are skipped, never failed; under
``make gpu-check`` nothing is skipped."""

from __future__ import annotations

import os

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("POOLPIPE_GPU_CHECK") == "1":
        return
    skip = pytest.mark.skip(reason="the GPU smoke runs under make gpu-check")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
