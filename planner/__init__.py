"""Planner: profile data model and importers, profiler, pre-partitioning, MILP planner and baselines."""
