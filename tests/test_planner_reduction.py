"""The provable reductions (planner.ppipe.reduction, planner.ppipe.relaxed_dp) and the search on the objective
(planner.solvers.milp_passes): on small random problems they never lose the optimum of the full MILP."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from planner.ppipe import relaxed_dp
from planner.ppipe.column_milp import Objective, build_column_milp, column_start, relaxation_bound, throughput_tightener
from planner.ppipe.pooled import gpu_counts, model_candidates
from planner.ppipe.whole_gpu import whole_gpu_plan
from planner.solvers.milp_passes import aspiration_search
from planner.solvers.milp_solvers import SolverOptions, is_feasible, solve_milp
from plans.spec.planning_spec import spec_from_dict
from tests.test_planner_limits_cost import PROPS, shared_profiles, shared_spec


def two_model_spec(p1: dict, p2: dict, a: int, b: int, w2: float):
    p2 = {**p2, "model": "tiny2"}
    return spec_from_dict({"cluster": {"gpus": {"A": a, "B": b}, "bandwidth_gbps": 10, "vgpu_levels": {"A": 2, "B": 2}},
                           "max_partitions": 2, "models": [{"profile": p1, "slo_us": 20000},
                                                           {"profile": p2, "slo_us": 20000, "weight": w2}]})


def problem(spec):
    cands = model_candidates(spec, spec.cluster, spec.max_partitions)
    counts = gpu_counts(spec.cluster)
    objective = Objective("throughput", tuple(m.weight for m in spec.models))
    milp, layout = build_column_milp(cands, counts, objective)
    return cands, counts, objective, milp, layout


def optimum(milp) -> float:
    res = solve_milp(milp, rel_gap=0.0)
    assert res.status == "optimal"
    return res.objective


@PROPS
@given(p1=shared_profiles(), p2=shared_profiles(), a=st.integers(1, 3), b=st.integers(0, 4),
       two=st.booleans(), w2=st.sampled_from([0.5, 1.0, 3.0]), share=st.sampled_from([0.5, 0.9, 1.0]))
def test_reductions_keep_the_optimum(p1, p2, a, b, two, w2, share):
    """The MILP reduced for an incumbent at or below the optimum has the same optimum; the relaxed DP's
    bound lies between the optimum and the LP relaxation."""
    spec = two_model_spec(p1, p2, a, b, w2) if two else shared_spec(p1, a, b)
    try:
        cands, counts, objective, milp, layout = problem(spec)
    except Exception as e:  # a model with no candidate on this cluster
        assert "infeasible" in str(e)
        return
    best = optimum(milp)
    tighten = throughput_tightener(cands, counts, objective, layout)
    assert tighten is not None
    reduced, bound = tighten(milp, best * share)
    assert optimum(reduced) == pytest.approx(best, rel=1e-7, abs=1e-7)
    if bound is not None:
        assert best * (1 - 1e-7) <= bound <= relaxation_bound(cands, counts, objective) * (1 + 1e-7)
    reduced, _ = tighten(milp, best)  # at the optimum itself an optimal plan stays
    assert optimum(reduced) == pytest.approx(best, rel=1e-7, abs=1e-7)


@PROPS
@given(profile=shared_profiles(), a=st.integers(1, 3), b=st.integers(1, 4))
def test_aspiration_search_finds_the_optimum(profile, a, b):
    """From the whole-GPU DP's plan and the relaxed DP's bound, the search ends at the MILP's optimum."""
    cands, counts, objective, milp, layout = problem(shared_spec(profile, a, b))
    best = optimum(milp)
    start = column_start(cands, counts, objective, whole_gpu_plan(cands, counts, [1.0]))
    assert is_feasible(milp, start)
    tighten = throughput_tightener(cands, counts, objective, layout)
    _, bound = tighten(milp, float(milp.cost @ start))
    res = aspiration_search(milp, tighten, SolverOptions(rel_gap=0.0), start, bound)
    assert res.status == "optimal"
    assert res.objective == pytest.approx(best, rel=1e-6)
    assert is_feasible(milp, res.x)
    assert res.bound >= best * (1 - 1e-7)


def test_relaxed_dp_grid_coarsens_to_its_state_limit():
    """Levels 1..4 on 25 + 75 GPUs: exact units (12) on the smaller type, quarters on the larger."""
    profile = {"format": "poolpipe.profile/1", "model": "m", "blocks": [{"name": "b0", "output_bytes": 10}],
               "devices": {t: {str(v): {"batch_sizes": [1], "latency_us": [[1000 * v]]} for v in range(1, 5)}
                           for t in ("A", "B")}}
    spec = spec_from_dict({"cluster": {"gpus": {"A": 25, "B": 75}, "bandwidth_gbps": 10,
                                       "vgpu_levels": {"A": 4, "B": 4}},
                           "max_partitions": 1, "models": [{"profile": profile, "slo_us": 20000}]})
    cands = model_candidates(spec, spec.cluster, 1)
    g = relaxed_dp.grid(cands[0], np.array([25, 75]))
    assert list(g.units) == [12, 4]
    assert np.prod(g.shape) <= relaxed_dp.MAX_STATES
