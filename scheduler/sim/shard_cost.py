"""``poolpipe simulate --shards N``: what splitting the sidecar into N shards costs in max load factor.

Each shard serves its share of every pool (scheduler/core/shards.py) and gets 1/N of every model's load;
the sharded deployment sustains a load factor only where every shard does, so per model it is the least
of the shards'. Against one sidecar the difference is the statistical multiplexing lost (a burst that
one scheduler would spread over every pool meets only a shard's vGPUs) and the GPUs that do not split
evenly (whole physical GPUs per shard).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from plans.plan_json import Plan
from scheduler.core.shards import shard_topology
from scheduler.sim.placement import topology_from_plan
from scheduler.sim.sweep import sweep


def check_shards(plan: Plan, n: int) -> None:
    """InputError now (before any simulation) if N < 1 or a shard would hold no complete pipeline of a model."""
    topo = topology_from_plan(plan)
    for i in range(n):
        shard_topology(topo, i, n)


def shard_sweeps(plan: Plan, reference: Plan, n: int, on_shard: Callable[[int], Any] | None = None,
                 **sweep_args: Any) -> dict[str, Any]:
    """Sweep each of the N shards at 1/N of the load; per model the sharded max load factor is the shards' least."""
    per_shard = []
    for i in range(n):
        kw = dict(sweep_args)
        if on_shard is not None:
            kw["on_point"] = on_shard(i)
        per_shard.append(sweep(plan, reference, shard=(i, n), **kw))
    models = []
    for k, m in enumerate(plan.models):
        lfs = [r["models"][k]["max_load_factor"] for r in per_shard]
        models.append({"name": m.name, "max_load_factor": min(lfs), "per_shard": lfs})
    return {"shards": n, "max_load_factor": float(np.mean([m["max_load_factor"] for m in models])),
            "models": models}


def report(one: dict[str, Any], sharded: dict[str, Any]) -> list[str]:
    """Lines comparing N shards with one sidecar, per model and overall."""
    n = sharded["shards"]
    lines = []
    for single, m in zip(one["models"], sharded["models"]):
        base = single["max_load_factor"]
        cost = f"{100 * (1 - m['max_load_factor'] / base):.0f}% less" if base > 0 else "n/a"
        per = ", ".join(f"{x:.2f}" for x in m["per_shard"])
        lines.append(f"{m['name']}: {n} shards sustain load factor {m['max_load_factor']:.2f} (shards: {per}) vs "
                     f"{base:.2f} with one sidecar ({cost})")
    lines.append(f"sharding cost: mean max load factor {sharded['max_load_factor']:.3f} with {n} shards vs "
                 f"{one['max_load_factor']:.3f} with one sidecar")
    return lines
