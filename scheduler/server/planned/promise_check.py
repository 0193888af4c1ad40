"""The sidecar checks its plan's promise while it serves: every CHECK_INTERVAL_S, off the request path (the closed
form runs in a child process: 50 ms of it on the event loop made requests late).

The plan promised each model a rate (plan.json ``sustainable_rps``) made with the per-stage costs it assumed
(plans.plan_costs). Once the sidecar has measured enough stage calls, the check takes the costs of the last
RECENT_WINDOWS windows of them (what a stage call costs at the rate served now: on a loaded host it grows with the
rate), computes with the planner's closed form (planner.sustained.capacity.predicted_rps, under the arrivals the plan
assumed) the rate the plan sustains at those costs and at the assumed ones, and moves the promise by their ratio:
the implied rate, exported as ``poolpipe_sidecar_sustainable_rps`` beside ``poolpipe_sidecar_promised_rps``. The
ratio, not the closed form's own figure: the closed form ranks plans, the simulator measured the promise, and equal
costs must imply the promise exactly. A plan that records no promise is promised the closed form's rate.

When the implied rate is more than TOLERANCE below the promise and the rate served has reached APPROACH of it, one
warning says so and how to re-plan with the measured costs, once per episode (again only after the implied rate came
back within TOLERANCE). ``serve --replan`` re-plans by itself (scheduler.core.replan_trigger, kind ``costs``).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from model_repository_gen.manifest import Manifest
from planner.sustained.capacity import predicted_rps
from plans.arrivals import parse_arrivals
from plans.plan_costs import assumed_costs
from plans.plan_json import Plan
from poolpipe_common.overheads import DEFAULT_OVERHEADS, Overheads
from scheduler.server.common.child_processes import child_pool
from scheduler.server.common.metrics import SidecarMetrics
from scheduler.server.common.model_stats import ModelStats
from scheduler.server.planned.overhead_meter import OverheadMeter

log = logging.getLogger("poolpipe.sidecar.promise")

CHECK_INTERVAL_S = 5.0
# The costs now: the median of the last windows of stage calls (overhead_meter.WINDOW each: about a thousand calls)
RECENT_WINDOWS = 4
TOLERANCE = 0.05  # the implied rate may fall this share below the promise (the closed form's noise, a slow window)
APPROACH = 0.8  # the promise is at risk once the rate served reaches this share of the implied rate
SOURCES = {"recorded": "as plan.json records them", "request": "plan.json's --overheads",
           "default": "this poolpipe's defaults: the plan records none"}


@dataclass(frozen=True)
class Promise:
    """What a plan promised its models, the costs the promise assumed, and the closed form's rates at those costs."""

    plan: Plan
    models: tuple[str, ...]
    costs: Overheads
    source: str  # where the costs come from: plans.plan_costs.assumed_costs
    promised_rps: dict[str, float]
    baseline_rps: dict[str, float]  # the closed form's at ``costs``


def closed_form_rps(plan: Plan, models: Sequence[str], costs: Overheads) -> dict[str, float]:
    """The closed form's sustainable rate of each of ``models`` at ``costs``, under the arrivals the plan assumed
    for it (poisson where it records none)."""
    out: dict[str, float] = {}
    for text in {plan.model(m).arrivals or "poisson" for m in models}:
        rates = predicted_rps(plan, parse_arrivals(text), costs)
        out.update({m: rates[m] for m in models if (plan.model(m).arrivals or "poisson") == text})
    return out


def promise_of(plan: Plan, models: Sequence[str]) -> Promise:
    costs, source = assumed_costs(plan)
    base = closed_form_rps(plan, models, costs)
    promised = {m: base[m] if (r := plan.model(m).sustainable_rps) is None else r for m in models}
    return Promise(plan, tuple(models), costs, source, promised, base)


def implied_rps(promise: Promise, measured: Overheads) -> dict[str, float]:
    """Per model, the promise moved by the closed form from the assumed costs to ``measured`` (NaN where the closed
    form holds nothing at the assumed costs: it cannot judge that plan)."""
    now = closed_form_rps(promise.plan, promise.models, measured)
    return {m: promise.promised_rps[m] * now[m] / b if (b := promise.baseline_rps[m]) > 0 else math.nan
            for m in promise.models}


_HELD: Promise | None = None  # in the check's child process: the promise it judges


def _hold(promise: Promise) -> None:
    global _HELD
    _HELD = promise


def _implied_in_child(measured: Overheads) -> dict[str, float]:
    assert _HELD is not None, "the child process was started without its promise"
    return implied_rps(_HELD, measured)


def at_risk(promised: float, implied: float, served: float) -> bool:
    """The costs imply less than the promise (beyond TOLERANCE) and the rate served approaches what they imply."""
    return implied < (1.0 - TOLERANCE) * promised and served >= APPROACH * implied


def shard_shares(manifest: Manifest) -> dict[str, float]:
    """Per model, the share of the plan's throughput this sidecar serves (1 without ``--shard``)."""
    out = {}
    for m in manifest.models:
        full = sum(p.throughput_rps for p in manifest.plan.model(m.name).pipelines)
        mine = sum(p.throughput_rps for p in m.pipelines)
        out[m.name] = min(1.0, mine / full) if full > 0 and mine > 0 else 1.0
    return out


