"""loadtest.host_cpu: the host's busy CPUs over a measurement, as live points record them."""

import os
import sys

import psutil
import pytest

from loadtest.host_cpu import busy_cores, cpu_jiffies


def test_busy_cores_is_the_busy_share_of_elapsed_jiffies_times_the_cpus():
    assert busy_cores((100, 1000), (150, 1100), cpus=2) == pytest.approx(1.0)
    assert busy_cores((100, 1000), (100, 1100), cpus=2) == 0.0


def test_busy_cores_says_nothing_without_two_readings_or_elapsed_time():
    assert busy_cores(None, (1, 2), cpus=2) is None
    assert busy_cores((1, 2), None, cpus=2) is None
    assert busy_cores((5, 10), (5, 10), cpus=2) is None


def _psutil_jiffies() -> tuple[float, float]:
    """(busy, total) of all CPUs as psutil reads them, in ticks."""
    t = psutil.cpu_times()
    total = t.user + t.nice + t.system + t.idle + t.iowait + t.irq + t.softirq + t.steal  # guest is within user
    tick = os.sysconf("SC_CLK_TCK")
    return (total - t.idle - t.iowait) * tick, total * tick


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/stat is Linux's")
def test_the_readings_are_the_busy_and_total_time_psutil_reads_of_the_same_counters():
    lo = _psutil_jiffies()
    ours = cpu_jiffies()
    hi = _psutil_jiffies()
    assert ours is not None
    for k in (0, 1):  # monotonic counters read in between: bracketed, to psutil's rounding of a tick
        assert lo[k] - 1 <= ours[k] <= hi[k] + 1, (k, lo, ours, hi)
