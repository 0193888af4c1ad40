"""The planned sidecar's test bed shared by tests/test_sidecar_planned.py and tests/test_sidecar_planned_faults.py:
a zoo model generated from a plan onto five tritonservers of two host classes on loopback, the sidecar in front
(with its batch log), and onnxruntime on the whole model for reference answers."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from runtime.launch import Deployment
from runtime.sidecar_process import SidecarProcess
from runtime.testbed import build_deployment
from scheduler.server.planned.shm_pool import PREFIX

MODEL = "resnet"
# Generous: other test suites share the 2 cores; sheds are provoked explicitly (timeout parameter, bursts).
SLO_US = 500_000.0


def planned_testbed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """A module fixture's body: yields the deployment, its servers, the sidecar, the reference session, the
    manifest and the work directory; on the way out the sidecar stops cleanly and leaves no shm region."""
    work = tmp_path_factory.mktemp("planned")
    deploy, onnx_path, manifest = build_deployment(work, name=MODEL, slo_us=SLO_US)
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    with serving(deploy, work, ("--batch-log", str(work / "batches.jsonl"))) as (dep, sc):
        yield {"deploy": deploy, "dep": dep, "sc": sc, "ort": session, "manifest": manifest, "work": work}


@contextmanager
def serving(deploy: Path, work: Path, extra_args: tuple[str, ...] = ()) -> Iterator[tuple[Deployment, SidecarProcess]]:
    """A deployment's servers and a sidecar in front of them; on the way out the sidecar stops cleanly (exit 0)
    and leaves no shared-memory region."""
    with Deployment(deploy, check_hardware=False, log_dir=work / "logs") as dep:
        sc = SidecarProcess(manifest=deploy, log_path=work / "sidecar.log", extra_args=extra_args).start()
        try:
            yield dep, sc
        finally:
            pid = sc.proc.pid if sc.proc else None
            assert sc.stop() == 0
            if pid is not None:
                assert regions_of(pid) == []


def regions_of(pid: int) -> list[str]:
    """The sidecar ``pid``'s shared-memory regions still in /dev/shm."""
    return sorted(p.name for p in Path("/dev/shm").glob(f"{PREFIX}{pid}_*"))


def inputs(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 3, 112, 112)).astype(np.float32)


def reference(tb: dict, x: np.ndarray) -> np.ndarray:
    """The whole model's answer (onnxruntime)."""
    return tb["ort"].run(None, {"input": x})[0]


def metrics_text(sc: SidecarProcess) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{sc.metrics_port}/metrics", timeout=5) as r:
        return r.read().decode()


def metric(text: str, name: str, labels: str = "") -> float:
    """The sum of a Prometheus metric's samples whose labels contain ``labels``."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and (not labels or labels in line):
            total += float(line.rsplit(" ", 1)[1])
    return total
