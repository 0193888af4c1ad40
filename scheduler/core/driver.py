"""The one driver loop around a policy, shared by the simulator and the sidecar.

The policy decides (``Scheduler.step``); the driver owns what happens around it, on an abstract clock:
enqueueing with a deadline margin, stepping the core ahead of the clock by the executor's lead time,
snapping late wake-ups, answering drops, handing dispatches to the executor, reporting measured stage
timings back (feedback), learning how late batches finish against the core's prediction (the margin),
retrying the requests of a batch whose server failed, and completing dispatches: the driver, not the executor,
answers the callers (``Callers``), as vLLM's ``EngineCore.step`` -> ``update_from_output`` does. An executor
(virtual in the simulator, Triton calls in the sidecar) only executes: it holds no driver, and hands each stage's
outcome of a dispatch back through one call, ``on_stage_done(StageOutcome)`` (the last stage's with its outputs),
whose answer (``NextStep``) says what it does next and with which assignment: the policy's dispatch is not
changed under it. Whatever it adds that the profiles do not know (per-hop overhead, lateness) reaches the core
through that same path, so the simulator predicts what the sidecar does.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any, Protocol

from poolpipe_common.overheads import DRIVER_MARGIN_FRACTION, DRIVER_MIN_MARGIN_US
from poolpipe_common.quantile import percentile
from scheduler.core.api import Dispatch, RequestRow, Scheduler, StageAssignment
from scheduler.core.executor_load import ExecutorLoad
from scheduler.core.policies.retired import RetiredPolicy
from scheduler.core.topology import Topology

log = logging.getLogger("poolpipe.driver")

# An executor sends a reserved stage at once when it is due in less than this: an event loop sleeps at a
# millisecond's resolution (epoll's timeout), so a shorter wait costs up to a millisecond, while a stage sent that
# much early at worst waits in its server's queue behind the vGPU's batch before it.
EARLY_SEND_US = 1000.0


@dataclass(frozen=True)
class DriverConfig:
    """What the loop does around the policy; ``live()`` is the sidecar's setting, ``ideal()`` a paper simulator's.

    The core plans against the deadline minus a margin: the larger of ``min_margin_us`` and
    ``margin_fraction`` x SLO, raised to a robust high percentile of the measured lateness (completion
    against the core's prediction) once ``lateness_warmup`` batches have finished, capped at
    ``max_margin_fraction`` of the slack an idle pipeline leaves (a larger margin would shed everything,
    and with nothing served the lateness could never come down again). The core's clock lead (calibrated, plus
    what the executor learns under load) is capped at that share of the slack too, and below what the slack leaves
    past the margin (``max_lead_fraction``), for the same reason: a lead a CPU stall taught that leaves no slack
    would shed every request, and with nothing sent no calmer lead could be measured.
    """

    min_margin_us: float = DRIVER_MIN_MARGIN_US
    margin_fraction: float = DRIVER_MARGIN_FRACTION
    learn_lateness: bool = True
    lateness_window: int = 256
    # Lateness older than this is forgotten, so that a burst's late batches do not keep the margin high (and
    # shed requests) after the burst has passed: back to >= 99 % within two seconds of it.
    lateness_horizon_us: float = 2_000_000.0
    lateness_every: int = 16
    lateness_percentile: float = 95.0
    lateness_warmup: int = 8
    max_margin_fraction: float = 0.5
    # below 1: an idle pipeline is always in time; near 1: where slack is short, a lead the host takes is kept
    max_lead_fraction: float = 0.9
    max_attempts: int = 3
    # The core's clock runs this far ahead of the executor's (nothing dispatched now computes before it).
    clock_lead_us: float = 0.0
    # The deadlines the core sees come this much before the SLO (the way outside the sidecar's clock: serve
    # --front-us), so the slack the caps are shares of is that much less: counted against the whole SLO, a lead a
    # startup stall taught (3.2 ms, its cap, on tf_efficientdet_d1 at a 16.4 ms SLO with 2 ms outside the clock)
    # left no pipeline in time, and the sidecar shed every request from then on (nothing sent: nothing relearned)
    front_us: float = 0.0
    # A wake-up that fires late by less than this is stepped at the time the core asked for (an event loop
    # is no real-time clock); this, or half the smallest base margin where that is larger.
    min_late_wake_tolerance_us: float = 2000.0

    @classmethod
    def live(cls, **overrides: Any) -> "DriverConfig":
        return replace(cls(), **overrides)

    @classmethod
    def ideal(cls, **overrides: Any) -> "DriverConfig":
        """No margin and no learning: the policy alone, as the paper's simulator runs it."""
        return replace(cls(min_margin_us=0.0, margin_fraction=0.0, learn_lateness=False,
                           min_late_wake_tolerance_us=0.0), **overrides)


