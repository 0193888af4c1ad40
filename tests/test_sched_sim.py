"""scheduler/sim: workloads, conservation of requests under every policy, and `poolpipe simulate` end to end."""

from __future__ import annotations

import json

import numpy as np
import pytest

from planner.ppipe.reference_plans import (
    load_reference_plans,
    plan_from_reference,
    spec_from_reference,
)
from poolpipe_common.errors import InputError
from scheduler.core import make_scheduler
from scheduler.sim.bound import attainment_bound, fluid_attainment, model_bound_terms
from scheduler.sim.engine import simulate
from scheduler.sim.placement import topology_from_plan
from scheduler.sim.sweep import max_load_factor, parse_load_factors
from tests.conftest import run_cli
from workloads.arrivals import arrival_times, mixed_arrivals, parse_trace


def reference_plan(planner: str = "ppipe", cluster: tuple[str, str] = ("L4", "T4"), group: int = 0):
    entries = [e for e in load_reference_plans() if e["suite"] == "maf19" and e["planner"] == planner
               and tuple(e["cluster"]["gpu_name_arr"]) == cluster]
    e = entries[group]
    return plan_from_reference(e, spec_from_reference(e))


@pytest.fixture(scope="module")
def ppipe_plan():
    return reference_plan()


def test_placement_respects_counts_servers_and_plan(ppipe_plan):
    topo = topology_from_plan(ppipe_plan)
    per_type: dict[str, set[str]] = {}
    servers: dict[str, set[str]] = {}
    for v in topo.vgpus.values():
        gpu = v.id.split(":")[0]
        per_type.setdefault(v.gpu_type, set()).add(gpu)
        servers.setdefault(v.server, set()).add(gpu)
    assert len(per_type["L4"]) <= 25 and len(per_type["T4"]) <= 75
    assert all(len(g) <= 4 for s, g in servers.items() if s.startswith("L4"))
    assert all(len(g) <= 2 for s, g in servers.items() if s.startswith("T4"))
    for m in ppipe_plan.models:
        for pl, p in zip(m.pipelines, topo.pipelines[m.name]):
            assert [len(s.pool) for s in p.stages] == [x.num_vgpus for x in pl.partitions]
            assert [s.latency(pl.batch) for s in p.stages] == [x.latency_us for x in pl.partitions]
            assert p.stages[0].in_bytes_per_request == 0 and p.stages[1].in_bytes_per_request > 0


def test_workloads_rates_burstiness_and_determinism(tmp_path):
    p = arrival_times("poisson", 500.0, 20.0, seed=1)
    assert abs(len(p) / 20.0 - 500) < 30 and np.all(np.diff(p) >= 0) and p.max() < 20.0
    assert np.array_equal(p, arrival_times("poisson", 500.0, 20.0, seed=1))
    assert not np.array_equal(p, arrival_times("poisson", 500.0, 20.0, seed=2))
    b = arrival_times("bursty:4", 500.0, 200.0, seed=1)
    gaps = np.diff(b)
    assert 2.5 < gaps.std() / gaps.mean() < 5.5 and abs(len(b) / 200.0 - 500) < 150
    f19 = tmp_path / "maf19.csv"
    f19.write_text("HashOwner,HashApp,HashFunction,Trigger,1,2,3,4\n"
                   "o,a,f1,http,10,0,10,0\n" "o,a,f2,http,5,5,5,5\n" "o,a,f3,http,0,30,0,30\n")
    a = arrival_times(f"maf19:{f19}", 400.0, 4.0, seed=0, model_index=0, n_models=2)  # f1 + f3: 10,30,10,30
    counts = np.histogram(a, bins=[0, 1, 2, 3, 4])[0]
    assert abs(len(a) / 4.0 - 400) < 60 and counts[1] > 2 * counts[0] and counts[3] > 2 * counts[2]
    f21 = tmp_path / "maf21.csv"
    starts = np.sort(np.random.default_rng(0).uniform(0, 100, 900))
    f21.write_text("app,func,end_timestamp,duration\n" + "".join(
        f"a,f{i % 3},{t + 0.5:.3f},0.5\n" for i, t in enumerate(starts)))
    a21 = arrival_times(f"maf21:{f21}", 50.0, 5.0, model_index=1, n_models=3)
    assert abs(len(a21) / 5.0 - 50) < 15
    # maf21 is the paper's "bursty": start times folded modulo (n - 1) / rate, as its simulator does. A
    # timer firing 50 invocations at every minute for 1000 minutes, at 500 rps, folds into a 100 s
    # segment (99.998 s) where minutes land near only 5 offsets (0, 20, 40, 60, 80 s): 5 huge bursts
    # (stretching the trace instead would give a burst every 0.1 s).
    timer = tmp_path / "timer.csv"
    timer.write_text("app,func,end_timestamp,duration\n" + "".join(
        f"a,t,{60 * k + 0.001 * j + 1:.3f},1\n" for k in range(1000) for j in range(50)))
    folded = arrival_times(f"maf21:{timer}", 500.0, 100.0)
    per_second = np.histogram(folded, bins=np.arange(0, 101))[0]
    near = sum(per_second[o:o + 2].sum() for o in (0, 20, 40, 60, 80))
    assert abs(len(folded) / 100.0 - 500) < 25 and near >= 0.99 * len(folded)
    assert np.count_nonzero(per_second) <= 12
    with pytest.raises(InputError, match="--trace"):
        parse_trace("zipf")
    with pytest.raises(InputError, match="no such file"):
        parse_trace("maf21:/nonexistent.csv")


