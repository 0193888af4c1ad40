"""Load-factor sweeps: simulate a plan at fractions of a reference plan's throughput and find, per model,
the largest load factor that keeps SLO attainment >= the target (99% by default)."""

from __future__ import annotations

import os
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import numpy as np

from plans.plan_json import Plan
from poolpipe_common.errors import InputError
from poolpipe_common.overheads import TARGET_ATTAINMENT as TARGET_ATTAINMENT  # its callers read it here
from poolpipe_common.overheads import Overheads
from scheduler.core.driver import DriverConfig
from scheduler.core.topology import slowed_as_measured, with_stage_overhead
from scheduler.sim.priorities import SimControls, by_priority
from workloads.arrivals import TraceSpec, mixed_arrivals

DRIVERS = ("ideal", "live")
# A point's warm-up (warmup_s): at least this many requests of each model and this many SLOs, at most half the
# counted run.
WARMUP_REQUESTS = 256
WARMUP_SLOS = 10
WARMUP_FRACTION = 0.5


def parse_load_factors(text: str) -> list[float]:
    """``START:STOP:STEP`` (inclusive) or a comma list, e.g. ``0.05:1.0:0.05`` or ``0.5,0.8,1``."""
    try:
        if ":" in text:
            a, b, s = (float(x) for x in text.split(":"))
            if s <= 0 or b < a:
                raise ValueError
            n = int(np.floor((b - a) / s + 1e-9)) + 1
            vals = [round(a + i * s, 10) for i in range(n)]
        else:
            vals = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InputError(f"--load-factors {text!r}: expected START:STOP:STEP (e.g. 0.05:1.0:0.05) "
                         "or a comma list of positive numbers") from None
    if not vals or any(v <= 0 for v in vals):
        raise InputError(f"--load-factors {text!r}: load factors must be positive")
    return sorted(set(vals))


def reference_rates(plan: Plan, reference: Plan) -> dict[str, float]:
    """Each model's planned throughput in the reference plan (load factor 1.0)."""
    ref = {m.name: m.throughput_rps for m in reference.models}
    missing = [m.name for m in plan.models if m.name not in ref]
    if missing:
        raise InputError(f"--reference-plan has no model {', '.join(missing)} (it has {', '.join(ref)})")
    return {m.name: ref[m.name] for m in plan.models}


@dataclass(frozen=True)
class PointJob:
    plan: Plan
    rates_rps: dict[str, float]  # at load factor 1
    policy: str
    trace: TraceSpec
    load_factor: float
    duration_s: float
    seed: int
    noise_cv: float = 0.0
    driver: str = "ideal"  # "ideal" (the policy alone) or "live" (the sidecar's margins and learning)
    overheads: Overheads | None = None  # what the live executor adds (poolpipe serve --overheads-out)
    shard: tuple[int, int] | None = None  # (I, N): only sidecar shard I of N, offered 1/N of the load
    controls: SimControls | None = None  # Triton's batcher controls and the priorities requests are sent with
    # models whose failure to hold TARGET_ATTAINMENT ends the run as soon as it is certain (a load search's open ones)
    stop_when_failed: tuple[str, ...] = ()
    stop_on_any_failed: bool = False  # ... as soon as one of them has certainly failed (a joint verdict)
    # simulated before the counted ``duration_s``, its arrivals served but not counted; None: warmup_s's rule
    warmup_s: float | None = None


def driver_config(driver: str, overheads: Overheads | None) -> DriverConfig:
    if driver not in DRIVERS:
        raise InputError(f"--driver {driver!r}: choose one of {', '.join(DRIVERS)}")
    lead = overheads.lead_us if overheads else 0.0  # the core's clock leads by it, as live
    return DriverConfig.live(clock_lead_us=lead) if driver == "live" else DriverConfig.ideal(clock_lead_us=lead)


