"""Harpagon's applications: its toy cases reproduced exactly, then application-level serving cost on our profiles
with the SLO split three ways (analytic, Harpagon's cost model:
planner.apps.harpagon_module / planner.apps.harpagon_split).

Toy cases (Harpagon §II, Table I and II): module M1 at 100 req/s within 0.4 s needs 5 machines with round-robin
dispatch and 4 with batch dispatch; M3 at 198 req/s within 1.0 s costs 6.3 / 5.9 / 5.3 / 5.0 machines with
S1 (round-robin, two configurations), S2 (batch-aware, two), S3 (batch-aware, any number) and S4 (S3 with dummy
requests); the latency-cost efficiency of M1's moves from batch 2 is 50.0 (to 4) and 18.2 (to 8). The script
exits 1 if any differs.

Applications on the PPipe reference profiles (whole models on L4 or T4 at MPS level 1 or 2; a vGPU costs its
share of the GPU's price, L4 0.8 and T4 0.35 per hour): each app's end-to-end SLO is a multiple of its longest
path's batch-1 latency on L4; its cost is the sum of its modules' Harpagon schedules under the uniform split
(SLO / modules on the longest path), Harpagon's latency-cost split and the optimal split (MILP).

    python -P benchmarks/beyond_ppipe_apps.py
"""

from __future__ import annotations

import sys
import time

from planner.apps.app_plan import app_graph
from planner.apps.harpagon_module import Config, latency_cost_efficiency, schedule_module
from planner.apps.harpagon_split import Split, split
from plans.spec.planning_spec import spec_from_dict
from poolpipe_common.errors import InputError
from profiling.reference import REFERENCE_DIR, import_ppipe_profile

M1 = (Config(2, 0.160), Config(4, 0.200), Config(8, 0.320))
M3 = (Config(2, 0.100), Config(8, 0.250), Config(32, 0.800))
PRICES = {"L4": 0.8, "T4": 0.35}
SLO_MULTIPLIERS = (2.0, 3.0, 4.0, 6.0, 8.0)
APPS = [  # name, app rate, modules (name, model), edges (from, to, fan-out)
    ("traffic", 150.0, [("det", "atss_r101_fpn_1x_coco"), ("cls", "googlenet-v3-pytorch")], [("det", "cls", 4.0)]),
    ("retail", 100.0, [("det", "fsaf_r101_fpn_1x_coco"), ("cls", "googlenet-v3-pytorch"), ("id", "repvgg-b3")],
     [("det", "cls", 3.0), ("det", "id", 2.0)]),
    ("street", 60.0, [("seg", "gcnet_r101-d8_4xb2-40k_cityscapes-512x1024"), ("det", "tf_efficientdet_d1"),
                      ("cls", "repvgg-b3")], [("seg", "det", 1.0), ("det", "cls", 5.0)]),
]


def toy_cases() -> list[tuple[str, float, float, str]]:
    """(case, ours, the paper's, our schedule)."""
    rr = schedule_module(100, 0.4, M1, "rr", multi=False, dummy=False)
    tc = schedule_module(100, 0.4, M1, "tc", multi=True, dummy=False)
    out = [("M1 100 req/s, SLO 0.4 s, round-robin (machines)", rr.machines, 5.0, rr.describe()),
           ("M1 100 req/s, SLO 0.4 s, batch dispatch (machines)", tc.machines, 4.0, tc.describe())]
    for name, args, paper in (("S1 round-robin, 2 configurations", ("rr", False, False), 6.3),
                              ("S2 batch-aware, 2 configurations", ("tc", False, False), 5.9),
                              ("S3 batch-aware, any configurations", ("tc", True, False), 5.3),
                              ("S4 S3 + dummy requests", ("tc", True, True), 5.0)):
        s = schedule_module(198, 1.0, M3, *args)
        out.append((f"M3 198 req/s, SLO 1.0 s, {name} (cost)", s.cost, paper, s.describe()))
    for b, paper in ((1, 50.0), (2, 18.2)):
        lc = latency_cost_efficiency(100, M1[0], M1[b])
        out.append((f"M1 LC from batch 2 to batch {M1[b].batch}", lc, paper, ""))
    return out


