"""Triton's dynamic-batcher controls for planned models (priority levels, queue policy) in the scheduler core, run by
the simulator: the order of service, REJECT at max_queue_size, and REJECT / DELAY when a queue timeout expires."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from poolpipe_common.batcher import QUEUE_FULL, QUEUE_TIMEOUT, BatcherControls, QueuePolicy
from poolpipe_common.errors import InputError
from scheduler.core import make_scheduler
from scheduler.sim.engine import simulate
from tests.conftest import run_cli
from tests.test_driver import two_stage_topology

SLO = 2_000_000.0  # long enough that nothing is shed for its deadline: only the queue policy acts


def topology(controls: BatcherControls):
    topo = two_stage_topology(pool=1)
    return replace(topo, slo_us={"m": SLO}, batcher={"m": controls})


def run(controls: BatcherControls, arrivals: list[tuple[float, str]], priorities: list[int] | None = None,
        policy: str = "fifs"):
    topo = topology(controls)
    return simulate(topo, make_scheduler(policy, topo), arrivals, 1e6, priorities=priorities)


TWO_LEVELS = BatcherControls(priority_levels=2, default_priority_level=2)


@pytest.mark.parametrize("policy", ["fifs", "ppipe", "elsa"])
def test_higher_priority_is_served_first(policy):
    # 16 requests at priority 2 arrive first, 8 at priority 1 a moment later (fifs: while the first batch runs;
    # ppipe and elsa dispatch ahead, so there the high ones arrive in the same instant, after the low ones)
    t_high = 1000.0 if policy == "fifs" else 0.0
    arrivals = [(0.0, "m")] * 16 + [(t_high, "m")] * 8
    prio = [2] * 16 + [1] * 8
    res = run(TWO_LEVELS, arrivals, prio, policy)
    assert sum(s.finished for s in res.models.values()) == 24
    high = [res.finish_us[i] for i in range(16, 24)]
    low = sorted(res.finish_us[i] for i in range(16))
    first_batch = 8 if policy == "fifs" else 0  # dispatched before the high ones arrived
    assert max(high) < low[first_batch], (high, low)
    # without levels, the same arrivals are served in arrival order
    fifo = run(BatcherControls(), arrivals, prio, policy)
    assert max(fifo.finish_us[i] for i in range(16, 24)) > max(fifo.finish_us[i] for i in range(16))


@pytest.mark.parametrize("policy", ["fifs", "ppipe"])
def test_max_queue_size_rejects_what_does_not_fit(policy):
    controls = BatcherControls(default_queue_policy=QueuePolicy(max_queue_size=8))
    res = run(controls, [(0.0, "m")] * 20, policy=policy)
    assert res.drop_reasons == {QUEUE_FULL: 12}
    assert res.models["m"].finished == 8
    # per level: level 1 holds 8 more of its own
    per_level = BatcherControls(2, 2, QueuePolicy(max_queue_size=4), {1: QueuePolicy(max_queue_size=8)})
    res = run(per_level, [(0.0, "m")] * 20, [1] * 10 + [2] * 10, policy)
    assert res.drop_reasons == {QUEUE_FULL: 8} and res.models["m"].finished == 12


def burst_then_more() -> list[tuple[float, str]]:
    # 24 at once: 8 run at once (16 ms on stage 0), 16 wait past the 10 ms queue timeout; 8 more arrive at 12 ms
    return [(0.0, "m")] * 24 + [(12_000.0, "m")] * 8


def test_timeout_reject_answers_with_tritons_error():
    controls = BatcherControls(default_queue_policy=QueuePolicy("REJECT", 10_000))
    res = run(controls, burst_then_more())
    assert res.drop_reasons == {QUEUE_TIMEOUT: 16}
    assert res.models["m"].finished == 16


def test_timeout_delay_serves_the_delayed_after_the_unexpired():
    controls = BatcherControls(default_queue_policy=QueuePolicy("DELAY", 10_000))
    res = run(controls, burst_then_more())
    assert not res.drop_reasons and res.models["m"].finished == 32
    delayed = [res.finish_us[i] for i in range(8, 24)]
    newer = [res.finish_us[i] for i in range(24, 32)]
    assert max(newer) < min(delayed), (newer, delayed)


def test_controls_are_checked_with_tritons_rules():
    assert BatcherControls(2, 2).level(0) == 2 and BatcherControls(2, 2).level(7) == 2
    assert BatcherControls(2, 2).level(1) == 1 and BatcherControls().level(1) == 0
    p = QueuePolicy("REJECT", 5000, allow_timeout_override=True)
    assert p.timeout_us(1000) == 1000 and p.timeout_us(9000) == 5000 and p.timeout_us(0) == 5000
    assert QueuePolicy("REJECT", 0, allow_timeout_override=True).timeout_us(1000) == 0  # as Triton: only shorter
    assert QueuePolicy("REJECT", 5000).timeout_us(1000) == 5000
    with pytest.raises(InputError, match=r"default_priority_level must be in range \[1, 2\]"):
        BatcherControls(2, 0)
    with pytest.raises(InputError, match="priority level 3 must be in range"):
        BatcherControls(2, 1, priority_queue_policy={3: QueuePolicy()})
    with pytest.raises(InputError, match="timeout_action: 'DROP' is not REJECT or DELAY"):
        BatcherControls.from_dict({"default_queue_policy": {"timeout_action": "DROP"}})
    with pytest.raises(InputError, match="unknown field 'max_queue_sise'.*did you mean 'max_queue_size'"):
        BatcherControls.from_dict({"default_queue_policy": {"max_queue_sise": 3}})
    d = {"priority_levels": 2, "default_priority_level": 1,
         "default_queue_policy": {"timeout_action": "DELAY", "default_timeout_microseconds": 100,
                                  "allow_timeout_override": True, "max_queue_size": 4},
         "priority_queue_policy": {"2": {"timeout_action": "REJECT", "default_timeout_microseconds": 0,
                                         "allow_timeout_override": False, "max_queue_size": 0}}}
    assert BatcherControls.from_dict(d).to_dict() == d


def test_policies_that_keep_their_own_order_refuse_controls():
    with pytest.raises(ValueError, match="policy 'orloj' does not honour"):
        make_scheduler("orloj", topology(TWO_LEVELS))
    make_scheduler("orloj", topology(BatcherControls()))  # the defaults change nothing


def test_simulate_cli_takes_controls_and_reports_attainment_per_priority(tmp_path):
    from tests.test_sched_sim import reference_plan

    reference_plan().save(tmp_path / "p.json")
    args = ("simulate", "--plan", tmp_path / "p.json", "--load-factors", "1.3", "--duration-s", "1", "--jobs", "1",
            "--dynamic-batching", "priority_levels: 2 default_priority_level: 2", "--priorities", "1=0.3,2=0.7",
            "--out", tmp_path / "r.json")
    r = run_cli(*args, "--policy", "fifs")
    assert r.returncode == 0, r.stderr
    point = json.loads((tmp_path / "r.json").read_text())["points"][0]
    by = point["by_priority"]
    assert by["1"]["offered"] + by["2"]["offered"] > 100
    assert by["1"]["slo_attainment"] > by["2"]["slo_attainment"] + 0.05  # overloaded: priority 1 is served first
    assert "SLO attainment by priority 1:" in r.stdout
    bad = run_cli(*args, "--policy", "orloj")
    assert bad.returncode == 2 and "policy 'orloj' does not honour" in bad.stderr
    bad = run_cli(*args[:-2], "--priorities", "1=x", "--out", tmp_path / "r.json")
    assert bad.returncode == 2 and "expected PRIORITY=SHARE" in bad.stderr


def test_dynamic_batching_flag_reads_a_config_pbtxt(tmp_path):
    from model_repository_gen.batcher_flags import controls_for, parse_dynamic_batching_args

    cfg = tmp_path / "config.pbtxt"
    cfg.write_text('name: "m"\nmax_batch_size: 8\ndynamic_batching { preferred_batch_size: [4] priority_levels: 3 '
                   'default_priority_level: 3 priority_queue_policy { key: 1 value { timeout_action: DELAY '
                   'default_timeout_microseconds: 500 } } }\n')
    given, notes = parse_dynamic_batching_args([f"m=@{cfg}", "priority_levels: 1 default_priority_level: 1"])
    assert given["m"].priority_levels == 3 and given["m"].policy(1) == QueuePolicy("DELAY", 500)
    assert notes and "preferred_batch_size ignored" in notes[0]
    assert controls_for(["m", "n"], given)["n"].priority_levels == 1  # the spec without MODEL= covers the rest
    with pytest.raises(InputError, match="no planned model 'x'"):
        controls_for(["m"], {"x": given["m"]})
    with pytest.raises(InputError, match="has no field named"):
        parse_dynamic_batching_args(["priority_level: 2"])
