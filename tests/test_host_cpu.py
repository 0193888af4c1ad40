"""loadtest.host_cpu: the host's busy CPUs over a measurement, as live points record them."""

import os
import sys

import pytest

from loadtest.host_cpu import busy_cores, cpu_jiffies


def test_busy_cores_is_the_busy_share_of_elapsed_jiffies_times_the_cpus():
    assert busy_cores((100, 1000), (150, 1100), cpus=2) == pytest.approx(1.0)
    assert busy_cores((100, 1000), (100, 1100), cpus=2) == 0.0


def test_busy_cores_says_nothing_without_two_readings_or_elapsed_time():
    assert busy_cores(None, (1, 2), cpus=2) is None
    assert busy_cores((1, 2), None, cpus=2) is None
    assert busy_cores((5, 10), (5, 10), cpus=2) is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/stat is Linux's")
def test_a_spinning_process_keeps_the_host_busy_between_readings():
    before = cpu_jiffies()
    x, end = 0, os.times().elapsed + 0.3
    while os.times().elapsed < end:  # at least 30 jiffies of this process's own CPU time pass
        x += 1
    after = cpu_jiffies()
    assert before is not None and after is not None and before[0] <= before[1]
    cores = busy_cores(before, after, os.cpu_count() or 1)
    assert cores is not None and 0 < cores <= (os.cpu_count() or 1)
