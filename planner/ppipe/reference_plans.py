"""The PPipe reference plans (data/ppipe/reference-plans.json): the planning problems they were solved on
and the published plans themselves, for tests and benchmarks that compare against them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from plans.plan_json import ModelPlan, PartitionPlan, PipelinePlan, Plan
from plans.spec.planning_spec import ClusterSpec, ModelSpec, PlanningSpec, check_spec
from poolpipe_common.errors import InputError
from profiling.profile import Profile
from profiling.reference import REFERENCE_DIR, import_ppipe_profile


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
