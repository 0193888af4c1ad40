"""The live executor's learned send-to-compute lead cannot outlive the burst that taught it; what a stage holds its
vGPU for includes its server's turnaround."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from poolpipe_common.quantile import percentile
from scheduler.server.planned import lead
from scheduler.server.planned.lead import (
    LEAD_EVERY,
    LEAD_HORIZON_US,
    LEAD_MIN_SAMPLES,
    LEAD_PRUNED_EVERY_US,
    LeadLearner,
)
from scheduler.server.planned.vgpu_occupancy import WEIGHT as OCCUPANCY_WEIGHT
from scheduler.server.planned.vgpu_occupancy import VgpuOccupancy


def _burst_then_calm(learner: LeadLearner) -> tuple[float, float]:
    """32 idle-server stages 5 ms late in 0.3 s (a burst), then on-time ones from 2.1 s on; returns the lead
    learned at the burst's end and after 40 calm stages."""
    for i in range(32):
        learner.observe(i * 10_000.0, 5_000.0)
    during = learner.extra_us
    for i in range(40):
        learner.observe(2.4e6 + i * 10_000.0, 100.0)
    return during, learner.extra_us


def test_a_bursts_lead_is_forgotten_two_seconds_after_it():
    during, after = _burst_then_calm(LeadLearner())
    assert during == 5_000.0
    assert after == 100.0
    assert LEAD_HORIZON_US <= 2_000_000.0


def test_without_the_horizon_the_burst_would_be_kept():
    """The counterfactual (a count-only window, as before): the calm stages do not outvote the burst's."""
    during, after = _burst_then_calm(LeadLearner(horizon_us=math.inf))
    assert during == 5_000.0 and after == 5_000.0


def test_at_a_low_rate_the_newest_samples_are_kept_whatever_their_age():
    """Samples seconds apart: the lead is learned from the newest ones, not dropped for want of recent ones."""
    learner = LeadLearner()
    for i in range(LEAD_MIN_SAMPLES):
        learner.observe(i * 5e6, 3_000.0)
    assert learner.extra_us == 3_000.0
    assert learner.observe(LEAD_MIN_SAMPLES * 5e6, 3_000.0) is None and learner.extra_us == 3_000.0


def test_at_a_low_rate_the_percentile_is_not_recomputed_for_every_sample(monkeypatch: pytest.MonkeyPatch) -> None:
    """50 samples a second: from the 101st on each one prunes the oldest; the percentile is recomputed every
    LEAD_EVERY samples and, for pruning, at most every LEAD_PRUNED_EVERY_US, not once per sample (per stage call)."""
    calls = []
    monkeypatch.setattr(lead, "percentile", lambda v, q: calls.append(q) or percentile(v, q))
    learner = LeadLearner()
    for i in range(400):
        learner.observe(i * 20_000.0, 100.0 + i)
    assert len(calls) <= 400 / LEAD_EVERY + 400 * 20_000.0 / LEAD_PRUNED_EVERY_US + 1
    assert learner.extra_us >= percentile([100.0 + i for i in range(300, 400)], 90) - 20  # still follows the rise


@given(st.lists(st.floats(0.0, 1e7), min_size=1, max_size=300), st.floats(0.0, 100.0))
def test_percentile_is_numpys(values: list[float], q: float) -> None:
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)), rel=1e-12, abs=1e-9)


def test_a_vgpu_is_held_for_its_servers_turnaround_between_back_to_back_batches():
    """A batch sent while the one before it computed waited in the server's queue: its start less that end is the
    server's turnaround, and every later compute on that vGPU is reported held that much longer; a batch sent to
    an idle vGPU measures the lead instead and leaves the turnaround alone."""
    occ = VgpuOccupancy()
    assert occ.measured("g0", 0.0, 1000.0, 5000.0)  # idle at the send
    assert occ.held("g0", 1000.0, 5000.0) == (1000.0, 5000.0)  # nothing known yet
    assert not occ.measured("g0", 4000.0, 7000.0, 9000.0)  # queued behind it: 2 ms turnaround
    assert occ.held("g0", 7000.0, 9000.0) == (7000.0, 11000.0)
    assert not occ.measured("g0", 8000.0, 10_000.0, 12_000.0)  # 1 ms this time: smoothed, not replaced
    assert occ.turnaround_us["g0"] == pytest.approx(2000.0 + OCCUPANCY_WEIGHT * (1000.0 - 2000.0))
    assert occ.measured("g0", 20_000.0, 21_000.0, 22_000.0) and occ.held("g1", 0.0, 1.0) == (0.0, 1.0)
