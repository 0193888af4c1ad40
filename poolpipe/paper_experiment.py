"""The paper's comparison, live, on an emulated L4 + T4 cluster built from PPipe's measured profiles.

One model per run: plans of a small L4:T4 = 1:3 cluster, served on emulated devices (real tritonservers that hold
each batch for its profiled latency, costing no CPU; hops between hosts are reserved for their profiled bytes over
the planned links, as the planner counts them), measured with open-loop arrivals: (a0) the fixed-margin plan
(PPipe's nominal objective with 30 % of the SLO kept free: the old default), (a) the ppipe plan for the rate it
sustains (the default objective), planned as a user would: with the costs a0's serving measured (the sidecar's
per-stage costs where a0 held, the way outside its clock as the client measured it; where a0 answers nothing, the
same measured on the np plan made with the default costs), then calibrated on its own deployment
(poolpipe.paper_costs.calibrate_and_replan, as `poolpipe calibrate`) and planned again with what that measured, once
more where that plan cuts the model otherwise; (b) the np plan planned with those costs, each through the sidecar
(np measured once with (a) where it chose (a)'s plan); (c) Triton-native: the np plan's whole-model servers behind
Triton's dynamic batcher, requests spread round-robin; and (d) the simulator's prediction of (a), given the
overheads the sidecar measured and the way outside its clock the client measured. Per system: the largest load
factor (steps of poolpipe.load_search.STEP; 1.0 = the fixed-margin plan's nominal rate, so rows compare absolute
rates) with >= 99 % SLO attainment.
Used by benchmarks/live_paper.py and `poolpipe demo`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from poolpipe.load_search import TARGET, measure_grid, rechecked, search_max_lf
from poolpipe.paper_costs import calibrate_and_replan, costs_text, held_costs

# What a 2-core machine drives through one sidecar and its emulated servers with little jitter (measured:
# ~50 req/s keeps per-stage lead and tail near their idle values; at ~80 req/s lateness grows).
MAX_LIVE_RPS = 50.0
MIN_TIME_SCALE = 8.0


@dataclass(frozen=True)
class PaperRun:
    model: str
    slo_factor: float = 3.0  # SLO = this x the model's batch-1 latency on a whole L4
    l4: int = 2
    t4: int = 6
    tensor_scale: float = 0.01  # bytes of the emulated tensors (the sidecar reserves links for the profiled bytes)
    trace: str = "poisson"
    duration_s: float = 5.0  # per load point
    seed: int = 0
    max_lf: float = 1.6
    # Slow motion: every latency and the SLO x this, rates / this (plans.spec.planning_spec.time_dilated), so the
    # fixed per-request CPU costs of a 2-core machine weigh on the emulated GPU cluster as little as on a real one.
    time_scale: float = 1.0  # 0 = auto: at least MIN_TIME_SCALE, and the ppipe plan at most MAX_LIVE_RPS
    grid: tuple[float, ...] = ()  # measure at these load factors (a curve) instead of searching the max
    # Share of the SLO the fixed-margin plan (a0, the old default) keeps free for queueing; the sustained plans
    # choose their own margin.
    slo_margin: float = 0.3
    # Plan the sustained plans with the costs measured serving (run_all says how); False: the default costs.
    measured_overheads: bool = True
    native_front: bool = False  # clients (calibration's too) go through serve --native-grpc-port, not grpc.aio


@dataclass
class SystemResult:
    name: str
    max_lf: float
    points: dict[float, float] = field(default_factory=dict)  # load factor -> attainment
    notes: dict[str, float] = field(default_factory=dict)
    same_as: str = ""  # measured once as this system, their plans being the same (PaperExperiment.measured_once)


def paper_spec(run: PaperRun, slo_margin: float | None = None):
    """The model's planning terms from its PPipe reference entry (ablation suite, L4+T4), on the small
    cluster, with SLO = slo_factor x batch-1 latency on L4 and the SLO margin (default: the run's), in the run's
    time scale."""
    from planner.ppipe.reference_plans import load_reference_plans, spec_from_reference
    from plans.spec.planning_spec import ClusterSpec, check_spec, time_dilated
    from poolpipe_common.errors import InputError

    entry = next((e for e in load_reference_plans() if e["suite"] == "ablation" and len(e["models"]) == 1
                  and e["models"][0]["model"] == run.model and tuple(e["cluster"]["gpu_name_arr"]) == ("L4", "T4")),
                 None)
    if entry is None:
        raise InputError(f"no L4+T4 ablation reference entry for model {run.model!r} in data/ppipe")
    spec = spec_from_reference(entry)
    c = spec.cluster
    small = ClusterSpec({"L4": run.l4, "T4": run.t4}, c.gpus_per_server, c.bandwidth_gbps, c.vgpu_levels)
    ms = spec.models[0]
    prof = ms.profile
    slo = run.slo_factor * prof.latency_us("L4", 1, 1, 0, len(prof.blocks))
    margin = run.slo_margin if slo_margin is None else slo_margin
    ms = dataclasses.replace(ms, slo_us=slo, slo_margin_us=margin * slo)
    spec = dataclasses.replace(spec, cluster=small, models=(ms,))
    return check_spec(time_dilated(spec, run.time_scale))


def cluster_doc(run: PaperRun, bandwidth_gbps: float) -> dict:
    """Two emulated machines on loopback: the L4s at 127.0.0.1 and the T4s at 127.0.0.2 (hops between them go
    over gRPC, hops within one through shared memory), with the planned cluster's NIC bandwidth (slow motion
    divides it), for which the sidecar reserves each hop's link."""
    return {"hosts": [
        {"name": "l4", "address": "127.0.0.1", "gpu_type": "L4", "gpus": run.l4, "bandwidth_gbps": bandwidth_gbps,
         "device": "emulated", "base_port": 0},
        {"name": "t4", "address": "127.0.0.2", "gpu_type": "T4", "gpus": run.t4, "bandwidth_gbps": bandwidth_gbps,
         "device": "emulated", "base_port": 0}]}