@dataclass(frozen=True)
class StageOutcome:
    """What became of one stage of a dispatch: the executor's one report to the driver (executor clock).

    ``compute_us``: the interval the stage held its vGPU, as measured: its compute, plus the server's turnaround
    to its next batch where the executor knows it (None: not measured). ``wanted``: the rows the batch ran for
    (those whose callers still waited when it started), in the order it was handed them. ``outputs``: the last
    stage's outputs (the executor's own form, row i for ``wanted[i]``), which the driver hands to the callers.
    ``failed``: the stage's server failed (why); the driver retries or rejects the ``wanted`` rows.
    ``gave_up``: the executor abandoned the dispatch (no caller waits, or ``error``: it cannot run, and the driver
    fails the ``wanted`` rows with that error): nothing to learn from it. ``next_lead_us``: how long after
    ``now_us`` the next stage could start computing if sent now (None: the core's clock lead), for moving it
    earlier when its input is ready before its reservation."""

    dispatch: Dispatch
    index: int  # which of dispatch.stages
    now_us: float
    compute_us: tuple[float, float] | None = None
    failed: str | None = None
    wanted: Sequence[RequestRow] = ()
    gave_up: bool = False
    next_lead_us: float | None = None
    outputs: Any = None
    error: Any = None


class Action(Enum):
    NEXT_STAGE = "next_stage"  # run the dispatch's next stage
    FINISH = "finish"  # its work is done: the driver handed the outputs on (answers, or the next dispatch's input)
    STOP = "stop"  # it ended without outputs; the driver re-enqueued, rejected or failed its rows


@dataclass(frozen=True)
class NextStep:
    """The driver's answer to a StageOutcome."""

    action: Action
    retried: int = 0  # after a failure: how many rows were re-enqueued (the others were rejected)
    # NEXT_STAGE: the next stage's assignment (moved earlier where the policy could), which the executor runs
    next: StageAssignment | None = None


Report = Callable[[StageOutcome], NextStep]


class Executor(Protocol):
    """What a driver needs from the side that executes (virtual cluster or Triton servers)."""

    def execute(self, dispatch: Dispatch, rows: list[RequestRow], report: Report) -> None:
        """Start running ``dispatch`` on ``rows`` (the driver's records of its requests, in order); report each
        stage's outcome to ``report`` and follow its answer."""


class Callers(Protocol):
    """Who waits for the rows (the sidecar's client calls, the simulator's outcome log): the driver answers them."""

    def finish(self, dispatch: Dispatch, rows: Sequence[RequestRow], outputs: Any, now_us: float) -> None:
        """``dispatch`` completed with ``outputs`` (row i for ``rows[i]``): answer the callers (a final
        dispatch), or keep each row's outputs as its carry for its next dispatch (``Dispatch.final`` False)."""

    def reject(self, row: RequestRow, reason: str, *, failure: bool = False) -> None:
        """Answer ``row`` with an explicit error: the core dropped (shed) it, or (``failure``) a server failed
        its batch and no retry can meet its deadline."""

    def fail(self, dispatch: Dispatch, rows: Sequence[RequestRow], error: Any) -> None:
        """Answer ``rows`` (of ``dispatch``) with the executor's ``error``: their batch could not run (a bug, a
        refused request, a stop)."""


