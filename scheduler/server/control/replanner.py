"""``serve --replan FILE``: automatic re-planning. The sidecar counts each planned model's arrivals; the core's
``ReplanTrigger`` decides when the smoothed mix has left the plan's headroom, or when the per-stage costs the
sidecar measures now leave the plan less than the arrivals need (the promise check's implied rates,
scheduler.server.planned.promise_check: a re-plan of kind ``costs``, planned with the costs measured now). Then a
worker process (never the event loop) plans the spec for the measured mix with ``planner.plan``, as the serving plan
was planned (its plan.json ``request``: applications, PARIS sizing, the cost objective and co-location stay) but with
the per-stage costs the sidecar measured serving it (``OverheadMeter.measured_costs``, the run's; for a re-plan of kind
costs, those of the last windows the promise check measured: a promise made with what this host's stage calls cost
now, not what the first plan assumed), and generates a deployment into ``out_dir/gen-N`` beside the running one
(generate's ``previous``); the sidecar migrates the
servers (runtime.migration, in a thread: the servers both plans have stay and get the new partitions loaded, the
others are started), reloads onto it (scheduler.server.control.reload), then unloads the old partitions and stops the
servers only the old plan had. Servers it did not start (the first plan's) are never stopped: their partitions are
unloaded and the log names them for the operator. Metrics and logs say when and why it re-planned and what the
migration cost.

The settings file (YAML or JSON; paths relative to it)::

    spec: spec.yaml          # the planning spec; its models' weights become the measured rates
    cluster: cluster.yaml    # hosts for 'generate'
    out_dir: replans         # each re-plan generates into out_dir/gen-N
    onnx: {resnet: resnet.onnx}   # models to cut (emulated hosts need none)
    emulated_tensor_scale: 1.0
    planner: ppipe           # planner, solver, time_limit_s: default as the serving plan was planned
    solver: highs
    time_limit_s: 60
    window_s: 5              # the trigger: see scheduler.core.replan_trigger.ReplanConfig
    smoothing: 0.5
    high: 0.9
    mix_tolerance: 0.1
    cost_tolerance: 0.05
    cooldown_s: 120
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from poolpipe_common.documents import as_float, check_fields, read_document
from poolpipe_common.errors import InputError
from runtime.launch import Deployment
from runtime.migration import begin_migration
from runtime.supervise import remove_state, write_state
from scheduler.core.replan_trigger import ReplanConfig, ReplanDecision, ReplanTrigger
from scheduler.server.common.child_processes import child_pool
from scheduler.server.common.metrics import SidecarMetrics
from scheduler.server.control.reload import PlanSwitch
from scheduler.server.planned.calls import now_us

log = logging.getLogger("poolpipe.sidecar.replan")

FIELDS = ("spec", "cluster", "out_dir", "onnx", "emulated_tensor_scale", "planner", "solver", "time_limit_s",
          "window_s", "smoothing", "high", "mix_tolerance", "cost_tolerance", "cooldown_s")


@dataclass(frozen=True)
class ReplanJob:
    """What the worker process plans and generates (picklable)."""

    spec: Path
    cluster: Path
    out: Path
    rates_rps: dict[str, float]
    onnx: dict[str, Path] = field(default_factory=dict)
    emulated_tensor_scale: float = 1.0
    request: dict[str, Any] = field(default_factory=dict)  # PlanRequest fields the settings give (planner, ...)
    previous: Path | None = None  # the deployment serving now
    # the per-stage costs the sidecar measured serving it (Overheads fields; the way outside its clock stays the
    # plan's): the re-plan's promises are made with them, not with what the serving plan assumed; empty: as planned
    measured_costs: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class ReplanSettings:
    job: ReplanJob  # rates_rps and out filled in per re-plan
    out_dir: Path
    trigger: ReplanConfig


def load_settings(path: Path) -> ReplanSettings:
    """The --replan file, checked now (one-line InputErrors that name the field)."""
    where = f"--replan {path}"
    d = check_fields(read_document(path, "replan settings", yaml_ok=True), FIELDS, where)
    base = Path(path).resolve().parent
    missing = [k for k in ("spec", "cluster", "out_dir") if k not in d]
    if missing:
        raise InputError(f"{where}: missing field(s) {', '.join(missing)}")
    onnx = d.get("onnx") or {}
    if not isinstance(onnx, dict):
        raise InputError(f"{where}: onnx must map model names to ONNX files")
    nums = {k: as_float(d[k], f"{where}: {k}") for k in ("window_s", "smoothing", "high", "mix_tolerance",
                                                          "cost_tolerance", "cooldown_s") if k in d}
    try:
        trigger = ReplanConfig(**{"cooldown_s": 120.0, "window_s": 5.0, **nums})
    except ValueError as e:
        raise InputError(f"{where}: {e}") from None
    job = ReplanJob(base / str(d["spec"]), base / str(d["cluster"]), Path(), {},
                    {str(k): base / str(v) for k, v in onnx.items()},
                    as_float(d.get("emulated_tensor_scale", 1.0), f"{where}: emulated_tensor_scale"),
                    _request_fields(d, where))
    from plans.spec.planning_spec import load_spec  # noqa: PLC0415

    load_spec(job.spec)
    for p in (job.cluster, *job.onnx.values()):
        if not p.is_file():
            raise InputError(f"{where}: no such file {p}")
    return ReplanSettings(job, base / str(d["out_dir"]), trigger)


def _request_fields(d: dict[str, Any], where: str) -> dict[str, Any]:
    """The planner, solver and time limit the settings give, checked now as a PlanRequest would check them."""
    from planner.request import PlanRequest  # noqa: PLC0415

    given = {k: str(d[k]) for k in ("planner", "solver") if k in d}
    if "time_limit_s" in d:
        given["time_limit_s"] = as_float(d["time_limit_s"], f"{where}: time_limit_s")
    try:
        PlanRequest(**given)
    except InputError as e:
        raise InputError(f"{where}: {e}") from None
    return given


def plan_and_generate(job: ReplanJob) -> tuple[str, float, dict[str, float]]:
    """In the worker: the spec re-weighted by the measured rates, planned as the serving plan was (with the
    settings' planner, solver and time limit where given) and generated; (manifest, solve s, rates)."""
    from model_repository_gen.generate import generate  # noqa: PLC0415
    from model_repository_gen.manifest import load_manifest  # noqa: PLC0415
    from planner.entry import plan, reweighted  # noqa: PLC0415
    from planner.request import PlanRequest, request_of  # noqa: PLC0415
    from plans.spec.planning_spec import load_spec  # noqa: PLC0415

    previous = load_manifest(job.previous) if job.previous else None
    # one process: the planner's workers would take cores from the sidecar serving beside it
    given = {**job.request, "jobs": 1}
    request = request_of(previous.plan, **given) if previous else PlanRequest(**given)
    if job.measured_costs:
        # measured at about the rate it re-plans for: a calibrated model's rate slopes stay, based at what was measured
        calls = previous.plan.stage_calls_per_request() if previous else 0.0  # of the plan they were measured on
        request = replace(request, overheads=request.costs().rebased(job.measured_costs, sum(job.rates_rps.values()),
                                                                     calls))
    new = plan(reweighted(load_spec(job.spec), job.rates_rps), request).plan
    generate(new, job.onnx, job.cluster, job.out, emulated_tensor_scale=job.emulated_tensor_scale,
             previous=previous)
    new.save(job.out / "plan.json")
    return str(job.out / "manifest.json"), new.solve_seconds, new.capacity_rps()


def planned_capacity(planned: PlanSwitch) -> dict[str, float]:
    """What the serving plan holds per model: its sustainable rate where the plan measured one, else nominal."""
    held = planned.current.manifest.plan.capacity_rps()
    return {m: held.get(m, sum(p.throughput_rps for p in info.pipelines))
            for m, info in planned.current.models.items()}


def implied_capacity(planned: PlanSwitch) -> dict[str, float]:
    """What the serving plan holds per model at the per-stage costs measured now: its capacity moved as its promise
    check moved the promise (empty until the check has measured costs)."""
    check, held = planned.current.promise, planned_capacity(planned)
    promised = check.promise.promised_rps
    return {m: held[m] * r / promised[m] for m, r in check.implied.items() if m in held and promised[m] > 0}


class AutoReplanner:
    """Watches the arrivals of the planned models and re-plans, generates, launches and reloads (module doc)."""

    def __init__(self, settings: ReplanSettings, planned: PlanSwitch, metrics: SidecarMetrics) -> None:
        self.settings = settings
        self.planned = planned
        self.metrics = metrics
        self.trigger = ReplanTrigger(settings.trigger, planned_capacity(planned), now_us())
        # after a predecessor's gen-N directories (a restarted sidecar generates beside them, never into them)
        self.generation = max((int(d.name[4:]) for d in settings.out_dir.glob("gen-*") if d.name[4:].isdigit()),
                              default=0)
        # the servers serving now; the first plan's were started by someone else, so this deployment owns none
        self.deployment = Deployment(planned.serving, check_hardware=False)
        self._pool = child_pool()
        self._task: asyncio.Task | None = None
        planned.on_arrival = lambda model: self.trigger.arrived(model, now_us())

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._watch())

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(max(0.0, (self.trigger.next_check_us() - now_us()) / 1e6) + 0.001)
            self.trigger.costs_imply(implied_capacity(self.planned))
            decision = self.trigger.check(now_us())
            if decision is not None:
                await self._replan(decision)

    async def _replan(self, d: ReplanDecision) -> None:
        self.generation += 1
        out = self.settings.out_dir / f"gen-{self.generation}"
        log.info("event=replan_decided generation=%d reason=%s rates=%s", self.generation, d.reason,
                 ",".join(f"{m}={r:.1f}" for m, r in d.rates_rps.items()))
        t0 = time.monotonic()
        migration = None
        try:
            meter, check = self.planned.current.meter, self.planned.current.promise
            # costs: what a stage call costs at the rate served now, as the promise check measured it
            recent = d.kind == "costs" and bool(check.costs)
            costs = check.costs if recent else meter.measured_costs()
            log.info("event=replan_costs generation=%d stage_calls=%d measured=%s %s", self.generation, meter.stages,
                     "recent" if recent else "run", " ".join(f"{k}={v:.6g}" for k, v in costs.items()) if costs else
                     "as_planned=1 (too few stage calls measured yet)")
            job = replace(self.settings.job, out=out, rates_rps=d.rates_rps, previous=self.deployment.directory,
                          measured_costs=costs)
            manifest, solve_s, rates = await asyncio.get_running_loop().run_in_executor(self._pool,
                                                                                        plan_and_generate, job)
            log.info("event=replan_planned generation=%d solve_s=%.2f throughputs=%s", self.generation, solve_s,
                     ",".join(f"{m}={r:.1f}" for m, r in rates.items()))
            migration = await asyncio.to_thread(begin_migration, self.deployment, out)
            write_state(self.deployment, "sidecar")  # the servers it started: a successor reclaims them
            report = await self.planned.reload(Path(manifest))
        except Exception as e:  # noqa: BLE001 - whatever failed, the old plan serves on: log it, cool down
            self.metrics.replans.labels("failed").inc()
            log.warning("event=replan_failed generation=%d reason=%s", self.generation, e)
            if migration is not None:
                await asyncio.to_thread(migration.abort)
                write_state(self.deployment, "sidecar")
            self.trigger.replanned(planned_capacity(self.planned), now_us())  # cool down before trying again
            return
        moved = await asyncio.to_thread(migration.finish)
        write_state(self.deployment, "sidecar")
        if moved.left_running:
            log.info("event=replan_unused_servers vgpus=%s (started before the sidecar; their partitions are "
                     "unloaded, stop them when you like)", ",".join(moved.left_running))
        self.trigger.replanned(planned_capacity(self.planned), now_us())
        self.metrics.replans.labels("replanned").inc()
        log.info("event=replanned generation=%d manifest=%s took_s=%.1f pause_ms=%.1f migration=%r", self.generation,
                 manifest, time.monotonic() - t0, report.pause_ms, moved.line())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._pool.shutdown(cancel_futures=True)
        await asyncio.to_thread(self.deployment.stop)  # the servers it started
        remove_state()