class PaperExperiment:
    """Plans, deployments and measurements of one PaperRun under ``work``."""

    def __init__(self, run: PaperRun, work: Path, log: Callable[[str], None] = print) -> None:
        self.run = run
        self.work = work
        self.log = log
        self.manifests: dict = {}  # sidecar system -> its manifest, for the prediction
        self.records: list[dict] = []  # one per measured (system, load factor): what the client saw
        # per measured sidecar point (system, load factor, attainment): the way outside the sidecar's clock, per
        # answer, as the client saw it
        self.fronts: list[tuple[str, float, float, list[float]]] = []
        work.mkdir(parents=True, exist_ok=True)

    def search(self, attainment_at: Callable[[float], float], start: float = 0.7, live: bool = True
               ) -> tuple[float, dict[float, float]]:
        """The largest passing load factor (or the run's grid); live points near the target are re-checked."""
        if live:
            attainment_at = rechecked(attainment_at)
        if self.run.grid:
            return measure_grid(attainment_at, self.run.grid)
        return search_max_lf(attainment_at, self.run.max_lf, start=start)

    def plans(self, overheads=None) -> None:
        """Every plan: the fixed-margin one, then the sustained ppipe and np plans (``overheads``: the per-stage
        costs they are planned with, an Overheads; None: the default)."""
        self.plan_fixed()
        self.plan_sustained(overheads)

    def plan_fixed(self) -> None:
        """(a0) PPipe's nominal objective with the run's fixed margin: the old default, and load factor 1.0."""
        from planner.entry import plan
        from planner.request import PlanRequest

        if self.run.time_scale <= 0:
            self.run = dataclasses.replace(self.run, time_scale=self.auto_time_scale())
        spec = paper_spec(self.run)
        self.fixed = plan(spec, PlanRequest("ppipe", objective="throughput", time_limit_s=60, verify=True)).plan
        self.rate = self.fixed.models[0].throughput_rps
        self.slo_ms = spec.models[0].slo_us / 1e3
        slow = f" (time x{self.run.time_scale:g}: latencies and SLO x{self.run.time_scale:g}, rates /" \
               f"{self.run.time_scale:g})" if self.run.time_scale != 1 else ""
        self.log(f"{self.run.model}: SLO {self.slo_ms:.1f} ms on emulated {self.run.l4} L4 + {self.run.t4} T4{slow}; "
                 f"fixed-margin plan ({self.run.slo_margin:g} of the SLO): nominal {self.rate:.1f} req/s "
                 f"(= load factor 1.0)")

    def plan_sustained(self, overheads=None) -> None:
        """(a) and (b): ppipe and np planned for the rate they sustain under the run's trace."""
        from planner.entry import plan
        from planner.request import PlanRequest

        spec = paper_spec(self.run, slo_margin=0.0)
        ask = {"time_limit_s": 60, "arrivals": planner_arrivals(self.run.trace), "overheads": overheads}
        self.ppipe = plan(spec, PlanRequest("ppipe", **ask)).plan
        self.np_plan = plan(spec, PlanRequest("np", **ask)).plan
        for name, p in (("ppipe", self.ppipe), ("np", self.np_plan)):
            m = p.models[0]
            self.log(f"  sustained {name} plan: sustains {m.sustainable_rps:.1f} req/s ({m.arrivals}; nominal "
                     f"{m.throughput_rps:.1f})" + (costs_text(overheads) if overheads else ""))

    def promise_lf(self, plan) -> float:
        """The load factor of a plan's sustainable rate (where the search starts)."""
        m = plan.models[0]
        return (m.sustainable_rps or 0.7 * self.rate) / self.rate

    def auto_time_scale(self) -> float:
        """The smallest whole time scale >= MIN_TIME_SCALE at which the fixed-margin plan needs <= MAX_LIVE_RPS."""
        from planner.entry import plan
        from planner.request import PlanRequest

        rate = plan(paper_spec(dataclasses.replace(self.run, time_scale=1.0)),
                    PlanRequest("ppipe", objective="throughput", evaluator="none", time_limit_s=60)
                    ).plan.models[0].throughput_rps
        return float(max(MIN_TIME_SCALE, math.ceil(rate / MAX_LIVE_RPS)))

    def _record(self, system: str, lf: float, r) -> float:
        """Keep and log one measured point (an open_loop RunResult); returns its attainment."""
        self.records.append({"system": system, "load_factor": lf, "offered_rps": lf * self.rate,
                             "attainment": r.attainment, "offered": r.offered, "late": r.late, "errors": r.errors,
                             "p50_ms": r.latency_ms(50), "p99_ms": r.latency_ms(99), "first_error": r.first_error,
                             "host_busy_cores": r.host_busy_cores})
        front = (f"  outside the sidecar p50/p99 {np.percentile(r.front_us, 50) / 1e3:.1f}/"
                 f"{np.percentile(r.front_us, 99) / 1e3:.1f} ms" if r.front_us else "")
        host = f"  host busy {r.host_busy_cores:.2f} cores" if r.host_busy_cores is not None else ""
        self.log(f"  {system:13s} lf {lf:<6.4g} ({lf * self.rate:5.1f} req/s): attainment {100 * r.attainment:6.2f} % "
                 f"p50 {r.latency_ms(50) or 0:6.1f} ms  p99 {r.latency_ms(99) or 0:6.1f} ms  shed {r.errors}  "
                 f"late {r.late}{front}{host}")
        if r.front_us:
            self.fronts.append((system, lf, r.attainment, list(r.front_us)))
        return r.attainment

    def measured_costs(self, system: str):
        """overheads_of(system) where its sidecar measured stage calls and the client answers; else None."""
        if not (self.work / f"{system}-overheads.json").exists() or not any(f[0] == system for f in self.fronts):
            return None
        return self.overheads_of(system)

    def overheads_of(self, system: str):
        """The per-stage costs the sidecar of ``system`` wrote (none measured where it wrote none), with the way
        outside its clock fitted (poolpipe_common.cost_fit.fit_front) to what the client measured at every point
        that was not overloaded, each at the rate it offered, as `poolpipe calibrate` fits it."""
        from poolpipe_common.cost_fit import fit_front, not_overloaded
        from poolpipe_common.overheads import Overheads, read_overheads

        path = self.work / f"{system}-overheads.json"
        ov = read_overheads(path) if path.exists() else Overheads()
        runs = not_overloaded([f for f in self.fronts if f[0] == system], lambda f: f[2])
        fitted = fit_front(ov, [(0.0, us) for _, _, _, xs in runs for us in xs],
                           [lf * self.rate for _, lf, _, xs in runs for _ in xs])
        return dataclasses.replace(fitted, rate_calls_per_request=self.manifests[system].plan.stage_calls_per_request())

    def deploy(self, plan, name: str):
        from model_repository_gen.generate import generate

        out = self.work / name
        if out.exists():
            shutil.rmtree(out)
        (self.work / "cluster.json").write_text(json.dumps(cluster_doc(self.run, plan.cluster.bandwidth_gbps)))
        return generate(plan, {}, self.work / "cluster.json", out, emulated_tensor_scale=self.run.tensor_scale)

    def arrivals(self, lf: float) -> np.ndarray:
        from workloads.arrivals import arrival_times

        return arrival_times(self.run.trace, lf * self.rate, self.run.duration_s, self.run.seed)

    def measure_sidecar(self, name: str, plan) -> SystemResult:
        """The plan through `poolpipe serve` (a fresh sidecar per point, so no point inherits a margin)."""
        from loadtest.open_loop import open_loop
        from runtime.launch import Deployment
        from runtime.sidecar_process import SidecarProcess

        manifest = self.deploy(plan, name)
        deploy = self.work / name
        costs = []  # (attainment, the point's overheads file)
        model = manifest.models[0].name
        with Deployment(deploy, check_hardware=False, log_dir=self.work / f"{name}-logs"):
            def at(lf: float) -> float:
                point = self.work / f"{name}-overheads" / f"{len(self.records):03d}-lf{lf:.4f}.json"
                point.parent.mkdir(exist_ok=True)
                sc = SidecarProcess(manifest=deploy, log_path=self.work / f"{name}-sidecar.log", extra_args=(
                    "--overheads-out", str(point), *self.sidecar_args()), native_front=self.run.native_front).start()
                try:
                    _wait_ready(sc.infer_url, model)
                    open_loop([sc.infer_url], model, self.arrivals(0.2)[:50], self.slo_ms)  # warm-up
                    r = open_loop([sc.infer_url], model, self.arrivals(lf), self.slo_ms)
                finally:
                    sc.stop()
                costs.append((r.attainment, point))
                return self._record(name, lf, r)
            best, points = self.search(at, self.promise_lf(plan))
        held = held_costs(costs, TARGET)
        if held is not None:  # what plans made from this system's serving use (--work keeps it)
            (self.work / f"{name}-overheads.json").write_text(json.dumps({**held[0].to_dict(), "source": {
                "median_of": [p.name for p in held[1]]}}, indent=1))
        self.manifests[name] = manifest
        return SystemResult(name, best, points)

    def sidecar_args(self) -> tuple[str, ...]:
        """More `poolpipe serve` flags for the next point's sidecar (none: as a user serves the plan)."""
        return ()

    def same_plan(self) -> bool:
        """Whether np planned the same way chose the ppipe plan's layout: the same deployment (Plan.layout_key)."""
        return self.np_plan.layout_key() == self.ppipe.layout_key()

    def measured_once(self, name: str, first: SystemResult) -> SystemResult:
        """``name``'s result as ``first``'s, its plan being the same: measuring one deployment twice measures the
        host's noise (repvgg-b3 at 2.5x: one whole-model plan held 282.0 req/s as (a) and 299.6 as (b))."""
        self.log(f"  {name} plan: the layout of the {first.name} plan ({self.np_plan.layout_key()}): measured once")
        self.manifests[name] = self.manifests[first.name]
        return dataclasses.replace(first, name=name, same_as=first.name)

    def measure_triton_native(self) -> SystemResult:
        """The np plan's whole-model servers with Triton's dynamic batcher, clients round-robin over them."""
        from ensembles.dynamic_batching import enable_dynamic_batching, whole_model_endpoints
        from loadtest.open_loop import open_loop
        from runtime.launch import Deployment

        manifest = self.deploy(self.np_plan, "triton-native")
        deploy = self.work / "triton-native"
        enable_dynamic_batching(deploy, manifest)
        urls = whole_model_endpoints(manifest, manifest.models[0].name)
        triton_model = manifest.models[0].pipelines[0].stages[0].triton_model
        with Deployment(deploy, check_hardware=False, log_dir=self.work / "triton-native-logs"):
            open_loop(urls, triton_model, self.arrivals(0.2)[:50], self.slo_ms)  # warm-up

            def at(lf: float) -> float:
                r = open_loop(urls, triton_model, self.arrivals(lf), self.slo_ms)
                return self._record("triton-native", lf, r)
            best, points = self.search(at, 0.5 * self.promise_lf(self.np_plan))
        return SystemResult("triton-native", best, points)

    def predict(self, name: str) -> SystemResult:
        """The simulator's prediction for a sidecar system: its topology, the live driver, its costs (overheads_of)."""
        from scheduler.core import make_scheduler
        from scheduler.core.topology import slowed_as_measured, with_stage_overhead
        from scheduler.server.planned.manifest_topology import topology_from_manifest
        from scheduler.sim.engine import simulate
        from scheduler.sim.sweep import driver_config

        measured = self.overheads_of(name)  # the compute slowed in the topology, as scheduler.sim.sweep.run_point
        topo, ov = slowed_as_measured(with_stage_overhead(topology_from_manifest(self.manifests[name]),
                                                          measured.tail_us), measured)
        model = self.manifests[name].models[0].name

        def at(lf: float) -> float:
            arr = [(float(t) * 1e6, model) for t in self.arrivals(lf)]
            res = simulate(topo, make_scheduler("ppipe", topo), arr, self.run.duration_s * 1e6, seed=self.run.seed,
                           driver=driver_config("live", ov), overheads=ov)
            att = res.models[model].attainment
            self.records.append({"system": f"sim-{name}", "load_factor": lf, "offered_rps": lf * self.rate,
                                 "attainment": att})
            return att
        best, points = self.search(at, self.promise_lf(self.ppipe if name == "ppipe" else self.np_plan), live=False)
        return SystemResult(f"simulated {name}", best, points,
                            {"lead_us": ov.lead_us, "tail_us": ov.tail_us, "slowdown": measured.slowdown})


