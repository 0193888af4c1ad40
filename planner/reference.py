"""Importers for the PPipe reference data (data/ppipe): profiles, planning specs and reference plans.

The layout is described in data/ppipe/README.md: block-timing/MODEL-GPU-V.csv (10 blocks x batch
sizes 1..8/V, µs), boundary-bytes/MODEL.csv (9 boundaries, bytes at batch 1) and
reference-plans.json (the published Gurobi plans with the terms they were solved on).
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path
from typing import Any

import numpy as np

from planner.errors import InputError
from planner.plan import ModelPlan, PartitionPlan, PipelinePlan, Plan
from planner.profile import FORMAT, Block, DeviceTiming, Profile
from planner.spec import ClusterSpec, ModelSpec, PlanningSpec, check_spec

REPO_ROOT = Path(__file__).resolve().parent.parent
REFERENCE_DIR = REPO_ROOT / "data" / "ppipe"
_TIMING = re.compile(r"^(?P<model>.+)-(?P<gpu>[A-Za-z0-9]+)-(?P<v>\d+)\.csv$")


def _read_rows(path: Path) -> list[list[float]]:
    try:
        with path.open(newline="") as f:
            return [[float(x) for x in row] for row in csv.reader(f) if row]
    except OSError as e:
        raise InputError(f"cannot read {path}: {e.strerror or e}") from None
    except ValueError as e:
        raise InputError(f"{path}: not a numeric CSV ({e})") from None


def reference_models(ref_dir: str | Path = REFERENCE_DIR) -> list[str]:
    """Model names that have boundary sizes in the reference layout."""
    return sorted(p.stem for p in (Path(ref_dir) / "boundary-bytes").glob("*.csv"))


def import_ppipe_profile(ref_dir: str | Path, model: str) -> Profile:
    """Convert one model of the reference layout into a Profile named after the model."""
    ref = Path(ref_dir)
    bb_path = ref / "boundary-bytes" / f"{model}.csv"
    if not bb_path.is_file():
        known = ", ".join(reference_models(ref)) or "none"
        raise InputError(f"no boundary sizes for model {model!r} in {ref}/boundary-bytes (models: {known})")
    boundary = [int(r[0]) for r in _read_rows(bb_path)]
    timings: dict[str, dict[int, DeviceTiming]] = {}
    for f in sorted((ref / "block-timing").glob(f"{model}-*.csv")):
        m = _TIMING.match(f.name)
        if not m or m["model"] != model:
            continue  # another model whose name starts with this one
        rows = _read_rows(f)
        if len(rows) != len(boundary) + 1:
            raise InputError(f"{f}: {len(rows)} blocks, but {bb_path} has {len(boundary)} boundaries")
        width = {len(r) for r in rows}
        if len(width) != 1:
            raise InputError(f"{f}: rows have different numbers of batch sizes")
        n = width.pop()
        timings.setdefault(m["gpu"], {})[int(m["v"])] = DeviceTiming(tuple(range(1, n + 1)), np.array(rows))
    if not timings:
        raise InputError(f"no block timings for model {model!r} in {ref}/block-timing")
    blocks = tuple(Block(f"block{i}", boundary[i] if i < len(boundary) else None) for i in range(len(boundary) + 1))
    return Profile(model, blocks, timings, None, None,
                   {"source": "PPipe public artifact (data/ppipe)", "engine": "TensorRT TF32",
                    "method": "MPS split into V vGPUs, all V running at once", "format": FORMAT})


def load_reference_plans(path: str | Path = REFERENCE_DIR / "reference-plans.json") -> list[dict[str, Any]]:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise InputError(f"cannot read reference plans {path}: {e}") from None


def cluster_from_reference(entry: dict[str, Any]) -> ClusterSpec:
    c = entry["cluster"]
    names = c["gpu_name_arr"]
    return ClusterSpec(dict(zip(names, (int(x) for x in c["gpu_counts"]))),
                       dict(zip(names, (int(x) for x in c["num_gpu_per_server_arr"]))),
                       float(c["bw_gbps"]), dict(zip(names, (int(x) for x in c["num_mps_levels"]))))


def spec_from_reference(entry: dict[str, Any], profiles: dict[str, Profile] | None = None,
                        ref_dir: str | Path = REFERENCE_DIR) -> PlanningSpec:
    """The planning problem a reference entry was solved on (same counts, NICs, SLOs, weights)."""
    profiles = profiles or {}
    weights = entry.get("workload_weights") or [1.0] * len(entry["models"])
    models = []
    for m, w in zip(entry["models"], weights):
        prof = profiles.get(m["model"]) or import_ppipe_profile(ref_dir, m["model"])
        wait = m["batch_build_factor"] * 1e6 / m["est_throughput_rps"]
        models.append(ModelSpec(prof, float(m["slo_us"]), float(m["slo_margin_us"]), wait, float(w)))
    c = entry["cluster"]
    return check_spec(PlanningSpec(cluster_from_reference(entry), tuple(models), int(c["max_num_parts"]),
                                   bool(c["bs_same"])))


def plan_from_reference(entry: dict[str, Any], spec: PlanningSpec) -> Plan:
    """The published plan as a Plan (vGPU counts rounded from physical GPUs x V)."""
    models = []
    for m, ms in zip(entry["models"], spec.models):
        pipes = []
        for pl in m["pipelines"]:
            parts = []
            for p in pl["partitions"]:
                v = int(p["vgpu_fraction"].split("/")[1])
                n = max(1, round(p["physical_gpus"] * v))
                parts.append(PartitionPlan(tuple(p["blocks"]), p["gpu"], v, int(p["batch"]), n,
                                           float(p["latency_us"]), float(p["transfer_us"])))
            lat = sum(p.latency_us + p.transfer_us for p in parts)
            pipes.append(PipelinePlan(tuple(parts), float(pl["throughput_rps"]), lat))
        models.append(ModelPlan(m["model"], float(m["slo_us"]), float(m["throughput_rps"]), tuple(pipes),
                                ms.profile, ms.weight, ms.slo_margin_us, ms.batch_wait_us_per_request))
    return Plan(f"reference-{entry['planner']}", "gurobi", float("nan"), spec.cluster, tuple(models),
                spec.to_dict(), "reference")