def warmup_s(slo_us: Iterable[float], rates_rps: dict[str, float], duration_s: float) -> float:
    """How long a point runs before the requests it counts arrive, so that it is judged warm, as a live load test
    that warms up first: a run starts with empty queues and a driver that has learned nothing, and what a short
    run makes of that start would otherwise weigh more in it than in a long one (at their promise, requests in the
    first 0.1 s of a run missed a quarter as often as later ones: a scratch run). The driver learns its margin from
    the lateness of recent batches (from the 8th on, a percentile over up to 256) and the policy a model's rate
    from its last 32 arrivals: WARMUP_REQUESTS of each model give both the run's own traffic to learn from; and a
    request leaves within about its SLO, so after WARMUP_SLOS of the largest the queues and reservations hold the
    steady state's. Never more than the driver's lateness horizon (2 s: nothing it learned before then still counts)
    nor WARMUP_FRACTION of the counted run. The same for a quarter-length point as for a full one unless that bound
    cuts it, and a function of the inputs only (deterministic)."""
    per_model = [WARMUP_REQUESTS / r for r in rates_rps.values() if r > 0]
    settle = max([WARMUP_SLOS * max(slo_us, default=0.0) / 1e6, *per_model])
    return min(settle, DriverConfig.live().lateness_horizon_us / 1e6, WARMUP_FRACTION * duration_s)


def run_point(job: PointJob, record_timeline: bool = False) -> tuple[dict[str, Any], Any]:
    """Simulate one load factor, warm-up first (``PointJob.warmup_s``); returns the per-point summary (of the
    requests that arrived in the counted ``duration_s``) and the raw SimResult."""
    from scheduler.core import make_scheduler
    from scheduler.sim.engine import simulate
    from scheduler.sim.interference import interference_of
    from scheduler.sim.placement import topology_from_plan

    topo = topology_from_plan(job.plan)
    share = 1.0
    if job.shard is not None:
        from scheduler.core.shards import shard_topology
        topo, share = shard_topology(topo, *job.shard), 1.0 / job.shard[1]
    rates = {m: job.load_factor * r * share for m, r in job.rates_rps.items()}
    ov = (job.overheads.at_rate(sum(rates.values()), topo.stage_calls_per_request()) if job.overheads is not None
          else None)
    if ov is not None:  # the policy plans with the compute the sidecar measures; the run then runs it as planned
        topo, ov = slowed_as_measured(with_stage_overhead(topo, ov.tail_us, ov.tail_per_mb_us / 1e6), ov)
    controls = job.controls or SimControls()
    topo = controls.topology(topo)
    warm = job.warmup_s if job.warmup_s is not None else warmup_s(topo.slo_us.values(), rates, job.duration_s)
    arrivals = mixed_arrivals(job.trace, rates, warm + job.duration_s, job.seed)
    priorities = controls.draw(len(arrivals), job.seed)
    first = sum(t < warm * 1e6 for t, _ in arrivals)  # the warm-up's arrivals (sorted by time) come first
    counts = Counter(m for _, m in arrivals[first:])
    budget = {m: int((1.0 - TARGET_ATTAINMENT) * counts[m]) for m in job.stop_when_failed if counts[m]}
    res = simulate(topo, make_scheduler(job.policy, topo), arrivals, (warm + job.duration_s) * 1e6,
                   noise_cv=job.noise_cv, seed=job.seed, record_timeline=record_timeline,
                   driver=driver_config(job.driver, ov), overheads=ov,
                   interference=interference_of(job.plan), priorities=priorities, miss_budget=budget,
                   stop_on_any=job.stop_on_any_failed, warmup_us=warm * 1e6)
    models = {}
    for m in job.rates_rps:
        st = res.models.get(m)
        # a run stopped early is judged on every request it was to offer: its misses already exceed the budget
        over = (st.late + st.dropped) > budget.get(m, counts[m])
        attainment = (1.0 - (st.late + st.dropped) / counts[m]) if res.stopped_early and over else st.attainment
        models[m] = {"load_factor": job.load_factor,
                     "offered_rps": counts[m] / job.duration_s,
                     "slo_attainment": attainment,
                     "dropped": st.dropped,
                     "late": st.late,
                     "p50_latency_us": st.latency_percentile(50),
                     "p99_latency_us": st.latency_percentile(99),
                     "utilization": res.utilization}
    summary = {"load_factor": job.load_factor, "models": models, "dispatches": res.dispatches,
               "probe_calls": res.probe_calls, "dispatch_us": res.dispatch_us,
               "batch_sizes": {str(k): v for k, v in sorted(res.batch_sizes.items())},
               "utilization": res.utilization, "unfinished": res.unfinished, "stopped_early": res.stopped_early,
               "warmup_s": warm}
    if job.controls is not None:
        summary["by_priority"] = by_priority(res.outcomes, priorities, first)
        summary["drop_reasons"] = dict(res.drop_reasons)
    return summary, (res if record_timeline else None)


