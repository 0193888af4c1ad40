"""plan.json: the planner's output that the generator, the sidecar and the simulator consume.

Contract fields: ``planner``, ``solver``, ``solve_seconds``, ``status`` (optimal: proven within the
relative gap; time_limit: the incumbent when the solver was stopped), ``objective`` (the incumbent's),
``bound`` (the best proven bound on the optimum, null without one), ``gap`` (relative), ``objective_kind``
(throughput, or cost with a ``cost`` object), ``models[]`` with ``name``, ``slo_us``,
``throughput_rps``, ``pipelines[]`` with ``throughput_rps``, ``latency_us`` and ``partitions[]`` with
``blocks`` ([first, end)), ``gpu``, ``vgpu_fraction`` ("1/V"), ``batch``, ``num_vgpus``,
``latency_us``, ``transfer_us`` (transfer time of one batch out of this partition to the next; 0 for
the last, as in the reference plans).
The plan also records the spec it was solved for and embeds each model's profile, so later tools
need only the plan.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from planner.spec import ClusterSpec, cluster_from_dict
from poolpipe_common.documents import read_document
from poolpipe_common.errors import InputError
from profiling.profile import Profile, profile_from_dict

FORMAT = "poolpipe.plan/1"


@dataclass(frozen=True)
class PartitionPlan:
    blocks: tuple[int, int]  # [first, end)
    gpu: str
    v: int  # vGPU level: the GPU is split into v vGPUs
    batch: int
    num_vgpus: int
    latency_us: float
    transfer_us: float = 0.0  # transfer of one batch to the next partition (0 for the last)

    @property
    def vgpu_fraction(self) -> str:
        return f"1/{self.v}"

    @property
    def physical_gpus(self) -> float:
        return self.num_vgpus / self.v

    def to_dict(self) -> dict[str, Any]:
        return {"blocks": list(self.blocks), "gpu": self.gpu, "vgpu_fraction": self.vgpu_fraction,
                "batch": self.batch, "num_vgpus": self.num_vgpus, "physical_gpus": self.physical_gpus,
                "latency_us": self.latency_us, "transfer_us": self.transfer_us}


@dataclass(frozen=True)
class PipelinePlan:
    partitions: tuple[PartitionPlan, ...]
    throughput_rps: float
    latency_us: float

    @property
    def batch(self) -> int:
        return max(p.batch for p in self.partitions)

    def to_dict(self) -> dict[str, Any]:
        return {"throughput_rps": self.throughput_rps, "latency_us": self.latency_us, "batch": self.batch,
                "partitions": [p.to_dict() for p in self.partitions]}


@dataclass(frozen=True)
class ModelPlan:
    name: str
    slo_us: float
    throughput_rps: float
    pipelines: tuple[PipelinePlan, ...]
    profile: Profile
    weight: float = 1.0
    slo_margin_us: float = 0.0
    batch_wait_us_per_request: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "slo_us": self.slo_us, "slo_margin_us": self.slo_margin_us,
                "batch_wait_us_per_request": self.batch_wait_us_per_request, "weight": self.weight,
                "throughput_rps": self.throughput_rps,
                "pipelines": [p.to_dict() for p in self.pipelines], "profile": self.profile.to_dict()}


@dataclass(frozen=True)
class Plan:
    planner: str
    solver: str
    solve_seconds: float
    cluster: ClusterSpec
    models: tuple[ModelPlan, ...]
    spec: dict[str, Any] = field(default_factory=dict)  # the spec it was solved for (to_dict form)
    status: str = "optimal"
    objective: float | None = None
    bound: float | None = None  # proven bound on the objective's optimum (None: the planner has none)
    gap: float | None = None  # relative gap between objective and bound
    objective_kind: str = "throughput"  # throughput | cost
    cost: dict[str, Any] | None = None  # cost plans: rates, prices, GPUs used, cost per hour and per 1M requests

    def model(self, name: str) -> ModelPlan:
        for m in self.models:
            if m.name == name:
                return m
        raise KeyError(f"model {name!r} is not in the plan (has: {', '.join(m.name for m in self.models)})")

    def physical_gpus_used(self) -> dict[str, float]:
        used = {t: 0.0 for t in self.cluster.gpus}
        for m in self.models:
            for pl in m.pipelines:
                for p in pl.partitions:
                    used[p.gpu] = used.get(p.gpu, 0.0) + p.physical_gpus
        return used

    def to_dict(self) -> dict[str, Any]:
        d = {"format": FORMAT, "planner": self.planner, "solver": self.solver,
             "solve_seconds": self.solve_seconds, "status": self.status, "objective_kind": self.objective_kind,
             "objective": self.objective, "bound": self.bound, "gap": self.gap,
             "cluster": self.cluster.to_dict(), "spec": self.spec,
             "physical_gpus_used": self.physical_gpus_used(),
             "models": [m.to_dict() for m in self.models]}
        if self.cost is not None:
            d["cost"] = self.cost
        return d

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n")


def _fraction_level(s: Any, where: str) -> int:
    if not isinstance(s, str) or not s.startswith("1/") or not s[2:].isdigit() or int(s[2:]) < 1:
        raise InputError(f"{where}: vgpu_fraction must look like '1/V', got {s!r}")
    return int(s[2:])


def _field(d: Any, key: str, where: str) -> Any:
    if not isinstance(d, dict) or key not in d:
        raise InputError(f"{where}: missing field '{key}'")
    return d[key]


def plan_from_dict(d: Any, source: str = "plan") -> Plan:
    """Validate plan.json; every error names the offending field."""
    cluster = cluster_from_dict(_field(d, "cluster", source), f"{source}: cluster")
    models = []
    raw_models = _field(d, "models", source)
    if not isinstance(raw_models, list) or not raw_models:
        raise InputError(f"{source}: 'models' must be a non-empty list")
    for i, m in enumerate(raw_models):
        w = f"{source}: models[{i}]"
        prof = profile_from_dict(_field(m, "profile", w), f"{w}.profile")
        pipes = []
        for j, pl in enumerate(_field(m, "pipelines", w)):
            wp = f"{w}.pipelines[{j}]"
            parts = []
            prev_end = 0
            for k, p in enumerate(_field(pl, "partitions", wp)):
                wk = f"{wp}.partitions[{k}]"
                first, end = (int(x) for x in _field(p, "blocks", wk))
                if first != prev_end or not first < end <= prof.num_blocks:
                    raise InputError(f"{wk}.blocks: [{first}, {end}) does not continue the pipeline at block "
                                     f"{prev_end} within the model's {prof.num_blocks} blocks")
                prev_end = end
                gpu = _field(p, "gpu", wk)
                v = _fraction_level(_field(p, "vgpu_fraction", wk), f"{wk}.vgpu_fraction")
                if gpu not in prof.timings or v not in prof.timings[gpu]:
                    raise InputError(f"{wk}: {gpu} at V={v} is not in the profile of {prof.model}")
                batch = int(_field(p, "batch", wk))
                if batch not in prof.batch_sizes(gpu, v):
                    raise InputError(f"{wk}.batch: {batch} is not profiled for {gpu} at V={v}")
                n = int(_field(p, "num_vgpus", wk))
                if n < 1:
                    raise InputError(f"{wk}.num_vgpus: must be >= 1")
                parts.append(PartitionPlan((first, end), gpu, v, batch, n, float(_field(p, "latency_us", wk)),
                                           float(p.get("transfer_us", 0.0))))
            if prev_end != prof.num_blocks:
                raise InputError(f"{wp}: partitions end at block {prev_end}, the model has {prof.num_blocks}")
            pipes.append(PipelinePlan(tuple(parts), float(_field(pl, "throughput_rps", wp)),
                                      float(_field(pl, "latency_us", wp))))
        models.append(ModelPlan(str(_field(m, "name", w)), float(_field(m, "slo_us", w)),
                                float(_field(m, "throughput_rps", w)), tuple(pipes), prof,
                                float(m.get("weight", 1.0)), float(m.get("slo_margin_us", 0.0)),
                                float(m.get("batch_wait_us_per_request", 0.0))))
    return Plan(str(_field(d, "planner", source)), str(_field(d, "solver", source)),
                float(_field(d, "solve_seconds", source)), cluster, tuple(models), d.get("spec", {}),
                d.get("status", "optimal"), d.get("objective"), d.get("bound"), d.get("gap"),
                d.get("objective_kind", "throughput"), d.get("cost"))


def load_plan(path: str | Path) -> Plan:
    return plan_from_dict(read_document(path, "plan"), str(path))