class FixedPoints(PaperExperiment):
    """A PaperExperiment whose load search measures ``sequence``'s load factors in order instead, repeats included
    (each point's result is in ``records``): live_point_noise and live_reserve repeat one point to see what moves it."""

    sequence: tuple[float, ...] = ()

    def search(self, attainment_at: Callable[[float], float], start: float = 0.7, live: bool = True
               ) -> tuple[float, dict[float, float]]:
        for lf in self.sequence:
            attainment_at(lf)
        return 0.0, {}


def planner_arrivals(trace: str) -> str:
    """The planner's --arrivals for a --trace (bursty's gamma CV, the trace's default where it names none, and
    replays carry over; other traces: poisson)."""
    from workloads.arrivals import TraceSpec

    kind, _, cv = trace.partition(":")
    if kind == "bursty":
        return f"bursty:{cv or f'{TraceSpec.cv:g}'}"
    return trace if kind in ("poisson", "replay") else "poisson"


def _wait_ready(url: str, model: str, timeout_s: float = 30.0) -> None:
    import tritonclient.grpc as grpcclient

    c = grpcclient.InferenceServerClient(url)
    deadline = time.monotonic() + timeout_s
    while not c.is_model_ready(model):
        if time.monotonic() > deadline:
            raise TimeoutError(f"sidecar at {url}: model {model} not ready after {timeout_s:.0f} s")
        time.sleep(0.1)


