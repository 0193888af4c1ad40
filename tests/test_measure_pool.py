"""Candidate plans measured in worker processes (planner.sustained.measure_pool): the same rates as measuring in
turn, from a script without a main guard too; errors reach the planner; no worker is left behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import psutil
import pytest

from planner import PlanRequest
from planner.sustained.measure_pool import measure_all
from plans.arrivals import parse_arrivals
from poolpipe_common.errors import InputError
from poolpipe_common.overheads import DEFAULT_OVERHEADS
from tests.conftest import ROOT
from tests.test_sustained import small_spec

# A user's script that plans at module level, with no ``if __name__ == "__main__"`` guard: a multiprocessing
# child would import it again and plan again; a worker of the pool must not.
UNGUARDED = textwrap.dedent("""
    import json, sys
    from planner import PlanRequest, plan
    from plans.arrivals import parse_arrivals
    from planner.sustained.measure_pool import measure_all
    from poolpipe_common.overheads import DEFAULT_OVERHEADS
    from tests.test_sustained import small_spec

    print("script started", file=sys.stderr, flush=True)
    ask = PlanRequest(objective="throughput", evaluator="none")
    plans = [plan(small_spec(l4, t4), ask).plan for l4, t4 in ((1, 1), (2, 3), (3, 6))]
    args = ("simulated", plans, parse_arrivals("poisson"), DEFAULT_OVERHEADS)
    ticks = []  # a progress bar's updates: one per plan measured
    print(json.dumps({"workers": measure_all(*args, 2, lambda: ticks.append(2)),
                      "in_turn": measure_all(*args, 1, lambda: ticks.append(1)), "ticks": ticks}))
""")


def test_a_script_without_a_main_guard_measures_in_workers_what_it_measures_in_turn(tmp_path):
    script = tmp_path / "plan_at_module_level.py"
    script.write_text(UNGUARDED)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stderr.count("script started") == 1  # the workers never ran the caller's script
    rates = json.loads(done.stdout.strip().splitlines()[-1])
    assert rates["workers"] == rates["in_turn"]
    assert sorted(rates["ticks"]) == [1, 1, 1, 2, 2, 2]
    assert len({json.dumps(r, sort_keys=True) for r in rates["in_turn"]}) == 3  # three plans, three rates
    assert all(r > 0 for rates_of in rates["in_turn"] for r in rates_of.values())


def test_an_error_in_a_worker_reaches_the_planner_and_no_worker_is_left():
    from planner import plan

    plans = [plan(small_spec(1, t4), PlanRequest(objective="throughput", evaluator="none")).plan for t4 in (1, 2)]
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(InputError, match="unknown evaluator 'no-such-evaluator'"):
        measure_all("no-such-evaluator", plans, parse_arrivals("poisson"), DEFAULT_OVERHEADS, jobs=2)
    assert {p.pid for p in psutil.Process().children(recursive=True)} == before


def test_jobs_must_be_a_whole_number_of_processes():
    with pytest.raises(InputError, match="--jobs: expected a whole number >= 1"):
        PlanRequest(jobs=0)
    assert "jobs" not in PlanRequest(jobs=2).to_dict()  # how to plan, not what: plan.json does not record it


def test_closing_the_pool_kills_a_worker_busy_with_a_call_nobody_waits_for():
    """A search's guess that no search asked for after all is not waited for: its worker is killed, its future says
    so, and no process is left."""
    import time

    from planner.sustained.measure_pool import WorkerPool

    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with WorkerPool(2) as pool:
        unwanted = pool.submit(time.sleep, 20)
        wanted = pool.submit(abs, -3)
        assert wanted.result() == 3
        while not pool.busy():  # the sleep has reached a worker
            time.sleep(0.01)
    with pytest.raises(RuntimeError, match="closed before this call finished"):
        unwanted.result(timeout=0)
    assert {p.pid for p in psutil.Process().children(recursive=True)} == before


def test_a_worker_takes_calls_only_once_it_is_ready():
    """Calls that take microseconds are all done in the caller while the workers import: a call handed to a worker
    still starting waited for its imports (a third of the time of the first MILPs at 16 GPUs)."""
    from planner.sustained.measure_pool import WorkerPool

    with WorkerPool(2, preload=("planner.sustained.search",)) as pool:
        assert set(pool.map(os.getpid, [()] * 200)) == {os.getpid()}
        assert pool.submit(os.getpid).result() != os.getpid()  # a submitted call waits for a ready worker


def test_prestarted_workers_serve_the_next_pool_and_those_left_stop_at_exit():
    """`poolpipe plan` starts its workers before its own imports (worker_process.prestart): the pool that asks next
    takes those very processes; ones no pool took are stopped when the process that started them exits."""
    from planner.cli.plan_cli import SEARCH_MODULE
    from planner.sustained import search
    from planner.sustained.measure_pool import WorkerPool
    from planner.sustained.worker_process import prestart

    assert SEARCH_MODULE == search.__name__  # what the CLI starts is what plan_sustained's pool asks for
    preload = (SEARCH_MODULE,)
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    prestart(2, preload)
    started = {p.pid for p in psutil.Process().children(recursive=True)} - before
    assert len(started) == 2
    with WorkerPool(2, preload=preload) as pool:
        assert {p.pid for p in psutil.Process().children(recursive=True)} - before == started  # none started anew
        assert {pool.submit(os.getpid).result() for _ in range(8)} <= started
    assert {p.pid for p in psutil.Process().children(recursive=True)} == before

    code = ("from planner.sustained.worker_process import prestart, take_prestarted; prestart(1, ()); "
            "print(take_prestarted(0, ()) == [] and __import__('psutil').Process().children()[0].pid)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60, cwd=ROOT)
    pid = int(out.stdout)
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