@pytest.mark.parametrize("policy", ["ppipe", "reactive", "fifs", "elsa"])
def test_every_request_ends_exactly_once(ppipe_plan, policy):
    topo = topology_from_plan(ppipe_plan)
    rates = {m.name: 1.3 * m.throughput_rps for m in ppipe_plan.models}  # overloaded: drops happen
    arrivals = mixed_arrivals("bursty:4", rates, 1.5, seed=3)
    res = simulate(topo, make_scheduler(policy, topo), arrivals, 1.5e6, noise_cv=0.1, seed=3)
    assert len(res.outcomes) == len(arrivals) and res.unfinished == 0
    assert sorted(res.outcomes) == list(range(len(arrivals)))
    total = {k: sum(getattr(s, k) for s in res.models.values()) for k in ("offered", "met", "late", "dropped")}
    assert total["met"] + total["late"] + total["dropped"] == total["offered"] == len(arrivals)
    assert total["met"] > 0 and res.dispatches > 0


def test_fluid_bound_is_exact_on_a_burst_and_never_beaten_by_a_policy(ppipe_plan):
    # 1 request per ms of capacity, 5 ms to finish: of 10 simultaneous requests only 5 can make it;
    # 5 ms later the server is empty again and a lone request fits.
    assert fluid_attainment([0.0] * 10 + [10_000.0], 1000.0, 5000.0) == pytest.approx(6 / 11)
    assert fluid_attainment([i * 1000.0 for i in range(50)], 1000.0, 1000.0) == 1.0
    topo = topology_from_plan(ppipe_plan)
    for m in topo.pipelines:
        cap, window = model_bound_terms(topo, m)
        assert cap >= next(x.throughput_rps for x in ppipe_plan.models if x.name == m) * 0.999
        assert 0 < window < topo.slo_us[m]
    rates = {m.name: 0.5 * m.throughput_rps for m in ppipe_plan.models}
    arrivals = mixed_arrivals("bursty:4", rates, 2.0, seed=5)
    bound = attainment_bound(topo, arrivals)
    res = simulate(topo, make_scheduler("ppipe", topo), arrivals, 2e6, seed=5)
    assert all(res.models[m].attainment <= bound[m] + 1e-9 for m in bound)
    assert min(bound.values()) < 1.0  # CV 4 bursts overflow even the relaxation


def test_ppipe_meets_every_deadline_at_low_load_without_noise(ppipe_plan):
    topo = topology_from_plan(ppipe_plan)
    rates = {m.name: 0.3 * m.throughput_rps for m in ppipe_plan.models}
    res = simulate(topo, make_scheduler("ppipe", topo), mixed_arrivals("poisson", rates, 2.0, 0), 2e6)
    assert all(s.met == s.offered for s in res.models.values())  # reservations are exact without noise
    assert 0 < res.utilization["T4"] < res.utilization["L4"] < 1


def test_load_factor_parsing_and_max():
    assert parse_load_factors("0.05:0.2:0.05") == [0.05, 0.1, 0.15, 0.2]
    assert parse_load_factors("1,0.5") == [0.5, 1.0]
    with pytest.raises(InputError, match="--load-factors"):
        parse_load_factors("1:0.5:0.1")
    pts = [{"load_factor": x, "slo_attainment": a} for x, a in [(0.5, 1.0), (0.6, 0.995), (0.7, 0.98), (0.8, 0.999)]]
    assert max_load_factor(pts) == 0.6


