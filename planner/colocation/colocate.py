"""Co-located planning (InSS-style, on pooled pipelines): vGPUs of different (model, partition) pairs share a
physical GPU, latencies inflated by the interference model for the co-runners the plan gives them, and GPU
memory as a hard constraint.

1. Memory: a partition fits a 1/V vGPU only if context + weights + activations at its batch <= capacity / V
   (each MPS client's share, as CUDA_MPS_PINNED_DEVICE_MEM_LIMIT would enforce); others are dropped.
2. The co-location MILP (planner.colocation.colocate_milp) picks pipelines and vGPU counts from the candidates of
   profiles whose latency at (GPU type, V) is multiplied by the model's current inflation there (1 at first).
3. Placement (greedy, as InSS places heuristically): per (GPU type, V) the slots are sorted by memory
   pressure and dealt to GPUs in order, so co-runners press alike and a partition's slots stay together.
4. Check: each slot's slowdown with every co-runner busy (plans.colocation_costs). Where one exceeds the inflation
   it was planned with, the inflation is raised to it and steps 2-4 repeat; the result is checked again (latency
   under the SLO and rate with the inflated latency, memory per GPU). ``aware=False`` plans as if there were no
   interference (gpulet/InSS-ni style): the plan is then what the simulator shows interference doing to it.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import replace

import numpy as np

from planner.colocation.colocate_milp import solve_colocated
from planner.ppipe.pipeline_columns import PipelineColumns, enumerate_candidates
from planner.ppipe.pooled import InfeasibleError, ModelPipelines, assemble_plan, infeasible_reason, pipeline_plan
from planner.solvers.milp_solvers import SolverOptions
from plans.colocation_costs import (
    check_gpu_memory,
    need_colocation_facts,
    partition_memory,
    partition_pressure,
    plan_slots,
    slot_slowdowns,
    with_placement,
)
from plans.plan_json import PipelinePlan, Plan
from plans.spec.planning_spec import ModelSpec, PlanningSpec
from profiling.profile import DeviceTiming, Profile

MAX_ROUNDS = 8
TOLERANCE = 1e-9
MIN_RPS = 0.01  # a pipeline carrying less is an integrality-tolerance artefact (n_ck ~ 1e-6), not a plan


def inflated(profile: Profile, factors: dict[tuple[str, int], float]) -> Profile:
    """The profile with its latencies at each (GPU type, V) multiplied by ``factors`` (1 where absent)."""
    timings = {d: {v: (t if factors.get((d, v), 1.0) == 1.0 else
                       DeviceTiming(t.batch_sizes, t.latency_us * factors[(d, v)],
                                    t.quantiles and t.quantiles.scaled(factors[(d, v)])))
                   for v, t in lv.items()} for d, lv in profile.timings.items()}
    return replace(profile, timings=timings)


def memory_feasible(cand: PipelineColumns, model: ModelSpec, spec: PlanningSpec) -> PipelineColumns:
    """The candidates whose every partition fits its vGPU's share of the GPU's memory."""
    types = spec.cluster.gpu_types
    keep = []
    for c in range(len(cand)):
        ok = True
        for p in range(int(cand.num_parts[c])):
            cap = spec.cluster.memory_bytes(types[int(cand.gpu[c, p])])
            need = partition_memory(model.profile, int(cand.cuts[c, p]), int(cand.cuts[c, p + 1]),
                                    int(cand.batch[c, p]))
            if cap is not None and need > cap / int(cand.v[c, p]):
                ok = False
                break
        keep.append(ok)
    return cand.take(np.flatnonzero(keep))


def _candidates(spec: PlanningSpec, infl: dict[int, dict[tuple[str, int], float]]) -> list[PipelineColumns]:
    out = []
    for i, m in enumerate(spec.models):
        planned = replace(m, profile=inflated(m.profile, infl[i]))
        c = enumerate_candidates(planned, spec.cluster, spec.cluster.gpu_types, spec.max_partitions,
                                 spec.batch_unification, prune=True)
        c = memory_feasible(c, m, spec)
        if not len(c):
            raise InfeasibleError(f"model {m.name} is infeasible co-located: {infeasible_reason(m, spec.cluster)}, "
                                  "or no partition fits a vGPU's share of GPU memory")
        out.append(c)
    return out


def _place(spec: PlanningSpec, models: list[ModelPipelines], aware: bool) -> list[ModelPipelines]:
    """Deal every (GPU type, V) group's vGPU slots to physical GPUs in order of memory pressure (``aware``),
    or in plan order (an interference-blind placement)."""
    groups: dict[tuple[str, int], list[tuple[float, int, int, int, int]]] = defaultdict(list)
    for mi, mp in enumerate(models):
        prof = mp.model.profile
        for j, pl in enumerate(mp.pipelines):
            for k, p in enumerate(pl.partitions):
                pr = partition_pressure(prof, p.gpu, p.v, p.batch, *p.blocks)
                groups[(p.gpu, p.v)] += [(pr, mi, j, k, s) for s in range(p.num_vgpus)]
    where: dict[tuple[int, int, int], list[str]] = defaultdict(list)
    next_gpu: dict[str, int] = defaultdict(int)
    for (gtype, v), slots in sorted(groups.items()):
        for i, (_, mi, j, k, _) in enumerate(sorted(slots) if aware else slots):
            where[(mi, j, k)].append(f"{gtype}-{next_gpu[gtype] + i // v}")
        next_gpu[gtype] += -(-len(slots) // v)
    over = {t: n for t, n in next_gpu.items() if n > spec.cluster.gpus.get(t, 0)}
    if over:  # the MILP's packing guarantees this; a failure here is a bug, not bad input
        raise RuntimeError(f"co-located placement needs more GPUs than the cluster has: {over}")
    out = []
    for mi, mp in enumerate(models):
        pipes = tuple(PipelinePlan(tuple(with_placement(p, where[(mi, j, k)], p.slowdown)
                                         for k, p in enumerate(pl.partitions)), pl.throughput_rps, pl.latency_us)
                      for j, pl in enumerate(mp.pipelines))
        out.append(ModelPipelines(mp.model, pipes))
    return out


def _with_slowdowns(models: list[ModelPipelines], infl: dict[int, dict[tuple[str, int], float]], aware: bool
                    ) -> list[ModelPipelines]:
    """Record on each partition the slowdown its latency was planned with (its inflation; 1 when unaware)."""
    out = []
    for mi, mp in enumerate(models):
        pipes = tuple(replace(pl, partitions=tuple(
            replace(p, slowdown=infl[mi].get((p.gpu, p.v), 1.0) if aware else 1.0) for p in pl.partitions))
            for pl in mp.pipelines)
        out.append(ModelPipelines(mp.model, pipes))
    return out


def _assemble(spec: PlanningSpec, models: list[ModelPipelines], res, seconds: float, aware: bool, rounds: int,
              worst: float) -> Plan:
    plan = assemble_plan(spec, "ppipe-colocate", "highs", seconds, models, res)
    info = {"interference_aware": aware, "rounds": rounds, "worst_slowdown": round(worst, 6),
            "memory": "each vGPU <= GPU memory / V; checked per GPU"}
    return replace(plan, colocation=info)


def plan_colocated(spec: PlanningSpec, opts: SolverOptions, aware: bool = True) -> Plan:
    """A co-located plan of ``spec`` (see the module docstring); raises InfeasibleError when there is none."""
    t0 = time.perf_counter()
    for m in spec.models:
        need_colocation_facts(m.profile, spec.cluster.gpu_types)
    infl: dict[int, dict[tuple[str, int], float]] = {i: {} for i in range(len(spec.models))}
    names = {m.name: i for i, m in enumerate(spec.models)}
    counts = np.array([spec.cluster.gpus[t] for t in spec.cluster.gpu_types], int)
    for rnd in range(1, MAX_ROUNDS + 1):
        cands = _candidates(spec, infl)
        res, chosen = solve_colocated(cands, counts, tuple(m.weight for m in spec.models),
                                      opts.remaining(time.perf_counter() - t0))
        chosen = [ch for ch in chosen if ch.throughput_rps >= MIN_RPS]  # not the solver's tolerance residue
        if not chosen:
            raise InfeasibleError(f"the co-location MILP found no plan ({res.status}); raise --time-limit or add GPUs")
        per = [[] for _ in spec.models]
        for ch in chosen:
            per[ch.model].append(pipeline_plan(cands[ch.model], ch.candidate, ch.num_vgpus, spec.cluster.gpu_types))
        models = [ModelPipelines(m, tuple(sorted(p, key=lambda x: -x.throughput_rps)))
                  for m, p in zip(spec.models, per)]
        starved = [mp.model.name for mp in models if mp.throughput_rps <= 0]
        if starved:
            raise InfeasibleError(f"model {starved[0]} gets no pipeline co-located with the others; add GPUs")
        models = _with_slowdowns(_place(spec, models, aware), infl, aware)
        plan = _assemble(spec, models, res, time.perf_counter() - t0, aware, rnd, 1.0)
        slots = plan_slots(plan)
        check_gpu_memory(slots, spec.cluster)
        slow = slot_slowdowns(slots)
        worst = max(slow, default=1.0)
        if not aware:
            return _assemble(spec, models, res, time.perf_counter() - t0, aware, rnd, worst)
        raised = False
        for s, f in zip(slots, slow):
            key, mi = (s.gpu_id.rsplit("-", 1)[0], s.v), names[s.model]
            if f > infl[mi].get(key, 1.0) + TOLERANCE:
                infl[mi][key] = f
                raised = True
        if not raised:
            return _assemble(spec, models, res, time.perf_counter() - t0, aware, rnd, worst)
    raise InfeasibleError(f"co-located planning did not settle in {MAX_ROUNDS} rounds (interference kept growing); "
                          "lower vgpu_levels or plan dedicated placement")