def _point_summary(job: PointJob) -> dict[str, Any]:
    return run_point(job)[0]


def max_load_factor(points: list[dict[str, Any]], target: float = TARGET_ATTAINMENT) -> float:
    """Largest load factor whose attainment, and that of every smaller one swept, is >= target."""
    best = 0.0
    for p in sorted(points, key=lambda p: p["load_factor"]):
        if p["slo_attainment"] + 1e-12 < target:
            break
        best = p["load_factor"]
    return best


def sweep(plan: Plan, reference: Plan, policy: str, trace: TraceSpec, load_factors: list[float],
          duration_s: float, seed: int, jobs: int | None = None, noise_cv: float = 0.0,
          on_point: Callable[[dict[str, Any]], None] | None = None, driver: str = "ideal",
          overheads: Overheads | None = None, shard: tuple[int, int] | None = None,
          controls: SimControls | None = None) -> dict[str, Any]:
    """Run every load factor (in parallel processes when jobs > 1) and assemble result.json; with ``shard``
    (I, N) only sidecar shard I of N, offered 1/N of each load."""
    rates = reference_rates(plan, reference)
    work = [PointJob(plan, rates, policy, trace, lf, duration_s, seed, noise_cv, driver, overheads, shard, controls)
            for lf in load_factors]
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(work)))
    driver_config(driver, overheads)  # fail early on a bad name
    summaries: list[dict[str, Any]] = []
    if jobs == 1:
        for w in work:
            summaries.append(_point_summary(w))
            if on_point:
                on_point(summaries[-1])
    else:
        with ProcessPoolExecutor(jobs) as ex:
            for s in ex.map(_point_summary, work):
                summaries.append(s)
                if on_point:
                    on_point(s)
    result = assemble(plan, reference, policy, trace, duration_s, seed, summaries)
    result["driver"] = driver
    if overheads is not None:
        result["overheads"] = overheads.to_dict()
    return result


def assemble(plan: Plan, reference: Plan, policy: str, trace: TraceSpec, duration_s: float, seed: int,
             summaries: list[dict[str, Any]]) -> dict[str, Any]:
    summaries = sorted(summaries, key=lambda s: s["load_factor"])
    models = []
    for m in plan.models:
        pts = [s["models"][m.name] for s in summaries]
        models.append({"name": m.name, "max_load_factor": max_load_factor(pts), "points": pts})
    all_us = [x for s in summaries for x in s["dispatch_us"]]
    n_disp = sum(s["dispatches"] for s in summaries)
    n_probe = sum(s["probe_calls"] for s in summaries)
    return {
        "policy": policy,
        "planner": plan.planner,
        "reference_planner": reference.planner,
        "trace": str(trace),
        "duration_s": duration_s,
        "seed": seed,
        "max_load_factor": float(np.mean([m["max_load_factor"] for m in models])),
        "models": models,
        "dispatch_us_p50": float(np.percentile(all_us, 50)) if all_us else None,
        "probes_per_dispatch": n_probe / n_disp if n_disp else 0.0,
        "points": [{"load_factor": s["load_factor"], "utilization": s["utilization"],
                    "batch_sizes": s["batch_sizes"], "dispatches": s["dispatches"],
                    "unfinished": s["unfinished"]}
                   | {k: s[k] for k in ("by_priority", "drop_reasons") if k in s} for s in summaries],
    }
