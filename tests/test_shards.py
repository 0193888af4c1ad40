"""Sidecar shards: the split of every pool into N shares of whole physical GPUs (property test), and the
sharded topology the simulator and the sidecar serve."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core.shards import model_throughput, shard_topology, shard_units, split_vgpus
from scheduler.core.topology import Pipeline, Stage, Topology, VGpu
from tests.conftest import run_cli

stage_st = st.tuples(st.sampled_from("AB"), st.integers(1, 4), st.integers(1, 9))  # GPU type, level, pool size
pipeline_st = st.tuples(st.lists(stage_st, min_size=1, max_size=3), st.floats(1.0, 1000.0))


def build(pipes: list[tuple[list[tuple[str, int, int]], float]]) -> Topology:
    """Place pools on physical GPUs as generate and the simulator do: a GPU at level v holds v vGPUs, filled in
    plan order, so a GPU may carry vGPUs of two stages."""
    vgpus: dict[str, VGpu] = {}
    open_gpu: dict[tuple[str, int], tuple[int, int]] = {}
    count = {"A": 0, "B": 0}
    out = []
    for j, (stages, rps) in enumerate(pipes):
        built = []
        for t, v, n in stages:
            pool = []
            for _ in range(n):
                gpu, slot = open_gpu.get((t, v), (-1, v))
                if slot >= v:
                    gpu, slot = count[t], 0
                    count[t] += 1
                open_gpu[(t, v)] = (gpu, slot + 1)
                vid = f"{t}{gpu}:{slot}"
                vgpus[vid] = VGpu(vid, t, v, f"srv-{t}{gpu}", f"{t}{gpu}")
                pool.append(vid)
            built.append(Stage((0, 1), tuple(pool), {1: 1000.0}, 0))
        out.append(Pipeline(f"m/{j}", "m", 1, tuple(built), rps))
    return Topology(vgpus, {"m": tuple(out)}, {"m": 1e6}, 10.0)


@settings(max_examples=150, deadline=None)
@given(st.lists(pipeline_st, min_size=1, max_size=3), st.integers(1, 4))
def test_split_covers_every_vgpu_once_in_whole_gpus_and_balances_each_pool(pipes, n):
    topo = build(pipes)
    shares = split_vgpus(topo, n)
    assert len(shares) == n
    assert sorted(v for s in shares for v in s) == sorted(topo.vgpus)  # every vGPU exactly once
    for s in shares:  # whole physical GPUs: a GPU's vGPUs all in one share
        assert not {topo.vgpus[v].gpu for v in s} & {topo.vgpus[v].gpu for o in shares if o is not s for v in o}
    members, units, totals = shard_units(topo, n)
    share_of_gpu = {topo.vgpus[v].gpu: i for i, s in enumerate(shares) for v in s}
    owner = {u: share_of_gpu[gs[0]] for u, gs in members.items()}
    assert all(share_of_gpu[g] == owner[u] for u, gs in members.items() for g in gs)  # a unit stays whole
    assert sorted(g for gs in members.values() for g in gs) == sorted({v.gpu for v in topo.vgpus.values()})
    for d, total in totals.items():
        loads = [sum(w[d] for u, w in units.items() if owner[u] == i and d in w) for i in range(n)]
        biggest = max(w[d] for w in units.values() if d in w)
        # balanced: no share further from its 1/N of the stage's planned throughput than one unit's worth (a
        # physical GPU, or the GPUs of a pipeline too small to split, which stay together)
        assert all(abs(x - total / n) <= biggest * (1 + 1e-9) + 1e-9 for x in loads), (d, loads, total, biggest)


def test_pipelines_too_small_to_split_even_out_over_the_shards():
    """Two one-GPU pipelines cannot be split: they go to different shards, and the large pipeline's
    pools lean the other way, so both shards serve about half (not one of them both small pipelines)."""
    topo = build([([("A", 1, 4), ("B", 2, 10)], 600.0), ([("A", 1, 1), ("B", 2, 2)], 120.0),
                  ([("A", 1, 1)], 60.0)])
    served = [model_throughput(shard_topology(topo, i, 2))["m"] for i in range(2)]
    # the best whole-GPU split: 120 + 0.4 x 600 (2 of 4 A, 2 of 5 B GPUs) and 60 + 0.5 x 600 (2 of 4, 3 of 5)
    assert served == pytest.approx([360.0, 360.0])


def test_two_shards_of_a_balanced_plan_each_serve_half():
    topo = build([([("A", 2, 4), ("B", 1, 2)], 400.0), ([("A", 1, 2)], 100.0)])
    halves = [shard_topology(topo, i, 2) for i in range(2)]
    assert [model_throughput(h)["m"] for h in halves] == [250.0, 250.0]
    assert set(halves[0].vgpus).isdisjoint(halves[1].vgpus)
    assert all(v in h.vgpus for h in halves for p in h.pipelines["m"] for s in p.stages for v in s.pool)


def test_simulate_shards_prints_what_sharding_costs(tmp_path):
    for args in (["profile", "import-ppipe", "--dir", "data/ppipe", "--model", "googlenet-v3-pytorch",
                  "--out", tmp_path / "g.json"],
                 ["plan", "--profile", tmp_path / "g.json", "--gpus", "T4=4,L4=2", "--slo-multiplier", "5",
                  "--out", tmp_path / "plan.json"]):
        assert run_cli(*args).returncode == 0
    r = run_cli("simulate", "--plan", tmp_path / "plan.json", "--load-factors", "0.5,0.8", "--duration-s", "2",
                "--jobs", "1", "--shards", "2", "--out", tmp_path / "result.json")
    assert r.returncode == 0, r.stderr
    result = json.loads((tmp_path / "result.json").read_text())
    sharded = result["shards"]["models"][0]
    assert len(sharded["per_shard"]) == 2 and sharded["max_load_factor"] == min(sharded["per_shard"])
    assert (f"2 shards sustain load factor {sharded['max_load_factor']:.2f}" in r.stdout
            and f"vs {result['models'][0]['max_load_factor']:.2f} with one sidecar" in r.stdout)
    r = run_cli("simulate", "--plan", tmp_path / "plan.json", "--shards", "20", "--out", tmp_path / "x.json")
    assert r.returncode == 2 and "use fewer than 20 shards" in r.stderr