def app_spec(name: str, rate: float, modules: list, edges: list, multiplier: float):
    profiles = {m: import_ppipe_profile(REFERENCE_DIR, m) for _, m in modules}
    lat = {n: profiles[m].latency_us("L4", 1, 1) for n, m in modules}
    depth_lat = {modules[0][0]: lat[modules[0][0]]}
    for a, b, _ in edges:
        depth_lat[b] = max(depth_lat.get(b, 0.0), depth_lat[a] + lat[b])
    slo = multiplier * max(depth_lat.values())
    raw = {"cluster": {"gpus": {"L4": 8, "T4": 16}, "bandwidth_gbps": 10, "vgpu_levels": {"L4": 2, "T4": 2}},
           "models": [{"profile": p.to_dict(), "slo_us": slo} for p in profiles.values()],
           "applications": [{"name": name, "slo_us": slo, "rate_rps": rate,
                             "modules": [{"name": n, "model": m} for n, m in modules],
                             "edges": [{"from": a, "to": b, "fan_out": f} for a, b, f in edges]}]}
    return spec_from_dict(raw), slo


def main() -> int:
    print("Harpagon's toy cases (its Table I profiles), ours vs the paper's:")
    bad = 0
    for case, ours, paper, how in toy_cases():
        ok = round(ours, 1) == paper
        bad += not ok
        print(f"  {case:<62} {ours:6.2f}  paper {paper:5.1f}  {'ok' if ok else 'DIFFERS'}  {how}")
    print(f"  {'all reproduced exactly' if not bad else f'{bad} case(s) differ'}")
    print("\napplication cost (analytic, Harpagon's cost model; GPU-hours per hour at L4 0.8, T4 0.35) by SLO split:")
    print(f"  {'app':<8} {'SLO':>9} {'uniform':>8} {'harpagon':>9} {'optimal':>8}  {'harpagon/uniform':>16}  "
          f"{'optimal/harpagon':>16}  budgets (harpagon, ms)")
    saved, only_split = [], 0
    for name, rate, modules, edges in APPS:
        for k in SLO_MULTIPLIERS:
            spec, slo = app_spec(name, rate, modules, edges, k)
            g = app_graph(spec.applications[0], spec, PRICES)
            splits = {method: _split_or_none(g, method) for method in ("uniform", "harpagon", "optimal")}
            u, h, o = (None if s is None else s.cost for s in splits.values())
            split_h = splits["harpagon"]
            ratio = f"{h / u:.3f}" if u and h else "uniform infeasible" if h else "-"
            if u and h:
                saved.append(h / u)
            only_split += bool(h and not u)
            budgets = " ".join(f"{n}={b * 1e3:.0f}" for n, b in split_h.budgets.items()) if split_h else "-"
            print(f"  {name:<8} {slo / 1e3:7.1f}ms {_c(u):>8} {_c(h):>9} {_c(o):>8}  {ratio:>16}  "
                  f"{(f'{o / h:.3f}' if o and h else '-'):>16}  {budgets}")
    if saved:
        print(f"  harpagon split / uniform split, cost: mean {sum(saved) / len(saved):.3f}, best {min(saved):.3f} "
              f"over {len(saved)} cases where both are feasible; {only_split} case(s) only the harpagon and optimal "
              f"splits can serve at all")
    return 1 if bad else 0


def _split_or_none(g, method: str) -> Split | None:
    """The split, or None where it cannot meet the SLO."""
    try:
        return split(g, method)
    except InputError:
        return None


def _c(x: float | None) -> str:
    return "infeas." if x is None else f"{x:.3f}"


if __name__ == "__main__":
    t0 = time.perf_counter()
    rc = main()
    print(f"({time.perf_counter() - t0:.1f} s)")
    sys.exit(rc)
