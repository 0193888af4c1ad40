"""scheduler/core: clock-free, I/O-free scheduling: reservation tables, probes, placement and policies."""

from scheduler.core.policies import POLICIES, make_scheduler

__all__ = ["POLICIES", "make_scheduler"]