class PromiseCheck:
    """One plan's promise checked against the costs its sidecar measures (module doc); ``implied`` and ``costs``
    hold the last check's rates and costs (empty until enough stage calls are measured)."""

    def __init__(self, plan: Plan, meter: OverheadMeter, stats: Mapping[str, ModelStats], metrics: SidecarMetrics,
                 overheads_out: Path | None = None, shares: Mapping[str, float] | None = None) -> None:
        served = [m for m in stats if m in {p.name for p in plan.models}]
        try:
            self.promise = promise_of(plan, served)
        except Exception as e:  # noqa: BLE001 - the check only observes: a plan it cannot read is served unchecked
            log.warning("event=promise_check_off reason=%s", e)
            self.promise = Promise(plan, (), DEFAULT_OVERHEADS, "default", {}, {})
        self.meter, self.stats, self.metrics = meter, stats, metrics
        self.overheads_out = overheads_out
        self.shares = dict(shares or {})
        self.implied: dict[str, float] = {}
        self.costs: dict[str, float] = {}
        self._warned: set[str] = set()
        self._last: tuple[float, dict[str, int]] | None = None
        self._pool: ProcessPoolExecutor | None = None
        for m in self.promise.models:
            metrics.promised.labels(m).set(self.promise.promised_rps[m])
            metrics.sustainable.labels(m).set(math.nan)
            metrics.promise_at_risk.labels(m).set(0)
        c = self.promise.costs
        if self.promise.models:
            log.info("event=promise_check every_s=%.0f tolerance=%.2f promised=%s planned_lead_us=%.0f "
                     "planned_tail_us=%.0f planned_costs=%s", CHECK_INTERVAL_S, TOLERANCE,
                     ",".join(f"{m}={r:.1f}" for m, r in self.promise.promised_rps.items()), c.lead_us, c.tail_us,
                     self.promise.source)

    async def start(self) -> asyncio.Task:
        """Starts the child and has it judge the assumed costs once, before the sidecar listens (spawned at the first
        check, its start-up took a core away from serving for half a second, under load), then the checks."""
        try:
            if self.promise.models:
                await asyncio.get_running_loop().run_in_executor(self._child(), _implied_in_child, self.promise.costs)
        except Exception:  # noqa: BLE001 - the check only observes: serving starts all the same
            log.exception("event=promise_check_failed stage=start")
        return asyncio.ensure_future(self._run())

    def close(self) -> None:
        """Stops the child process (blocks until it is gone: call it off the event loop)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def _child(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = child_pool(_hold, self.promise)
        return self._pool

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(CHECK_INTERVAL_S)
            try:
                await self.check(time.monotonic())
            except Exception:  # noqa: BLE001 - a failed check must not stop the next, nor touch serving
                log.exception("event=promise_check_failed")

    def served_rps(self, now_s: float) -> dict[str, float]:
        """Per model, the rows finished (answered or failed) per second since the last call, for the whole plan
        (this sidecar's rate over its share); empty on the first call."""
        done = {m: self.stats[m].inferences + self.stats[m].fail.count for m in self.promise.models}
        last, self._last = self._last, (now_s, done)
        if last is None or now_s <= last[0]:
            return {}
        return {m: (n - last[1][m]) / (now_s - last[0]) / self.shares.get(m, 1.0) for m, n in done.items()}

    async def check(self, now_s: float) -> None:
        """One check: the implied rates from the costs measured now, the gauges, and a warning where at risk."""
        served = self.served_rps(now_s)
        costs = self.meter.recent_costs(RECENT_WINDOWS)
        if not costs or not self.promise.models:
            return
        self.costs = costs
        # measured at the rate served: with a calibrated cost model its rate slopes stay, based at what was measured
        measured = self.promise.costs.rebased(costs, sum(served.values()), self.promise.plan.stage_calls_per_request())
        self.implied = await asyncio.get_running_loop().run_in_executor(self._child(), _implied_in_child, measured)
        for m, implied in self.implied.items():
            self.metrics.sustainable.labels(m).set(implied)
            promised = self.promise.promised_rps[m]
            risky = m in served and at_risk(promised, implied, served[m])
            self.metrics.promise_at_risk.labels(m).set(1 if risky else 0)
            if risky and m not in self._warned:
                self._warned.add(m)
                self._warn(m, promised, implied, served[m])
            elif not implied < (1.0 - TOLERANCE) * promised:
                self._warned.discard(m)  # the episode is over: a new one is told again

    def _warn(self, model: str, promised: float, implied: float, served: float) -> None:
        if self.overheads_out is not None:
            self.meter.write(self.overheads_out)
            where = f"FILE={self.overheads_out}, written now by this sidecar's --overheads-out"
        else:
            where = "FILE from 'poolpipe serve --overheads-out FILE', not given to this sidecar"
        c, p = self.costs, self.promise.costs
        log.warning("event=promise_at_risk model=%s promised_rps=%.1f implied_rps=%.1f served_rps=%.1f lead_us=%.0f "
                    "tail_us=%.0f slowdown=%.3f (planned lead_us=%.0f tail_us=%.0f slowdown=%.3f, %s) re-plan: "
                    "poolpipe plan SPEC --overheads FILE (%s), or serve --replan", model, promised, implied, served,
                    c["lead_us"], c["tail_us"], c["slowdown"], p.lead_us, p.tail_us, p.slowdown,
                    SOURCES[self.promise.source], where)
