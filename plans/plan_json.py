"""plan.json: the planner's output that the generator, the sidecar and the simulator consume.

Contract fields: ``planner``, ``solver``, ``solve_seconds``, ``status`` (optimal: proven within the
relative gap; time_limit: the incumbent when the solver was stopped), ``objective`` (the incumbent's),
``bound`` (the best proven bound on the optimum, null without one), ``gap`` (relative), ``objective_kind``
(throughput, or cost with a ``cost`` object), ``models[]`` with ``name``, ``slo_us``,
``throughput_rps``, ``pipelines[]`` with ``throughput_rps``, ``latency_us`` and ``partitions[]`` with
``blocks`` ([first, end)), ``gpu``, ``vgpu_fraction`` ("1/V"), ``batch``, ``num_vgpus``,
``latency_us``, ``transfer_us`` (transfer time of one batch out of this partition to the next; 0 for
the last, as in the reference plans).
``request`` (optional) says how it was planned: the planner, objective, rates, prices, co-location, application
split, PARIS batch-size PDF, solver, time limit and gap (planner.request; absent in older plans: the defaults).
``models[].sustainable_rps`` is the rate the model sustains at >= 99 % SLO attainment under ``models[].arrivals``
(planner.sustained), beside the nominal ``throughput_rps``; ``sustained`` says what measured it and, as
``assumed_costs``, the per-stage costs the promise assumed (plans.plan_costs; absent in older plans).
The plan also records the spec it was solved for and embeds each model's profile, so later tools
need only the plan.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from plans.spec.planning_spec import ClusterSpec, cluster_from_dict
from poolpipe_common.documents import as_float, as_int, as_str, check_fields, need, read_document
from poolpipe_common.errors import InputError
from poolpipe_common.overheads import stage_calls_per_request
from profiling.profile import Profile, profile_from_dict

FORMAT = "poolpipe.plan/1"


@dataclass(frozen=True)
class PartitionPlan:
    blocks: tuple[int, int]  # [first, end)
    gpu: str
    v: int  # vGPU level: the GPU is split into v vGPUs (1 for an unequal size)
    batch: int
    num_vgpus: int
    latency_us: float
    transfer_us: float = 0.0  # transfer of one batch to the next partition (0 for the last)
    placement: tuple[str, ...] | None = None  # co-located plans: the physical GPU of each vGPU, e.g. "L4-0"
    slowdown: float = 1.0  # co-located plans: interference factor the planner applied to latency_us
    size: str | None = None  # an unequal vGPU size ("50%", "3g.20gb"; plans/spec/vgpu_sizes.py), None: 1/v
    share: float | None = None  # its compute share of the GPU

    @property
    def vgpu_fraction(self) -> str:
        return self.size if self.size is not None else f"1/{self.v}"

    @property
    def timing_device(self) -> str:
        """The profile device that times this partition (an unequal size is a device 'GPU@size' at level 1)."""
        return f"{self.gpu}@{self.size}" if self.size is not None else self.gpu

    @property
    def physical_gpus(self) -> float:
        return self.num_vgpus * self.share if self.share is not None else self.num_vgpus / self.v

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"blocks": list(self.blocks), "gpu": self.gpu}
        d.update({"vgpu_size": self.size, "vgpu_share": self.share} if self.size is not None
                 else {"vgpu_fraction": self.vgpu_fraction})
        d.update({"batch": self.batch, "num_vgpus": self.num_vgpus, "physical_gpus": self.physical_gpus,
                  "latency_us": self.latency_us, "transfer_us": self.transfer_us})
        if self.placement is not None:
            d.update(placement=list(self.placement), slowdown=self.slowdown)
        return d


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
    # the rate it sustains at >= 99 % SLO attainment under ``arrivals`` (planner.sustained); None: not measured
    sustainable_rps: float | None = None
    arrivals: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d = {"name": self.name, "slo_us": self.slo_us, "slo_margin_us": self.slo_margin_us,
             "batch_wait_us_per_request": self.batch_wait_us_per_request, "weight": self.weight,
             "throughput_rps": self.throughput_rps}
        if self.sustainable_rps is not None:
            d.update(sustainable_rps=self.sustainable_rps, arrivals=self.arrivals)
        return {**d, "pipelines": [p.to_dict() for p in self.pipelines], "profile": self.profile.to_dict()}


def nominal_objective(models: tuple[ModelPlan, ...]) -> float:
    """PPipe's objective over a plan's models: the throughput of one, else the smallest throughput / weight."""
    return models[0].throughput_rps if len(models) == 1 else min(m.throughput_rps / m.weight for m in models)


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
    # application DAGs as plan.json holds them (plain objects; `generate` checks them against the models' tensors)
    applications: tuple[dict[str, Any], ...] = ()
    colocation: dict[str, Any] | None = None  # co-located plans: how they were planned (planner.colocation.colocate)
    # unequal vGPU sizes: GPU type -> [{"vgpus": [size labels of one GPU], "gpus": how many GPUs split so}]
    gpu_splits: dict[str, list[dict[str, Any]]] | None = None
    # how it was planned (planner.request.PlanRequest.to_dict), so a re-planner plans the same way; None: not said
    request: dict[str, Any] | None = None
    # how the sustainable rates were found: the evaluator, and the candidates the sustained objective weighed
    sustained: dict[str, Any] | None = None
    # what the planner says of how it planned (PARIS's sizing, say): printed by `poolpipe plan`, not written
    notes: tuple[str, ...] = field(default=(), compare=False)

    def model(self, name: str) -> ModelPlan:
        for m in self.models:
            if m.name == name:
                return m
        raise KeyError(f"model {name!r} is not in the plan (has: {', '.join(m.name for m in self.models)})")

    def capacity_rps(self) -> dict[str, float]:
        """Per model, the rate to count on: what it sustains at >= 99 % where measured, else its nominal rate."""
        return {m.name: m.throughput_rps if m.sustainable_rps is None else m.sustainable_rps for m in self.models}

    def stage_calls_per_request(self) -> float:
        """The stage calls a request makes (the rate at which a sidecar's costs grow: Overheads.at_rate)."""
        return stage_calls_per_request((pl.throughput_rps, len(pl.partitions), pl.batch)
                                       for m in self.models for pl in m.pipelines)

    def layout_key(self) -> str:
        """What serving a plan depends on, as a short digest: each model's SLO and pipelines (each partition's
        blocks, GPU, vGPU size, batch, count and placement); its figures left out (a calibration's MeasuredLimit
        holds for any plan of the same layout, whatever costs it was planned with)."""
        layout = [(m.name, m.slo_us, [[(p.blocks, p.gpu, p.vgpu_fraction, p.batch, p.num_vgpus, p.placement)
                                       for p in pl.partitions] for pl in m.pipelines]) for m in self.models]
        return hashlib.sha256(repr(layout).encode()).hexdigest()[:16]

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
        if self.applications:
            d["applications"] = [dict(a) for a in self.applications]
        if self.colocation is not None:
            d["colocation"] = self.colocation
        if self.gpu_splits is not None:
            d["gpu_splits"] = self.gpu_splits
        if self.request is not None:
            d["request"] = self.request
        if self.sustained is not None:
            d["sustained"] = self.sustained
        return d

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n")


PLAN_FIELDS = ("format", "planner", "solver", "solve_seconds", "status", "objective_kind", "objective", "bound",
               "gap", "cluster", "spec", "physical_gpus_used", "models", "cost", "applications", "colocation",
               "gpu_splits", "request", "sustained")
MODEL_FIELDS = ("name", "slo_us", "slo_margin_us", "batch_wait_us_per_request", "weight", "throughput_rps",
                "sustainable_rps", "arrivals",
                "pipelines", "profile")
PIPELINE_FIELDS = ("throughput_rps", "latency_us", "batch", "partitions")
PARTITION_FIELDS = ("blocks", "gpu", "vgpu_fraction", "vgpu_size", "vgpu_share", "batch", "num_vgpus",
                    "physical_gpus", "latency_us", "transfer_us", "placement", "slowdown")
GPU_SPLIT_FIELDS = ("vgpus", "gpus")  # gpu_splits.TYPE[]: both required


def _fraction_level(s: Any, where: str) -> int:
    if not isinstance(s, str) or not s.startswith("1/") or not s[2:].isdigit() or int(s[2:]) < 1:
        raise InputError(f"{where}: vgpu_fraction must look like '1/V', got {s!r}")
    return int(s[2:])


def _list(x: Any, where: str) -> list:
    if not isinstance(x, list) or not x:
        raise InputError(f"{where}: expected a non-empty list, got {x!r}")
    return x


def _partition(p: Any, prof: Profile, prev_end: int, wk: str) -> PartitionPlan:
    check_fields(p, PARTITION_FIELDS, wk)
    blocks = need(p, "blocks", wk)
    if not isinstance(blocks, list) or len(blocks) != 2:
        raise InputError(f"{wk}.blocks: expected [first, end), got {blocks!r}")
    first, end = (as_int(x, f"{wk}.blocks") for x in blocks)
    if first != prev_end or not first < end <= prof.num_blocks:
        raise InputError(f"{wk}.blocks: [{first}, {end}) does not continue the pipeline at block "
                         f"{prev_end} within the model's {prof.num_blocks} blocks")
    gpu = as_str(need(p, "gpu", wk), f"{wk}.gpu")
    size, share = None, None
    if p.get("vgpu_size") is not None:
        size, v = as_str(p["vgpu_size"], f"{wk}.vgpu_size"), 1
        share = as_float(need(p, "vgpu_share", wk), f"{wk}.vgpu_share", 0)
        if not 0 < share <= 1:
            raise InputError(f"{wk}.vgpu_share: must be in (0, 1], got {share}")
        dev = f"{gpu}@{size}"
    else:
        v, dev = _fraction_level(need(p, "vgpu_fraction", wk), f"{wk}.vgpu_fraction"), gpu
    if dev not in prof.timings or v not in prof.timings[dev]:
        raise InputError(f"{wk}: {dev} at V={v} is not in the profile of {prof.model}")
    batch = as_int(need(p, "batch", wk), f"{wk}.batch", 1)
    if batch not in prof.batch_sizes(dev, v):
        raise InputError(f"{wk}.batch: {batch} is not profiled for {dev} at V={v}")
    n = as_int(need(p, "num_vgpus", wk), f"{wk}.num_vgpus", 1)
    placement = p.get("placement")
    if placement is not None and (not isinstance(placement, list) or len(placement) != n
                                  or not all(isinstance(g, str) and g.startswith(f"{gpu}-") for g in placement)):
        raise InputError(f"{wk}.placement: expected {n} physical GPU names like '{gpu}-0' (one per vGPU)")
    return PartitionPlan((first, end), gpu, v, batch, n, as_float(need(p, "latency_us", wk), f"{wk}.latency_us", 0),
                         as_float(p.get("transfer_us", 0.0), f"{wk}.transfer_us", 0),
                         None if placement is None else tuple(placement),
                         as_float(p.get("slowdown", 1.0), f"{wk}.slowdown", 1), size=size, share=share)


def _pipeline(pl: Any, prof: Profile, wp: str) -> PipelinePlan:
    check_fields(pl, PIPELINE_FIELDS, wp)
    parts: list[PartitionPlan] = []
    for k, p in enumerate(_list(need(pl, "partitions", wp), f"{wp}.partitions")):
        parts.append(_partition(p, prof, parts[-1].blocks[1] if parts else 0, f"{wp}.partitions[{k}]"))
    if parts[-1].blocks[1] != prof.num_blocks:
        raise InputError(f"{wp}: partitions end at block {parts[-1].blocks[1]}, the model has {prof.num_blocks}")
    return PipelinePlan(tuple(parts), as_float(need(pl, "throughput_rps", wp), f"{wp}.throughput_rps", 0),
                        as_float(need(pl, "latency_us", wp), f"{wp}.latency_us", 0))


def _model(m: Any, w: str) -> ModelPlan:
    check_fields(m, MODEL_FIELDS, w)
    prof = profile_from_dict(need(m, "profile", w), f"{w}.profile")
    pipes = [_pipeline(pl, prof, f"{w}.pipelines[{j}]")
             for j, pl in enumerate(_list(need(m, "pipelines", w), f"{w}.pipelines"))]
    return ModelPlan(as_str(need(m, "name", w), f"{w}.name"), as_float(need(m, "slo_us", w), f"{w}.slo_us", 0),
                     as_float(need(m, "throughput_rps", w), f"{w}.throughput_rps", 0), tuple(pipes), prof,
                     as_float(m.get("weight", 1.0), f"{w}.weight", 0),
                     as_float(m.get("slo_margin_us", 0.0), f"{w}.slo_margin_us", 0),
                     as_float(m.get("batch_wait_us_per_request", 0.0), f"{w}.batch_wait_us_per_request", 0),
                     None if m.get("sustainable_rps") is None
                     else as_float(m["sustainable_rps"], f"{w}.sustainable_rps", 0),
                     None if m.get("arrivals") is None else as_str(m["arrivals"], f"{w}.arrivals"))


def _optional_float(d: dict, key: str, where: str) -> float | None:
    """A number or null (not checked for finiteness: an unbounded solve records an infinite gap)."""
    x = d.get(key)
    if x is not None and (isinstance(x, bool) or not isinstance(x, (int, float))):
        raise InputError(f"{where}: {key}: expected a number or null, got {x!r}")
    return None if x is None else float(x)


def _applications(raw: Any, source: str) -> tuple[dict[str, Any], ...]:
    """The ``applications`` list as plain objects (their fields are checked where they are used)."""
    if raw is None:
        return ()
    if not isinstance(raw, list) or not all(isinstance(a, dict) for a in raw):
        raise InputError(f"{source}: applications: expected a list of objects, got {raw!r:.80}")
    return tuple(raw)


def plan_from_dict(d: Any, source: str = "plan") -> Plan:
    """Validate plan.json; every error names the offending field."""
    check_fields(d, PLAN_FIELDS, source)
    if d.get("format", FORMAT) != FORMAT:
        raise InputError(f"{source}: field 'format' is {d['format']!r}, expected {FORMAT!r}")
    cluster = cluster_from_dict(need(d, "cluster", source), f"{source}: cluster")
    models = [_model(m, f"{source}: models[{i}]") for i, m in enumerate(_list(need(d, "models", source),
                                                                              f"{source}: models"))]
    for key in ("spec", "cost", "colocation", "request", "sustained"):
        if d.get(key) is not None and not isinstance(d[key], dict):
            raise InputError(f"{source}: {key}: expected an object, got {d[key]!r}")
    return Plan(as_str(need(d, "planner", source), f"{source}: planner"),
                as_str(need(d, "solver", source), f"{source}: solver"),
                as_float(need(d, "solve_seconds", source), f"{source}: solve_seconds", 0, finite=False), cluster,
                tuple(models),
                d.get("spec") or {}, as_str(d.get("status", "optimal"), f"{source}: status"),
                _optional_float(d, "objective", source), _optional_float(d, "bound", source),
                _optional_float(d, "gap", source), as_str(d.get("objective_kind", "throughput"),
                                                          f"{source}: objective_kind"), d.get("cost"),
                _applications(d.get("applications"), source),
                d.get("colocation"), _gpu_splits(d.get("gpu_splits"), f"{source}: gpu_splits"), d.get("request"),
                d.get("sustained"))


def _gpu_splits(x: Any, where: str) -> dict[str, list[dict[str, Any]]] | None:
    """The plan's unequal GPU splits: type -> [{"vgpus": [labels], "gpus": count}] (None when absent)."""
    if x is None:
        return None
    ok = isinstance(x, dict) and all(
        isinstance(v, list) and all(isinstance(e, dict) and set(e) == set(GPU_SPLIT_FIELDS)
                                    and isinstance(e["vgpus"], list) and all(isinstance(lb, str) for lb in e["vgpus"])
                                    and isinstance(e["gpus"], int) and e["gpus"] >= 0 for e in v) for v in x.values())
    if not ok:
        raise InputError(f"{where}: expected GPU type -> list of {{vgpus: [size labels], gpus: count}}")
    return x


def load_plan(path: str | Path) -> Plan:
    return plan_from_dict(read_document(path, "plan"), str(path))