def run_all(run: PaperRun, work: Path, log: Callable[[str], None] = print) -> dict:
    """Every system of the comparison for one model and trace (SystemResults by name), the load factor 1.0's
    rate (``rate``) and the sustained ppipe plan's promise (``promise``, req/s)."""
    ex = PaperExperiment(run, work, log)
    ex.plan_fixed()
    out = {"fixed": ex.measure_sidecar("fixed", ex.fixed)}
    costs = ex.measured_costs("fixed") if run.measured_overheads else None
    ex.plan_sustained(costs)
    if run.measured_overheads and (costs is None or not ex.ppipe.models[0].sustainable_rps):
        # a0 answered nothing, or what it measured leaves no plan in time: as a user would, serve the np plan made
        # with the default costs and take the costs it measured (not a row of the table)
        log("  a0's costs give no plan to calibrate: measuring the costs on the np plan made with the defaults")
        if costs is not None:  # the plans above are a0's
            ex.plan_sustained(None)
        ex.measure_sidecar("np-default-costs", ex.np_plan)
        ex.plan_sustained(ex.measured_costs("np-default-costs"))
    if run.measured_overheads:  # as a user would: calibrate the plan, plan again
        calibrate_and_replan(ex, work, log)
    out["ppipe"] = ex.measure_sidecar("ppipe", ex.ppipe)
    out["np"] = ex.measured_once("np", out["ppipe"]) if ex.same_plan() else ex.measure_sidecar("np", ex.np_plan)
    out["triton-native"] = ex.measure_triton_native()
    out["sim-ppipe"] = ex.predict("ppipe")
    return {**out, "rate": ex.rate, "promise": ex.ppipe.models[0].sustainable_rps}
