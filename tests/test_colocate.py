"""Co-located planning (planner.colocation.colocate) on the reference profiles, its memory constraint, and the simulator
applying the same interference model."""

from __future__ import annotations

from dataclasses import replace

import pytest

from planner.colocation.colocate import plan_colocated
from planner.ppipe.pooled import InfeasibleError
from planner.ppipe.reference_plans import load_reference_plans, spec_from_reference
from planner.solvers.milp_solvers import SolverOptions
from plans.colocation_costs import check_gpu_memory, plan_slots, slot_slowdowns
from plans.plan_json import plan_from_dict
from plans.spec.planning_spec import ClusterSpec, PlanningSpec, spec_from_dict
from poolpipe_common.errors import InputError
from profiling.interference import InterferenceModel
from profiling.reference_memory import with_estimated_memory
from scheduler.sim.sweep import PointJob, run_point
from workloads.arrivals import TraceSpec

STRONG = InterferenceModel(0.02, 8.0, 0.0)  # strong enough that co-runners matter on one GPU
OPTS = SolverOptions("highs", 20.0, 1e-3)


@pytest.fixture(scope="module")
def spec() -> PlanningSpec:
    """googlenet-v3 and repvgg-b3 (reference profiles, estimated memory) sharing one L4 split up to V=4."""
    entry = next(e for e in load_reference_plans() if e["planner"] == "ppipe" and len(e["models"]) == 3
                 and e["cluster"]["gpu_name_arr"] == ["L4", "T4"] and e["models"][0]["model"] == "colorization-v2")
    ref = spec_from_reference(entry)
    models = tuple(replace(m, profile=replace(with_estimated_memory(m.profile),
                                              interference={t: STRONG for t in m.profile.timings}),
                           batch_wait_us_per_request=0.0) for m in ref.models[1:])
    return PlanningSpec(ClusterSpec({"L4": 1}, {"L4": 1}, 10.0, {"L4": 4}), models, 2, True, True)


@pytest.fixture(scope="module")
def plans(spec):
    return plan_colocated(spec, OPTS, aware=True), plan_colocated(spec, OPTS, aware=False)


def test_co_located_plan_shares_the_gpu_and_inflates_by_the_interference(plans):
    aware, blind = plans
    assert {g for m in aware.models for pl in m.pipelines for p in pl.partitions for g in p.placement} == {"L4-0"}
    assert all(m.throughput_rps > 0 for m in aware.models)  # both models on one GPU (dedicated: impossible)
    slow = slot_slowdowns(plan_slots(aware))
    assert max(slow) > 1.01  # the lighter model suffers next to the heavier one
    # every slot's real slowdown is within what the planner allowed for in its latency
    planned = [p.slowdown for m in aware.models for pl in m.pipelines for p in pl.partitions for _ in p.placement]
    assert all(s <= ps + 1e-9 for s, ps in zip(slow, planned))
    assert aware.colocation["interference_aware"] and not blind.colocation["interference_aware"]
    assert all(p.slowdown == 1.0 for m in blind.models for pl in m.pipelines for p in pl.partitions)
    # plan.json keeps the placement
    again = plan_from_dict(aware.to_dict())
    assert again.models[0].pipelines[0].partitions[0].placement == aware.models[0].pipelines[0].partitions[0].placement


def test_simulated_co_located_plan_meets_its_slo_only_when_planned_with_the_interference(plans):
    aware, blind = plans
    rates = {m.name: m.throughput_rps for m in aware.models}
    out = {}
    for name, plan in (("aware", aware), ("blind", blind)):
        s, _ = run_point(PointJob(plan, rates, "ppipe", TraceSpec("poisson"), 0.5, 20.0, 1))
        out[name] = s["models"]
    # planned with the interference: no request finishes late (the simulator applies the same model per batch)
    assert all(p["late"] == 0 for p in out["aware"].values())
    assert all(p["slo_attainment"] > 0.9 for p in out["aware"].values())
    # planned blind to it, the same load finishes requests after their deadline
    assert sum(p["late"] for p in out["blind"].values()) > 0


def test_memory_constraint_refuses_an_over_full_gpu(plans, spec):
    aware, _ = plans
    slots = plan_slots(aware)
    check_gpu_memory(slots, spec.cluster)  # fits 24 GB
    small = replace(spec.cluster, gpu_memory_gb={"L4": 1.0})
    with pytest.raises(InputError, match=r"GPU L4-0 is over-full: its vGPUs need .* GB .* but a L4 has 1 GB"):
        check_gpu_memory(slots, small)
    # the planner itself refuses partitions that do not fit a vGPU's share of the memory
    with pytest.raises(InfeasibleError, match="fits a vGPU's share of GPU memory"):
        plan_colocated(replace(spec, cluster=replace(spec.cluster, gpu_memory_gb={"L4": 0.5})), OPTS)


def test_colocation_needs_memory_and_interference_facts(spec):
    bare = replace(spec, models=tuple(replace(m, profile=replace(m.profile, interference={})) for m in spec.models))
    with pytest.raises(InputError, match="no interference model for L4.*--co-run"):
        plan_colocated(bare, OPTS)


def test_spec_fields_gpu_memory_and_colocate(tmp_path, ref_dir):
    from profiling.reference import import_ppipe_profile
    prof = tmp_path / "g.json"
    import_ppipe_profile(ref_dir, "googlenet-v3-pytorch").save(prof)
    d = {"cluster": {"gpus": {"V100": 2}, "bandwidth_gbps": 10, "gpu_memory_gb": {"V100": 32}}, "colocate": True,
         "models": [{"profile": str(prof), "slo_multiplier": 5}]}
    s = spec_from_dict(d)
    assert s.colocate and s.cluster.memory_bytes("V100") == 32e9 and s.cluster.memory_bytes("cpu") is None
    t4 = spec_from_dict({**d, "cluster": {"gpus": {"T4": 1}, "bandwidth_gbps": 10}})
    assert t4.cluster.memory_bytes("T4") == 16e9  # the documented default
    with pytest.raises(InputError, match="gpu_memory_gb.V100: must be > 0"):
        spec_from_dict({**d, "cluster": {**d["cluster"], "gpu_memory_gb": {"V100": 0}}})
    with pytest.raises(InputError, match="colocate must be true or false"):
        spec_from_dict({**d, "colocate": "yes"})


def test_plan_cli_colocate_flag(tmp_path, spec):
    import json

    from tests.conftest import run_cli
    paths = []
    for m in spec.models:
        p = tmp_path / f"{m.name}.json"
        m.profile.save(p)
        paths.append(p)
    doc = {"cluster": {"gpus": {"L4": 1}, "bandwidth_gbps": 10, "vgpu_levels": {"L4": 4}}, "max_partitions": 2,
           "models": [{"profile": str(p), "slo_us": m.slo_us, "weight": m.weight} for p, m in zip(paths, spec.models)]}
    (tmp_path / "spec.json").write_text(json.dumps(doc))
    out = tmp_path / "plan.json"
    r = run_cli("plan", "--spec", tmp_path / "spec.json", "--colocate", "--out", out)
    assert r.returncode == 0, r.stderr
    plan = json.loads(out.read_text())
    assert plan["planner"] == "ppipe-colocate" and plan["colocation"]["interference_aware"]
    assert all(p["placement"] == ["L4-0"] * p["num_vgpus"] for m in plan["models"] for pl in m["pipelines"]
               for p in pl["partitions"])