class Driver:
    """Runs one Scheduler for one Executor; every clock value is the executor's (the core's = it + lead)."""

    def __init__(self, scheduler: Scheduler, topology: Topology, executor: Executor,
                 config: DriverConfig | None = None, *, callers: Callers) -> None:
        self.scheduler = scheduler
        self.topology = topology
        self.executor = executor
        self.callers = callers
        self.config = config or DriverConfig.live()
        c = self.config
        self.base_margin_us = {m: max(c.min_margin_us, c.margin_fraction * slo) for m, slo in topology.slo_us.items()}
        self.margin_us = dict(self.base_margin_us)
        self.lateness_us: dict[str, deque[tuple[float, float]]] = {m: deque(maxlen=c.lateness_window)
                                                                   for m in topology.slo_us}  # (when, how late)
        self.late_wake_tolerance_us = max(c.min_late_wake_tolerance_us,
                                          0.5 * min(self.base_margin_us.values(), default=0.0))
        self.rows: dict[int, RequestRow] = {}  # by id: the rows the policy holds (queued, or between dispatches)
        self.wake_us: float | None = None
        self._stepped_at_wake_us: float | None = None  # the wake-up last stepped at its own time (see step)
        self.retries = 0
        self.extra_lead_us = 0.0  # the lead the executor learned under load (the sidecar's planned service sets it)
        self.executor_load = ExecutorLoad()
        # each model's fastest pipeline on idle vGPUs, transfers included (the slack the caps are shares of)
        self.fastest_us = {m: min(topology.idle_us(p) for p in pipes) for m, pipes in topology.pipelines.items()
                           if pipes}
        self.lead_cap_us = self._lead_cap()
        self.learned = 0
        self._next_id = 1
        self._in_flight: dict[int, list[RequestRow]] = {}
        self._completion_us: dict[int, float] = {}  # each dispatch's predicted completion, as stages move earlier

    @property
    def lead_us(self) -> float:
        """How far the core's clock runs ahead: the configured lead plus what the executor learned since, capped so
        that an idle pipeline stays in time past its margin (see DriverConfig and _lead_cap)."""
        return min(self.config.clock_lead_us + self.extra_lead_us, self.lead_cap_us)

    def _lead_cap(self) -> float:
        """A share of the slack an idle pipeline leaves, and less than what that leaves past the model's margin:
        capped by the slack alone, lead and margin together left none (tf_efficientdet_d1 at a 16.4 ms SLO, its
        pipeline crossing servers, shed every request after a busy start taught a lead)."""
        c = self.config
        slack = {m: self.idle_slack_us(m) for m in self.fastest_us}
        return max(0.0, min((min(c.max_margin_fraction * s, c.max_lead_fraction * (s - self.margin_us[m]))
                             for m, s in slack.items()), default=0.0))

    def idle_slack_us(self, model: str) -> float:
        """What the SLO leaves of ``model``'s deadlines past its fastest pipeline on idle vGPUs."""
        return self.topology.slo_us[model] - self.config.front_us - self.fastest_us[model]

    # -- requests in --------------------------------------------------------------------------------------
    def submit(self, call: Any, model: str, arrival_us: float, deadline_us: float, priority: int = 0,
               timeout_us: int = 0, counted: bool = True, index: int = 0) -> bool:
        """Row ``index`` of the request ``call``: the core sees its deadline less the model's current margin, at its
        priority level and with its queue timeout (Triton's batcher controls of the model). False: refused at once
        (and rejected)."""
        row = RequestRow(0, model, arrival_us, deadline_us, counted=counted, call=call, index=index,
                         due_us=deadline_us, priority=priority, timeout_us=timeout_us)
        return self._enqueue(row, arrival_us)

    def _enqueue(self, row: RequestRow, now_us: float, attempt: int = 1) -> bool:
        """Enqueue a fresh copy of ``row`` under a new id, its deadline less the model's current margin."""
        rid = self._next_id
        self._next_id += 1
        level, expires = 0, None
        controls = self.topology.batcher.get(row.model)
        if controls is not None:
            level = controls.level(row.priority)
            timeout = controls.policy(level).timeout_us(row.timeout_us)
            expires = now_us + self.lead_us + timeout if timeout else None
        row = RequestRow(rid, row.model, now_us, row.due_us - self.margin_us.get(row.model, 0.0), level, expires,
                         row.counted, row.call, row.index, row.carry, row.due_us, row.attempts + attempt,
                         row.priority, row.timeout_us)
        self.rows[rid] = row
        refused = self.scheduler.enqueue(row)
        if refused is not None:
            del self.rows[rid]
            self.callers.reject(row, refused)
            return False
        return True

    # -- the step -----------------------------------------------------------------------------------------
    def step(self, now_us: float) -> float | None:
        """Decide at ``now_us``: answer drops, hand out dispatches; returns when to step again (or None)."""
        t = now_us
        w = self.wake_us
        if w is not None and w <= t < w + self.late_wake_tolerance_us and w != self._stepped_at_wake_us:
            # a late wake-up is stepped at the time the core asked for, once: a core that asks for that instant
            # again would otherwise be stepped there until the tolerance ran out (the loop spinning meanwhile)
            t = self._stepped_at_wake_us = w
        result = self.scheduler.step(t + self.lead_us)
        self.wake_us = None if result.wake_at_us is None else result.wake_at_us - self.lead_us
        for drop in result.drops:
            row = self.rows.pop(drop.request.id, None)
            if row is not None:
                self.callers.reject(row, drop.reason)
        for d in result.dispatches:
            rows = [self.rows[r.id] for r in d.requests]
            if d.final:
                for r in d.requests:
                    del self.rows[r.id]
            self._in_flight[d.id] = rows
            self._completion_us[d.id] = d.completion_us
            self.executor.execute(d, list(rows), self.on_stage_done)
        return self.wake_us

    # -- feedback from the executor -----------------------------------------------------------------------
    def on_stage_done(self, o: StageOutcome) -> NextStep:
        """One stage's outcome: a measured interval corrects the core's tables; the last stage completes the
        dispatch (its outputs go to the callers; a final one teaches the margin how late batches run); a failure
        retries or rejects its rows; an executor's error fails them."""
        d = o.dispatch
        if o.gave_up:  # nobody waits for the rest: what it holds from now on goes back to the core
            self._forget(d)
            self.scheduler.release(d.id, o.now_us + self.lead_us)
            if o.error is not None:
                self.callers.fail(d, o.wanted, o.error)
            return NextStep(Action.STOP)
        if o.failed is not None:
            return NextStep(Action.STOP, self._failed(d, o.wanted, o.now_us, o.failed))
        if o.compute_us is not None:
            self.scheduler.report(d.id, d.stages[o.index].stage, *o.compute_us)
        if o.index + 1 < len(d.stages):
            ready = o.now_us + (self.lead_us if o.next_lead_us is None else o.next_lead_us)
            return NextStep(Action.NEXT_STAGE, next=self._advance(d, o.index + 1, ready))
        completion = self._completion_us.pop(d.id, d.completion_us)
        self._in_flight.pop(d.id, None)
        if d.final and self.config.learn_lateness:
            self._learn(d.model, o.now_us - completion, o.now_us)
        self.callers.finish(d, o.wanted, o.outputs, o.now_us)
        return NextStep(Action.FINISH)

    def _forget(self, d: Dispatch) -> list[RequestRow]:
        """The dispatch ends without completing: its rows (a per-stage dispatch's are still held under their
        ids)."""
        self._completion_us.pop(d.id, None)
        rows = self._in_flight.pop(d.id, [])
        if not d.final:
            for r in d.requests:
                self.rows.pop(r.id, None)
        return rows

    def _advance(self, d: Dispatch, k: int, ready_us: float) -> StageAssignment:
        """Stage ``k`` of ``d`` can start at ``ready_us`` (core clock): the assignment the executor runs it at (the
        policy's answer, or the one dispatched), and the dispatch's predicted completion moves with the last."""
        old = d.stages[k]
        new = self.scheduler.advance(d.id, old.stage, ready_us)
        if new is None:
            return old
        if k == len(d.stages) - 1 and d.id in self._completion_us:
            self._completion_us[d.id] -= old.end_us - new.end_us
        return new

    def _failed(self, dispatch: Dispatch, wanted: Sequence[RequestRow], now_us: float, reason: str) -> int:
        """A server failed the batch: re-enqueue its ``wanted`` rows (those whose callers still wait) that have
        attempts and time left, reject the rest; returns how many were retried."""
        rows = self._forget(dispatch)
        ids = {id(row) for row in wanted}
        retried = 0
        for row in rows:
            if id(row) not in ids:
                continue
            if row.attempts >= self.config.max_attempts or now_us >= row.due_us:
                self.callers.reject(row, f"{reason} and no retry could meet the deadline", failure=True)
            elif self._enqueue(row, now_us):  # (refused by a full queue: rejected there)
                retried += 1
        self.retries += retried
        return retried

    def queued(self) -> list[RequestRow]:
        """Rows not in any dispatch yet (to hand over to a new driver, or to answer at shutdown)."""
        busy = {id(row) for rows in self._in_flight.values() for row in rows}
        return [row for row in self.rows.values() if id(row) not in busy]

    def take_queued(self) -> list[RequestRow]:
        """The queued rows, removed from this driver (a plan swap hands them to the next driver; this one is
        not stepped again, and a later take finds only what its failing batches re-enqueued since)."""
        queued = self.queued()
        moved = {id(row) for row in queued}
        self.rows = {rid: row for rid, row in self.rows.items() if id(row) not in moved}
        return queued

    def retire(self) -> list[RequestRow]:
        """The policy failed and its state cannot be trusted: returns every row this driver held (queued, or
        between the dispatches of a per-stage policy) for the owner to fail; the policy is dropped, so batches in
        flight run on and complete here without it, and a retry is refused at once (the owner's new driver
        serves what comes next)."""
        held = list(self.rows.values())
        self.rows.clear()
        self.scheduler = RetiredPolicy()
        return held

    def adopt(self, rows: list[RequestRow], now_us: float) -> None:
        """Take over another driver's queued rows (same deadlines; this is not a retry)."""
        for row in rows:
            self._enqueue(row, now_us, attempt=0)

    def set_vgpu_up(self, vgpu: str, up: bool, now_us: float) -> None:
        self.scheduler.set_vgpu_up(vgpu, up, now_us + self.lead_us)

    def queue_lengths(self) -> dict[str, int]:
        return self.scheduler.queue_lengths()

    def executor_busy(self, fraction: float) -> bool:
        """How busy the executor was over its last window: a saturated one gets fuller batches (a simulated
        executor costs nothing and never reports). True when the state changed: step again, held batches may go."""
        load = self.executor_load
        if not load.update(fraction):
            return False
        self.scheduler.set_executor_saturated(load.saturated)
        log.info("event=executor_%s busy=%.2f smoothed=%.2f", "saturated" if load.saturated else "unsaturated",
                 fraction, load.busy)
        return True

    # -- margin learning ----------------------------------------------------------------------------------
    def _learn(self, model: str, late_us: float, now_us: float) -> None:
        c = self.config
        self.learned += 1
        if self.learned <= c.lateness_warmup or model not in self.lateness_us:
            return
        window = self.lateness_us[model]
        pruned = False
        while window and window[0][0] < now_us - c.lateness_horizon_us:
            window.popleft()
            pruned = True
        window.append((now_us, late_us))
        n = self.learned - c.lateness_warmup
        if pruned or n <= c.lateness_every or n % c.lateness_every == 0:
            learned = percentile([x for _, x in window], c.lateness_percentile)
            new = min(max(self.base_margin_us[model], learned), self.margin_cap_us(model))
            if abs(new - self.margin_us[model]) > 1000.0:
                log.debug("event=margin model=%s margin_us=%.0f p%.0f_lateness_us=%.0f", model, new,
                         c.lateness_percentile, learned)
            self.margin_us[model] = new
            self.lead_cap_us = self._lead_cap()

    def margin_cap_us(self, model: str) -> float:
        """At most a fraction of the slack an idle pipeline leaves under the SLO (see DriverConfig)."""
        slack = min(self.topology.slo_us[model], self.idle_slack_us(model) - self.lead_us)
        return max(self.base_margin_us[model], self.config.max_margin_fraction * slack)

