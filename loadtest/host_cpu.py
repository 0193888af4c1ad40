"""How busy the host's CPUs were over a measurement, from Linux's /proc/stat: beside each live point, so a reader
can tell a point measured on a slow host from one the system under test lost. On this project's 2-core VM the same
deployment, rate and arrivals kept 0.96-1.19 cores busy from one 6 s point to the next, and attainment fell as it rose
(benchmarks/live_point_noise.py): the same work costs the host more CPU at some times than at others."""

from __future__ import annotations

from pathlib import Path

PROC_STAT = Path("/proc/stat")
IDLE_FIELDS = (3, 4)  # idle, iowait of the aggregate "cpu" line (after its name)


def cpu_jiffies() -> tuple[int, int] | None:
    """(busy, total) jiffies of all CPUs since boot; None where /proc/stat is not there to read."""
    try:
        fields = [int(x) for x in PROC_STAT.read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    total = sum(fields[:8])  # guest time is counted within user already
    return total - sum(fields[i] for i in IDLE_FIELDS), total


def busy_cores(before: tuple[int, int] | None, after: tuple[int, int] | None, cpus: int) -> float | None:
    """The CPUs kept busy on average between two cpu_jiffies() readings (0..cpus); None where either is missing."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return cpus * (after[0] - before[0]) / (after[1] - before[1])
