"""replay:FILE arrivals: real traces scaled to a target rate keep their burstiness, in the simulator and its CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from poolpipe_common.errors import InputError
from tests.conftest import ROOT, run_cli
from tests.test_sched_sim import reference_plan
from workloads.arrivals import REPLAY_SHORTCUTS, arrival_times, mixed_arrivals, parse_trace
from workloads.replay import replay_arrivals, replay_gaps, replay_start, replay_trace

AZURE = ROOT / "data" / "traces" / "azure-llm-2023"


def cv(x: np.ndarray) -> float:
    return float(x.std() / x.mean())


@pytest.mark.parametrize("name, n, rate", [("azure-code", 8819, 2.566), ("azure-conv", 19366, 5.530)])
def test_shipped_traces_scale_to_the_rate_and_keep_their_cv(name, n, rate):
    spec = parse_trace(f"replay:{name}")
    assert spec.path == str(REPLAY_SHORTCUTS[name]) and str(spec) == f"replay:{name}"
    assert REPLAY_SHORTCUTS[name].parent == AZURE and (AZURE / "LICENSE").is_file()
    times = replay_trace(spec.path)
    assert times.size == n and (n - 1) / times[-1] == pytest.approx(rate, rel=1e-3)
    own_cv = cv(np.diff(times))
    for target in (10.0, 100.0, 2000.0):
        cycles = 2 * n / target  # two whole replays of the trace
        a = arrival_times(spec, target, cycles, seed=3)
        assert abs(a.size - 2 * n) <= 1 and a.size / cycles == pytest.approx(target, rel=0.01)
        assert cv(np.diff(a)) == pytest.approx(own_cv, rel=0.02)
    hour = arrival_times(spec, 100.0, 3600.0)  # not a whole number of replays: still the rate asked for
    assert abs(hour.size - 360_000) <= 1
    # a short stretch offers the rate it is asked for, although the trace runs below its mean there (its first
    # 7 minutes: 0.85 of it), and keeps the stretch's own shape
    for seconds in (6.0, 30.0):
        short = arrival_times(spec, 400.0, seconds)
        assert abs(short.size - 400 * seconds) <= 1
        assert np.diff(short)[:200] == pytest.approx(np.diff(times)[:200] * (short[200] / times[200]), rel=1e-6)


def test_a_plain_file_of_seconds_replays_cyclically_and_exactly(tmp_path):
    # gaps 1, 0, 2 over 3 s (1 rps) and the wrap back to the start, one mean gap (1 s): a 4-gap cycle
    (tmp_path / "t.csv").write_text("time_s\n10\n11\n11\n\n13\n")
    expected = [0, 0.5, 0.5, 1.5, 2, 2.5, 2.5, 3.5]  # two cycles in 4 s at 2 rps
    assert arrival_times(f"replay:{tmp_path / 't.csv'}", 2.0, 4.0) == pytest.approx(expected)
    (tmp_path / "d.csv").write_text("TIMESTAMP,ContextTokens\n2023-11-16 23:59:59.5,1\n2023-11-17 00:00:00.5,2\n"
                                    "2023-11-17 00:00:00.5,3\n2023-11-17 00:00:02.5000000,4\n")
    assert arrival_times(f"replay:{tmp_path / 'd.csv'}", 2.0, 4.0) == pytest.approx(expected)
    # 10 arrivals in 5 s: gaps 1, 0, 2, 1, 1, 0, 2, 1, 1, (0) span 9 s of the trace, scaled to 5 s; the tenth
    # arrival, tied with the ninth, falls on the end of the run
    assert arrival_times(f"replay:{tmp_path / 't.csv'}", 2.0, 5.0) == pytest.approx(
        np.array([0, 1, 1, 3, 4, 5, 5, 7, 8]) * 5 / 9)
    # seed 3 starts at another arrival of the same cycle
    start = replay_start(4, 3)
    shifted = arrival_times(f"replay:{tmp_path / 't.csv'}", 2.0, 4.0, seed=3)
    assert np.diff(shifted)[:4] == pytest.approx(np.roll([0.5, 0, 1, 0.5], -start))


def test_seeds_and_models_choose_where_the_replay_starts():
    spec = parse_trace("replay:azure-code")
    times = replay_trace(spec.path)
    first = arrival_times(spec, 100.0, 5.0)
    # seed 0: its start, 500 arrivals in 5 s
    assert np.diff(first)[:50] == pytest.approx(np.diff(times)[:50] * (5.0 / times[500]), rel=1e-6)
    assert np.array_equal(first, arrival_times(spec, 100.0, 5.0))
    assert np.array_equal(arrival_times(spec, 100.0, 5.0, seed=7), arrival_times(spec, 100.0, 5.0, seed=7))
    assert not np.array_equal(arrival_times(spec, 100.0, 5.0, seed=7), arrival_times(spec, 100.0, 5.0, seed=8))
    # several models: each replays the whole trace at its own rate, m models spread evenly through it
    n = times.size
    assert [replay_start(n, 0, i, 3) for i in range(3)] == [0, n // 3, 2 * n // 3]
    mixed = mixed_arrivals(spec, {"a": 100.0, "b": 100.0}, 20.0, seed=1)
    a = np.array([t for t, m in mixed if m == "a"])
    b = np.array([t for t, m in mixed if m == "b"])
    assert np.array_equal(a, arrival_times(spec, 100.0, 20.0, seed=1, model_index=0, n_models=2) * 1e6)
    assert np.array_equal(b, arrival_times(spec, 100.0, 20.0, seed=1, model_index=1, n_models=2) * 1e6)
    per_second = [np.histogram(x, bins=np.arange(0, 21e6, 1e6))[0] for x in (a, b)]
    assert not np.array_equal(*per_second)  # the bursts do not coincide


gaps_strategy = st.lists(st.one_of(st.just(0.0), st.floats(1e-3, 100.0)), min_size=1, max_size=40
                         ).filter(lambda g: sum(g) > 0)  # ties allowed


@settings(max_examples=60, deadline=None)
@given(gaps=gaps_strategy, origin=st.floats(-1e6, 1e6), rate=st.floats(0.01, 1e4), cycles=st.floats(0.05, 3.0),
       start=st.integers(0, 10_000))
def test_replay_is_the_trace_with_time_scaled(gaps, origin, rate, cycles, start):
    times = origin + np.concatenate(([0.0], np.cumsum(gaps)))
    n = times.size
    start %= n
    cycle = np.roll(replay_gaps(times - times[0]), -start)
    duration = cycles * n / rate
    a = replay_arrivals(times - times[0], rate, duration, start)
    # the rate asked for (but for arrivals tied at the end of the run), in order, inside the run
    asked = max(1, round(rate * duration))
    assert asked - 1 - gaps.count(0.0) <= a.size <= asked
    assert a[0] == 0.0 and np.all(np.diff(a) >= 0) and a[-1] < duration
    # every gap is the trace's gap x one factor, the stretch's span onto the run's: the stretch's shape is kept
    stretch = np.tile(cycle, asked // n + 1)[:asked]
    scale = duration / stretch.sum() if stretch.sum() > 0 else duration / (cycle.mean() * asked)
    assert np.diff(a) == pytest.approx(stretch[:a.size - 1] * scale, rel=1e-6, abs=1e-9 / rate)


@pytest.mark.parametrize("content, message", [
    (None, "no such file"),
    ("TIMESTAMP,ContextTokens\n2023-11-16 18:17:03.9799600,4\nyesterday,5\n", "line 3: TIMESTAMP 'yesterday'"),
    ("TIMESTAMP\n2023-11-16 18:17:03.9799600\n", "1 arrival(s)"),
    ("seconds\n", "0 arrival(s)"),
    ("0\n2\n1\n", "line 3: the arrival is earlier"),
    ("5\n5\n5\n", "at one instant"),
    ("0\n1\nsoon\n", "line 3: expected one arrival time in seconds"),
    ("app,func,end_timestamp,duration\na,f,1.0,0.5\n", "line 1: expected one arrival time"),
])
def test_bad_replay_files_are_one_line_input_errors(tmp_path, content, message):
    path = tmp_path / "trace.csv"
    if content is not None:
        path.write_text(content)
    with pytest.raises(InputError) as e:
        parse_trace(f"replay:{path}")
    assert str(e.value).startswith("--trace") and message in str(e.value) and "\n" not in str(e.value)


def test_replay_shortcut_missing_file_or_name(tmp_path):
    with pytest.raises(InputError, match="shortcuts: azure-code, azure-conv"):
        parse_trace("replay:")
    with pytest.raises(InputError, match="no such file azure-chat"):
        parse_trace("replay:azure-chat")


def test_simulate_replays_the_azure_trace_end_to_end(tmp_path):
    reference_plan().save(tmp_path / "p.json")
    r = run_cli("simulate", "--plan", tmp_path / "p.json", "--trace", "replay:azure-code", "--load-factors", "0.3",
                "--duration-s", "2", "--jobs", "1", "--out", tmp_path / "r.json", timeout=300)
    assert r.returncode == 0, r.stderr
    res = json.loads((tmp_path / "r.json").read_text())
    assert res["trace"] == "replay:azure-code"
    points = [m["points"][0] for m in res["models"]]
    assert all(p["offered_rps"] > 0 and 0 < p["slo_attainment"] <= 1 for p in points)
    (tmp_path / "bad.csv").write_text("0\n2\n1\n")
    for trace, field in ((f"replay:{tmp_path / 'bad.csv'}", "must not decrease"), ("replay:", "shortcut")):
        r = run_cli("simulate", "--plan", tmp_path / "p.json", "--trace", trace, "--out", tmp_path / "r.json")
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and "--trace" in lines[0] and field in lines[0], r.stderr


def test_loadtest_refuses_a_bad_replay_before_it_starts(tmp_path):
    r = run_cli("loadtest", "--url", "127.0.0.1:1", "--model", "m", "--rate", "5", "--trace", "replay:/nope.csv",
                "--out", tmp_path)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "--trace" in lines[0] and "no such file" in lines[0], r.stderr
