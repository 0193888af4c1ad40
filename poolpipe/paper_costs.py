"""The costs the live comparison plans with (poolpipe.paper_experiment): what the sidecar wrote at the points it
held, what `poolpipe calibrate` measures on a plan's own deployment, and how they read in its log."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from poolpipe_common.overheads import MeasuredLimit

if TYPE_CHECKING:
    from plans.plan_json import Plan
    from poolpipe_common.overheads import Overheads

# The loads the sustained plan's own deployment is calibrated at, as shares of its promise (`poolpipe calibrate`'s
# default): they span where a promise made from costs measured elsewhere was found to hold (0.62-1.0 of it on this
# host), so the way outside the sidecar's clock is measured at the rates the re-plan promises, not extrapolated
CALIBRATION_SHARES = (0.25, 0.5, 0.75, 1.0)
# Calibrations of a run: the plan made with the costs one measured may cut the model differently, keep a smaller
# deadline reserve than was served, or promise far more than was calibrated, and its costs are then extrapolated
# (Overheads.extrapolated_to, the plan's note); a user calibrates the plan they will serve, so that one is calibrated
# too. tf_efficientdet_d1 at 3x went from a plan whose calibration missed at its promise to another plan promising 786.6
# req/s that held 529 live; with three rounds, the third's limit sent the re-plan to a plan none had calibrated,
# promised 594.9 req/s, that held 326. Each round bounds the layout it measured, so the rounds end on a plan calibrated;
# after this many, on the calibrated plan measured to hold most (best_calibrated).
CALIBRATION_ROUNDS = 5


def held_costs(costs: list[tuple[float, Path]], target: float):
    """(Overheads, files): the costs the sidecar wrote at the points that held ``target`` (all if none did; None: none
    written), fitted as `poolpipe calibrate` fits them (loadtest.calibrate.fitted_costs). One point's moved with the
    host by up to 1.8x; an overloaded one's are the overload's. A point whose sidecar made no stage call (it shed
    every request) measured nothing: its file's zeros are left out."""
    from loadtest.calibrate import fitted_costs
    from poolpipe_common.cost_fit import not_overloaded

    written = [(a, p) for a, p in costs if p.exists() and _stage_calls(p) > 0]
    files = [p for _, p in not_overloaded(written, lambda ap: ap[0], target)]
    return (fitted_costs(files), files) if files else None


def _stage_calls(path: Path) -> int:
    """The stage calls an overheads file's costs were measured on (the sidecar writes them under "source")."""
    source = json.loads(path.read_text()).get("source")
    return int(source.get("stages", 0)) if isinstance(source, dict) else 0


def costs_text(ov) -> str:
    """How the costs a plan was made with read in the harness's log."""
    q = ov.front_quantiles_us
    front = (f", outside the sidecar (client-measured) median {ov.front_at(0.5) / 1e3:.1f} ms, p99 "
             f"{ov.front_at(0.99) / 1e3:.1f} ms at {ov.front_rate_rps:.0f} req/s + {ov.front_per_krps_us / 1e3:.1f} ms "
             "per 1000 req/s above"
             if q else "")
    return f", per-stage costs measured: lead {ov.lead_us:.0f} us, tail {ov.tail_us:.0f} us{front}"


def calibrated(deployment: Path, work: Path, duration_s: float, seed: int, log: Callable[[str], None],
               native_front: bool = False):
    """The costs `poolpipe calibrate` fits on ``deployment`` (its servers started here, stopped after) at
    CALIBRATION_SHARES of its plan's promise, written to ``work``/costs.json as `poolpipe calibrate --out` writes
    them (to plan or simulate with again)."""
    from loadtest.calibrate import Calibration, calibration_doc
    from runtime.launch import Deployment

    with Deployment(deployment, check_hardware=False, log_dir=work / "servers"):
        cal = Calibration(deployment, work, duration_s, seed, log, native_front=native_front)
        costs, steps = cal.run(CALIBRATION_SHARES)
    (work / "costs.json").write_text(json.dumps(calibration_doc(costs, steps, deployment, cal.reserve), indent=1)
                                     + "\n")
    return costs


def calibrate_and_replan(ex, work: Path, log: Callable[[str], None]) -> None:
    """Calibrate the sustained ppipe plan of ``ex`` (a PaperExperiment) on its own deployment and plan both again with
    what it measured; again where that plan's costs are extrapolated (another plan than those calibrated, other stage
    calls per request, or promises far beyond the rates calibrated: the plan's `costs extrapolated` note),
    CALIBRATION_ROUNDS in all."""
    run = ex.run
    limits: tuple[MeasuredLimit, ...] = ()
    layouts: tuple[str, ...] = ()
    tried: list[Plan] = []  # the plans calibrated, in order
    for n in range(CALIBRATION_ROUNDS):
        if not ex.ppipe.models[0].sustainable_rps:
            return
        tried.append(ex.ppipe)
        ex.deploy(ex.ppipe, "calibration")
        costs = calibrated(work / "calibration", work / f"calibration-steps-{n}", run.duration_s, run.seed, log,
                           run.native_front)
        # what an earlier round measured of its plan still holds (the re-plan may come back to it)
        limits, layouts = (*limits, *costs.measured_limits), (*layouts, *costs.calibrated_layouts)
        costs = replace(costs, measured_limits=limits, calibrated_layouts=layouts)
        ex.plan_sustained(costs)
        now, promise = ex.ppipe.stage_calls_per_request(), sum(ex.ppipe.capacity_rps().values())
        if not costs.extrapolated_to(promise, now, ex.ppipe.layout_key()):
            return
        k, best = best_calibrated(tried, costs)
        held = sum(best.capacity_rps().values())
        if held >= promise or n + 1 == CALIBRATION_ROUNDS:
            ex.ppipe = best
            made = (f"promises {promise:.1f} req/s, no more than" if held >= promise else
                    f"after {CALIBRATION_ROUNDS} calibrations promises {promise:.1f} req/s on costs extrapolated;")
            log(f"  the plan made with the costs calibrated {made} the plan calibrated in round {k + 1} was measured "
                f"to hold, {held:.1f} req/s: serving that one")
            return
        other = ", another plan" if costs.calibrated_on_another(ex.ppipe.layout_key()) else ""
        reserve = (f" with a {costs.front_us:g} us deadline reserve (calibrated with {costs.calibrated_front_us:g})"
                   if costs.reserve_unserved() else "")
        log(f"  the plan calibrated makes {costs.rate_calls_per_request:.2f} stage calls per request and served up "
            f"to {costs.calibrated_rps:.1f} req/s, the plan made with its costs {now:.2f}{other}, and promises "
            f"{promise:.1f}{reserve}: calibrating that one")


def best_calibrated(tried: list[Plan], costs: Overheads) -> tuple[int, Plan]:
    """(its index, the plan) of the plans calibrated, the one whose promise held to what the calibrations measured
    (within_limits: each measured its own plan) is highest, promising that: a plan no calibration served rests on
    costs measured on others (on tf_efficientdet_d1 at 3x five re-plans each went to such a plan; the last promised
    635.5 req/s and held 468)."""
    held = [costs.within_limits(p.layout_key(), p.capacity_rps()) for p in tried]
    k = max(range(len(tried)), key=lambda i: (sum(held[i].values()), i))
    return k, replace(tried[k], models=tuple(replace(m, sustainable_rps=held[k][m.name]) for m in tried[k].models))
