"""Unequal vGPU sizes (cluster.vgpu_sizes: MPS splits, MIG rules), per-size timings, the MILP with splits,
PARIS sizing (knee batch, PDF ranges, instance counts), the simulator's placement and generate's environments."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from model_repository_gen.cluster_file import cluster_from_dict
from model_repository_gen.generate import generate
from model_repository_gen.k8s import K8sOptions, k8s_documents
from planner.planners import solve_spec
from planner.sizing.paris import (
    SizeCurve,
    batch_pdf_arg,
    batch_ranges,
    counts_for_rate,
    instance_seconds,
    knee_batch,
    paris_plan,
    single_size_plan,
)
from planner.sizing.size_profiles import sized_profile
from planner.solvers.milp_solvers import SolverOptions
from plans.plan_json import plan_from_dict
from plans.spec.planning_spec import spec_from_dict
from plans.spec.vgpu_sizes import MIG_PLACEMENTS, mig_layout, mig_patterns, parse_vgpu_sizes
from poolpipe_common.errors import InputError
from profiling.profile import Block, DeviceTiming, Profile
from profiling.zoo import build_zoo_model
from scheduler.sim.placement import topology_from_plan
from tests.deploy_helpers import make_profile


def toy_profile(devices: dict[str, dict[int, list[float]]], name: str = "toy") -> Profile:
    """Two blocks; each (device, V) gets whole-model latencies at batches 1, 2 split evenly over the blocks."""
    timings = {d: {v: DeviceTiming((1, 2), np.array([[x / 2 for x in lat]] * 2)) for v, lat in lv.items()}
               for d, lv in devices.items()}
    return Profile(name, (Block("b0", 1000), Block("b1", None)), timings)


# per GPU, two 50 % shares carry 2 x 2 / 4.4 ms = 909 req/s at batch 2; the whole GPU 2 / 3.6 ms = 556
TOY = toy_profile({"L4": {1: [2000.0, 3600.0], 2: [2400.0, 4400.0]}})


def spec_with(sizes, levels: int = 1, gpus: int = 2, profile: Profile = TOY, gpu: str = "L4"):
    cluster = {"gpus": {gpu: gpus}, "bandwidth_gbps": 100, "vgpu_levels": {gpu: levels}}
    if sizes is not None:
        cluster["vgpu_sizes"] = sizes
    return spec_from_dict({"cluster": cluster, "models": [{"profile": profile.to_dict(), "slo_us": 20000}]})


@pytest.mark.parametrize("sizes, message", [
    ({"T4": {"mps_percent": [50, 50]}}, "T4 is not in cluster.gpus"),
    ({"L4": {"mps_percent": [60, 50]}}, "adds up to 110"),
    ({"L4": {"mps_percent": [0, 50]}}, "whole number 1..100"),
    ({"L4": {"mig": ["1g", "2g"]}}, "MIG profiles are known for A100 and H100"),
    ({"L4": {"mps": [50]}}, "exactly one of mps_percent"),
    ({"L4": [50, 50]}, "exactly one of mps_percent"),
    ({"L4": {"mps_percent": []}}, "expected a list of MPS percentages"),
])
def test_spec_vgpu_sizes_errors_are_one_line(sizes, message):
    with pytest.raises(InputError, match=message) as e:
        spec_with(sizes)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("profiles, message", [(["5g"], "not a MIG profile"), (["1g", "1g.5gb"], "listed twice")])
def test_mig_profile_errors(profiles, message):
    with pytest.raises(InputError, match=message):
        parse_vgpu_sizes({"A100": {"mig": profiles}}, ["A100"])


def test_mig_geometries_follow_the_a100_slice_rules():
    pats = set(mig_patterns((1, 2, 3, 4, 7)))
    assert {(7,), (4, 3), (3, 3), (1,) * 7, (4, 2, 1), (2, 2, 2, 1), (3, 2, 1, 1)} <= pats
    assert mig_layout((4, 4)) is None and mig_layout((2, 2, 2, 2)) is None and mig_layout((7, 1)) is None
    assert (3, 2, 1) not in pats  # not maximal: a 1g still fits beside it
    assert mig_patterns((3,)) == [(3, 3)]
    splits = parse_vgpu_sizes({"H100": {"mig": ["3g.40gb", "4g.40gb"]}}, ["H100"])["H100"]
    assert set(splits.patterns) == {("4g.40gb", "3g.40gb"), ("3g.40gb", "3g.40gb")}
    assert [round(s.share, 4) for s in splits.sizes] == [round(3 / 7, 4), round(4 / 7, 4)]


@given(st.lists(st.sampled_from([1, 2, 3, 4, 7]), min_size=1, max_size=7))
def test_mig_layout_places_profiles_at_allowed_non_overlapping_slices(pattern):
    lay = mig_layout(tuple(pattern))
    if lay is None:
        return
    used = []
    for g, start in lay:
        span, allowed = MIG_PLACEMENTS[g]
        assert start in allowed
        used += range(start, start + span)
    assert len(used) == len(set(used)) and max(used) < 8 and sum(pattern) <= 7


def test_size_timings_measured_or_derived_from_mps_levels():
    prof = toy_profile({"A100": {1: [1000.0, 1800.0], 2: [1500.0, 2600.0], 3: [2100.0, 3600.0]},
                        "A100@4g": {1: [1234.0, 2000.0]}})
    sizes = parse_vgpu_sizes({"A100": {"mig": ["3g", "4g", "7g"]}}, ["A100"])
    sp = sized_profile(prof, sizes)
    notes = sp.provenance["vgpu_sizes"]
    assert notes["A100@4g"] == "measured" and sp.latency_us("A100@4g", 1, 1) == 1234.0
    assert notes["A100@7g"] == "derived: MPS level V=1 as is" and sp.latency_us("A100@7g", 1, 2) == 1800.0
    assert notes["A100@3g"] == "derived: interpolated between MPS levels V=2 and V=3"
    w = 7 / 3 - 2  # level 7/3 lies a third of the way from V=2 to V=3
    assert sp.latency_us("A100@3g", 1, 1) == pytest.approx(1500 + w * 600)


def test_milp_with_unequal_shares_beats_the_whole_gpu_and_round_trips(tmp_path):
    whole = solve_spec(spec_with(None), time_limit_s=30)
    plan = solve_spec(spec_with({"L4": {"mps_percent": [[50, 50], [100]]}}), time_limit_s=30)
    assert whole.objective == pytest.approx(2 * 2 / 3.6e-3, rel=1e-6)
    assert plan.objective == pytest.approx(2 * 2 * 2 / 4.4e-3, rel=1e-6)  # four 50 % vGPUs at batch 2
    assert plan.gpu_splits == {"L4": [{"vgpus": ["50%", "50%"], "gpus": 2}]}
    part = plan.models[0].pipelines[0].partitions[0]
    assert (part.gpu, part.size, part.share, part.physical_gpus) == ("L4", "50%", 0.5, part.num_vgpus * 0.5)
    d = json.loads(json.dumps(plan.to_dict()))
    assert d["models"][0]["pipelines"][0]["partitions"][0]["vgpu_size"] == "50%"
    again = plan_from_dict(d)
    assert again.gpu_splits == plan.gpu_splits and again.cluster.vgpu_sizes["L4"].patterns == (("50%", "50%"),
                                                                                               ("100%",))
    topo = topology_from_plan(again)
    assert len(topo.vgpus) == 4 and len({v.gpu for v in topo.vgpus.values()}) == 2


def test_without_vgpu_sizes_the_plan_is_unchanged():
    plan = solve_spec(spec_with(None, levels=2), time_limit_s=30)
    assert plan.gpu_splits is None and all(p.size is None for pl in plan.models[0].pipelines for p in pl.partitions)
    assert "vgpu_sizes" not in plan.to_dict()["cluster"]


def curve(label: str, share: float, lat: dict[int, float]) -> SizeCurve:
    return SizeCurve(label, share, lat)


def test_knee_batch_is_where_the_size_reaches_80_percent_of_its_peak():
    c = curve("x", 0.5, {1: 1000.0, 2: 1100.0, 4: 1400.0, 8: 2600.0})  # rates/ms 1, 1.8, 2.9, 3.1
    assert [round(c.utilisation(b), 2) for b in (1, 2, 4, 8)] == [0.32, 0.59, 0.93, 1.0]
    assert knee_batch(c) == 4 and knee_batch(c, 0.5) == 2


def test_pdf_ranges_map_batches_to_sizes_smallest_first():
    small = curve("25%", 0.25, {1: 1000.0, 2: 1900.0})  # knee 1
    mid = curve("50%", 0.5, {1: 800.0, 2: 900.0, 3: 1000.0, 4: 1600.0})  # knee 2
    big = curve("100%", 1.0, {b: 500.0 + 50 * b for b in range(1, 9)})
    pdf = {1: 0.4, 2: 0.3, 5: 0.2, 8: 0.1}
    assert batch_ranges([small, mid, big], pdf) == [(0, 1), (1, 3), (3, 8)]
    r = instance_seconds([small, mid, big], [(0, 1), (1, 3), (3, 8)], pdf)
    assert r == pytest.approx([0.4 * 1e-3, 0.3 * 0.9e-3, 0.2 * 0.75e-3 + 0.1 * 0.9e-3])
    with pytest.raises(InputError, match="batches up to 9"):
        batch_ranges([small, big], {9: 1.0})


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.integers(1, 8), st.floats(0.01, 1.0), min_size=1),
       st.floats(1.0, 5000.0))
def test_instance_counts_carry_the_required_rate(raw, batch_rate):
    small = curve("25%", 0.25, {1: 1000.0, 2: 1900.0})
    big = curve("100%", 1.0, {b: 500.0 + 50 * b for b in range(1, 9)})
    pdf = {b: p / sum(raw.values()) for b, p in raw.items()}
    ranges = batch_ranges([small, big], pdf)
    assert sorted(b for b in pdf for lo, hi in ranges if lo < b <= hi) == sorted(pdf)  # each batch exactly once
    counts = counts_for_rate(instance_seconds([small, big], ranges, pdf), batch_rate)
    for c, n, (lo, hi) in zip((small, big), counts, ranges):
        # instance-seconds per second its range needs: n instances, each busy at most all the time, cover it
        busy = sum(batch_rate * p / c.rate_bps(b) for b, p in pdf.items() if lo < b <= hi)
        assert busy - 1e-9 <= n < busy + 1 + 1e-9


def test_paris_plan_splits_gpus_and_the_simulator_runs_it():
    prof = toy_profile({"L4": {1: [2000.0, 2200.0], 2: [1500.0, 4000.0], 4: [2600.0, 9000.0]}})
    spec = spec_with({"L4": {"mps_percent": [[25, 25, 25, 25], [50, 50], [100]]}}, gpus=4, profile=prof)
    plan, sizing = paris_plan(spec, {1: 0.7, 2: 0.3}, SolverOptions("highs", 30.0), mix_only=True)
    assert sizing.knees[0] == 1 and sizing.ranges[-1][1] == 2
    assert sum(e["gpus"] for e in plan.gpu_splits["L4"]) <= 4
    assert all(n >= 0 for n in sizing.counts) and sizing.batch_rate > 0
    assert sum(sizing.counts) == sum(p.partitions[0].num_vgpus for p in plan.models[0].pipelines)
    topo = topology_from_plan(plan_from_dict(json.loads(json.dumps(plan.to_dict()))))
    assert len(topo.vgpus) == sum(sizing.counts)
    single = single_size_plan(spec, "25%")
    assert single.models[0].pipelines[0].partitions[0].num_vgpus == 16


def test_paris_plan_keeps_the_mix_only_where_it_carries_more():
    """Same PDF; where 25 % shares run batch 2 nearly as well as the whole GPU, 25 % alone carries more than
    PARIS's mix (its 25 % instances take batch 1 only), so the plan is 25 % alone and says why; where 25 % cannot
    run batch 2 within the SLO, the mix carries more than the whole GPU alone and is kept."""
    splits = {"L4": {"mps_percent": [[25, 25, 25, 25], [50, 50], [100]]}}
    pdf, opts = {1: 0.7, 2: 0.3}, SolverOptions("highs", 30.0)
    fast_small = spec_with(splits, gpus=4, profile=toy_profile({"L4": {1: [2000.0, 2200.0], 4: [2600.0, 9000.0]}}))
    plan, sizing = paris_plan(fast_small, pdf, opts)
    mix, mix_sizing = paris_plan(fast_small, pdf, opts, mix_only=True)
    assert sizing.fallback is not None and sizing.fallback[0] == "25%"
    assert sizing.fallback[1] > mix_sizing.batch_rate and mix_sizing.fallback is None
    assert {p.partitions[0].size for p in plan.models[0].pipelines} == {"25%"} and plan.planner == "paris"
    assert any("the plan uses 25% alone" in line for line in sizing.lines())
    slow_small = spec_with(splits, gpus=4, profile=toy_profile({"L4": {1: [2000.0, 2200.0], 4: [2600.0, 30000.0]}}))
    plan, sizing = paris_plan(slow_small, pdf, opts)
    assert sizing.fallback is None and len(plan.models[0].pipelines) == 2


def test_batch_pdf_from_flag_or_simulate_result(tmp_path):
    assert batch_pdf_arg("1=3,2=1") == {1: 0.75, 2: 0.25}
    f = tmp_path / "result.json"
    f.write_text(json.dumps({"max_load_factor": 0.5, "points": [{"load_factor": 0.5, "batch_sizes": {"1": 2, "4": 2}},
                                                                 {"load_factor": 1.0, "batch_sizes": {"8": 1}}]}))
    assert batch_pdf_arg(str(f)) == {1: 0.5, 4: 0.5}
    for bad in ("1=x", "0=1", "1=0"):
        with pytest.raises(InputError):
            batch_pdf_arg(bad)


def test_generate_sets_each_servers_mps_percentage_and_mig_device(tmp_path):
    onnx_path = build_zoo_model("resnet", tmp_path / "resnet.onnx")
    made = make_profile(onnx_path, "resnet", 3, {"L4": (1, 2, 4), "A100": (1, 2, 3)})
    # latency grows as sqrt(V) rather than V: shares get more per GPU, so the planner uses them
    prof = replace(made, timings={d: {v: replace(t, latency_us=t.latency_us / v ** 0.5) for v, t in lv.items()}
                                  for d, lv in made.timings.items()})
    for gpu, sizes, want in (
            ("L4", {"mps_percent": [25, 25, 50]}, {"25", "50"}),
            ("A100", {"mig": ["3g.20gb", "4g.20gb"]}, None)):
        spec = spec_from_dict({"cluster": {"gpus": {gpu: 1}, "bandwidth_gbps": 100, "vgpu_sizes": {gpu: sizes}},
                               "models": [{"profile": prof.to_dict(), "slo_us": 1e6}], "max_partitions": 1})
        plan = solve_spec(spec, time_limit_s=30)
        assert plan.gpu_splits and plan.physical_gpus_used()[gpu] <= 1 + 1e-9
        hosts = [{"name": "g", "address": "10.0.0.1", "gpu_type": gpu, "gpus": 1, "bandwidth_gbps": 10}]
        m = generate(plan, {"resnet": onnx_path}, cluster_from_dict({"hosts": hosts}), tmp_path / gpu)
        envs = [g.env for g in m.vgpus]
        if want:
            assert {e["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] for e in envs} == want and len(envs) == 3
            assert json.loads((tmp_path / gpu / "g" / "launch.json").read_text())["needs_mps"]
        else:
            assert {e["POOLPIPE_MIG_PROFILE"] for e in envs} == {"3g.20gb", "4g.20gb"}
            assert {(e["POOLPIPE_MIG_GPU"], e["POOLPIPE_MIG_START"]) for e in envs} == {("0", "0"), ("0", "4")}
            # no placeholder reaches tritonserver: launch resolves the UUID, launch.sh refuses without one
            assert all("CUDA_VISIBLE_DEVICES" not in e and e["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID" for e in envs)
            sh = (tmp_path / gpu / "g" / "launch.sh").read_text()
            assert "<MIG" not in sh and 'CUDA_VISIBLE_DEVICES="${POOLPIPE_MIG_UUID_G_GPU0_S' in sh
        assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" in (tmp_path / gpu / "g" / "launch.sh").read_text() or not want
        # Kubernetes: the device plugin gives equal MPS replicas only and none of our MIG placements: one line
        # at generate time (a 25/25/50 split asked for three whole GPUs and stayed Pending)
        with pytest.raises(InputError, match="MPS share of an unequally split L4" if want else "MIG instance"):
            k8s_documents(m, K8sOptions())
