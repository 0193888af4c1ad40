"""The deadline's reserve for a request's way outside the sidecar's clock: calibrate chooses it by simulating the plan
with the way its clients measured (planner.sustained.front_reserve), plans keep it in their assumed costs, and
``serve`` keeps what its plan assumed unless told otherwise."""

from __future__ import annotations

import argparse
from dataclasses import replace

import numpy as np

from model_repository_gen.generate import generate
from model_repository_gen.manifest import load_manifest
from planner import PlanRequest
from planner import plan as plan_for
from planner.sustained.front_reserve import best_reserve, kept_reserve, reserve_candidates
from plans.plan_costs import front_reserve_us, with_assumed_costs
from poolpipe.paper_experiment import PaperRun, paper_spec
from poolpipe_common.net import free_ports
from poolpipe_common.overheads import DEFAULT_FRONT_US, DEFAULT_OVERHEADS, FRONT_QUANTILES, front_quantiles
from scheduler.server import serve_cli
from scheduler.server.workers import worker_command
from tests.deploy_helpers import write_cluster
from tests.test_emulated import SCALE, emulated_hosts, ppipe_plan


def _measured_front(median_us: float = 1500.0) -> tuple[float, ...]:
    """A way outside the sidecar's clock as loopback clients measured it: lognormal about ``median_us``, p99 ~2x."""
    draws = median_us * np.exp(0.3 * np.random.default_rng(0).standard_normal(20_000))
    return front_quantiles(draws.tolist(), FRONT_QUANTILES)


def test_without_a_measured_way_outside_there_is_no_reserve_to_choose() -> None:
    """The default costs' front_us is the way itself (no client measured it): nothing to trade."""
    assert best_reserve(ppipe_plan(), DEFAULT_OVERHEADS) is None


def test_the_candidates_are_the_measured_ways_quantiles_and_the_reserve_kept() -> None:
    costs = replace(DEFAULT_OVERHEADS, front_quantiles_us=_measured_front())
    cands = reserve_candidates(costs)
    assert DEFAULT_FRONT_US in cands and cands == tuple(sorted(cands))
    assert min(cands) < 1500 < max(cands) and all(c % 100 == 0 for c in cands)


def test_of_the_reserves_the_simulator_cannot_tell_apart_the_largest_is_kept() -> None:
    """Within MODEL_ERROR (3 %) of the most sustained, the largest reserve: it turns fewest answers late."""
    assert kept_reserve({1000.0: 200.0, 1500.0: 200.0, 2000.0: 190.0}) == 1500.0
    assert kept_reserve({1000.0: 210.0, 1500.0: 205.0}) == 1500.0
    assert kept_reserve({1000.0: 210.0, 1500.0: 200.0}) == 1000.0


def test_a_tight_slo_keeps_less_than_the_default_reserve_and_sustains_more() -> None:
    """googlenet-v3 at 2.5x (13 ms SLO) with a way outside of 1.5 ms median: 2 ms kept before every deadline sheds
    requests that would have made it; the reserve chosen sustains more than 2 ms did, simulated."""
    spec = paper_spec(PaperRun("googlenet-v3-pytorch", 2.5, 4, 12), slo_margin=0.0)
    plan = plan_for(spec, PlanRequest("ppipe", time_limit_s=60, arrivals="poisson")).plan
    costs = replace(DEFAULT_OVERHEADS, front_quantiles_us=_measured_front())
    choice = best_reserve(plan, costs)
    assert choice is not None and choice.reserve_us < DEFAULT_FRONT_US
    assert choice.reserve_us == kept_reserve(choice.sustained_rps)
    assert choice.sustained_rps[choice.reserve_us] > choice.sustained_rps[DEFAULT_FRONT_US]
    assert choice.to_dict()["chosen_us"] == choice.reserve_us


def _serve_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    serve_cli.register(parser.add_subparsers())
    grpc, http, metrics = free_ports(3)
    return parser.parse_args(["serve", "--grpc-port", str(grpc), "--http-port", str(http), "--metrics-port",
                              str(metrics), *argv])


def test_serve_keeps_the_reserve_its_plan_assumed_unless_told(tmp_path) -> None:
    plan = ppipe_plan()
    plan = replace(plan, sustained=with_assumed_costs(plan.sustained or {}, replace(DEFAULT_OVERHEADS,
                                                                                    front_us=1234.0)))
    assert front_reserve_us(plan) == 1234.0
    assert front_reserve_us(ppipe_plan()) == DEFAULT_FRONT_US  # a plan that records no costs: the default's
    cluster = write_cluster(tmp_path / "cluster.json", emulated_hosts())
    generate(plan, {}, cluster, tmp_path / "deploy", emulated_tensor_scale=SCALE)
    args = _serve_args("--manifest", str(tmp_path / "deploy"))
    assert serve_cli.config_from_args(args).front_us is None  # each plan's own: this one's, then a reload's
    assert "--front-us" not in worker_command(args, 0, (1, 2)), "each worker takes its plan's, as serve does"
    assert front_reserve_us(load_manifest(tmp_path / "deploy").plan) == 1234.0  # PlannedService.create reads it
    told = _serve_args("--manifest", str(tmp_path / "deploy"), "--front-us", "500")
    assert serve_cli.config_from_args(told).front_us == 500.0
    cmd = worker_command(told, 0, (1, 2))
    assert cmd[cmd.index("--front-us") + 1] == "500.0"
    bare = _serve_args("--passthrough", "127.0.0.1:1")  # pass-through only: no plan to take it from
    assert serve_cli.config_from_args(bare).front_us == DEFAULT_FRONT_US