def test_simulate_cli_end_to_end(tmp_path, ppipe_plan):
    ppipe_plan.save(tmp_path / "ppipe.json")
    reference_plan("np").save(tmp_path / "np.json")
    r = run_cli("simulate", "--plan", tmp_path / "np.json", "--reference-plan", tmp_path / "ppipe.json",
                "--load-factors", "0.3,0.9", "--duration-s", "2", "--trace", "poisson", "--jobs", "1",
                "--out", tmp_path / "r.json", "--plot", tmp_path / "plots", timeout=300)
    assert r.returncode == 0, r.stderr
    res = json.loads((tmp_path / "r.json").read_text())
    assert res["policy"] == "ppipe" and res["dispatch_us_p50"] > 0 and res["probes_per_dispatch"] >= 1
    assert [m["name"] for m in res["models"]] == [m.name for m in ppipe_plan.models]
    expected = []
    for m in res["models"]:
        assert [p["load_factor"] for p in m["points"]] == [0.3, 0.9]
        p = m["points"][0]
        assert p["slo_attainment"] >= 0.99 and p["p50_latency_us"] < p["p99_latency_us"]
        assert set(p["utilization"]) == {"L4", "T4"} and p["utilization"]["T4"] == 0.0  # np uses no T4
        assert abs(p["offered_rps"] - 0.3 * ppipe_plan.model(m["name"]).throughput_rps) < 0.3 * p["offered_rps"]
        # 0.3 met 99% (asserted above), so the answer is 0.9 exactly when 0.9 met it too
        expected.append(0.9 if m["points"][1]["slo_attainment"] >= 0.99 else 0.3)
        assert m["max_load_factor"] == expected[-1]
    assert res["max_load_factor"] == pytest.approx(sum(expected) / len(expected))
    for png in ("attainment.png", "gantt.png"):
        assert (tmp_path / "plots" / png).read_bytes()[:4] == b"\x89PNG"


def test_simulate_with_live_overheads_uses_the_live_driver(tmp_path, ppipe_plan):
    """--overheads (as the sidecar writes them) makes the simulation run the sidecar's driver with its costs: every
    request takes at least a response tail longer than on the ideal executor, the vGPUs are busy by the slowdown
    longer, nothing finishes late (the margin sheds instead), and the result says what it ran."""
    ppipe_plan.save(tmp_path / "p.json")
    (tmp_path / "ov.json").write_text(json.dumps({"format": "poolpipe.overheads/1", "lead_us": 2000,
                                                 "tail_us": 1500, "wake_late_us": 300, "slowdown": 1.1}))
    runs = {}
    for name, extra in (("ideal", ()), ("live", ("--overheads", tmp_path / "ov.json"))):
        r = run_cli("simulate", "--plan", tmp_path / "p.json", "--load-factors", "0.5", "--duration-s", "1",
                    "--jobs", "1", *extra, "--out", tmp_path / f"{name}.json")
        assert r.returncode == 0, r.stderr
        runs[name] = json.loads((tmp_path / f"{name}.json").read_text())
    res, ideal = runs["live"], runs["ideal"]
    assert res["driver"] == "live" and res["overheads"]["tail_us"] == 1500 and ideal["driver"] == "ideal"
    for m, base in zip(res["models"], ideal["models"], strict=True):
        pt, bpt = m["points"][0], base["points"][0]
        assert pt["late"] == 0 and pt["p50_latency_us"] >= bpt["p50_latency_us"] + 1500, (pt, bpt)
        for gpu, busy in bpt["utilization"].items():
            assert 1.05 <= pt["utilization"][gpu] / busy <= 1.15, (gpu, pt["utilization"], bpt["utilization"])
    (tmp_path / "bad.json").write_text(json.dumps({"lead_us": -1}))
    r = run_cli("simulate", "--plan", tmp_path / "p.json", "--overheads", tmp_path / "bad.json",
                "--out", tmp_path / "r.json")
    assert r.returncode == 2 and "lead_us must be >= 0" in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("args, field", [
    (["--plan", "/nonexistent/plan.json"], "cannot read plan"),
    (["--trace", "zipf"], "--trace"),
    (["--load-factors", "a:b"], "--load-factors"),
    (["--duration-s", "0"], "--duration-s"),
])
def test_simulate_cli_bad_input_is_one_line_exit_2(tmp_path, ppipe_plan, args, field):
    ppipe_plan.save(tmp_path / "p.json")
    base = {"--plan": str(tmp_path / "p.json"), "--out": str(tmp_path / "r.json")}
    for k, v in zip(args[::2], args[1::2]):
        base[k] = v
    r = run_cli("simulate", *[x for kv in base.items() for x in kv])
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and field in lines[0] and "Traceback" not in r.stderr
