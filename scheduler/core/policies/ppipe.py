"""PPipe's reservation-based adaptive batching (also how np / dart-r plans are served for comparison).

For the oldest pending request of a model: probe every pooled pipeline at its planned batch and take
the one that waits least; then the largest batch <= planned whose completion meets the oldest
request's deadline; if not even batch 1 can, drop the oldest and start over. With fewer pending
requests than that batch, wait, but no later than the last moment they can still make the deadline;
otherwise reserve the probed path and dispatch. Unlike the paper (``fill_aware`` off), waiting happens
only when it pays: when the recent arrival rate expects another request by then and is too high for the
pools to serve at the batch size at hand (with ``FILL_HEADROOM`` to spare), or when the executor itself is
saturated (each dispatch costs it a stage call). Below that a partial batch goes at once even if the stream
would fill it: the vGPUs have the time, and holding only spends slack that a later stage (or the next module
of an application) may need. A held batch goes as soon as its stream falls silent (a client that waits for its
answers). Executors' measured timings correct the tables.
"""

from __future__ import annotations

from collections import deque

from scheduler.core.api import Dispatch, Drop, RequestRow, StageAssignment, StepResult
from scheduler.core.arrival_rate import ArrivalRate
from scheduler.core.policies.base import EPS_US, QueueingPolicy
from scheduler.core.probe import CompiledPipeline, ProbeResult, ReservationState
from scheduler.core.topology import Topology

# Hold a partial batch only when the recent arrival rate exceeds this fraction of what the pools sustain at
# that batch size: below it, dispatching at once leaves the vGPUs enough idle time that batching buys nothing.
FILL_HEADROOM = 0.5
SLOWNESS_WEIGHT = 0.05  # of one stage report in the smoothed slowness


class PPipePolicy(QueueingPolicy):
    name = "ppipe"

    def __init__(self, topology: Topology, prune_every_us: float = 20_000.0,
                 forget_after_us: float = 10_000_000.0, fill_aware: bool = True) -> None:
        super().__init__(topology)
        self.fill_aware = fill_aware
        self.rates = {m: ArrivalRate() for m in topology.pipelines}
        self._capacity: dict[tuple[str, int], float] = {}  # (model, batch) -> requests per µs, as profiled
        self.slowness = 1.0  # measured / profiled stage time, smoothed over the executors' reports
        self.state = ReservationState(topology)
        self.prune_every_us = prune_every_us
        self.forget_after_us = forget_after_us
        self._last_prune = float("-inf")
        # model -> (wake-up time, queue length) while it waits for its batch to fill: until the queue
        # grows, the wake-up comes, or a table its pipelines read changes, deciding again would
        # probe the same tables to the same conclusion, so step() skips it
        self._waiting: dict[str, tuple[float, int]] = {}
        # dispatch id -> (completion, stage assignments, source server of each stage's transfer)
        self.live: dict[int, tuple[float, list[StageAssignment]]] = {}

    @property
    def probe_calls(self) -> int:
        return self.state.probe_calls

    # -- driver interface ------------------------------------------------------------------------
    def enqueue(self, request: RequestRow) -> str | None:
        refused = super().enqueue(request)
        rate = self.rates.get(request.model)
        if rate is not None and refused is None:
            rate.arrived(request.arrival_us)
        return refused

    def step(self, now_us: float) -> StepResult:
        result = StepResult()
        self.take_unknown(result)
        if now_us - self._last_prune >= self.prune_every_us:
            self._housekeeping(now_us)
        wake = None
        waiting = self._waiting
        dirty = self.state.dirty
        for model, q in self.queues.items():
            if not q:
                continue
            held = waiting.get(model)
            if held is not None and now_us < held[0] and len(q) == held[1] and model not in dirty:
                w = held[0]  # still waiting for the batch to fill and nothing it depends on changed
            else:
                w = self._decide(model, q, now_us, result)
                if w is not None:
                    t = q.next_expiry_us()  # a queue timeout falls before the wake-up: decide again then
                    w = w if t is None else min(w, t)
                dirty.discard(model)
                if w is None:
                    waiting.pop(model, None)
                else:
                    waiting[model] = (w, len(q))
            if w is not None and (wake is None or w < wake):
                wake = w
        result.wake_at_us = wake
        return result

    def report(self, dispatch_id: int, stage: int, start_us: float, end_us: float) -> None:
        entry = self.live.get(dispatch_id)
        if entry is None:
            return  # unknown, released, or already finished: nothing to correct
        _, stages = entry
        for a in stages:
            if a.stage == stage:
                self.state.correct(dispatch_id, stage, a.vgpu, start_us, end_us)
                planned = a.end_us - a.start_us
                if planned > 0:  # how much slower than profiled the servers run (for _capacity_per_us)
                    self.slowness += SLOWNESS_WEIGHT * ((end_us - start_us) / planned - self.slowness)
                break
        else:
            return
        if stage == stages[-1].stage:
            del self.live[dispatch_id]

    def advance(self, dispatch_id: int, stage: int, ready_us: float) -> StageAssignment | None:
        """The stage's input is ready before its reservation (the stages before it ran faster than profiled):
        run it as soon as its vGPU is free rather than idle until the reserved start."""
        entry = self.live.get(dispatch_id)
        if entry is None:
            return None
        stages = entry[1]
        k = next((i for i, a in enumerate(stages) if a.stage == stage), -1)
        new = self.state.advance(dispatch_id, stages, k, ready_us) if k >= 0 else None
        if new is not None:
            stages[k] = new  # the completion it keeps only ages the entry out: the driver keeps the prediction
        return new

    def release(self, dispatch_id: int, now_us: float) -> None:
        """An abandoned dispatch: its reservations that have not started by ``now_us`` go back to the tables."""
        entry = self.live.pop(dispatch_id, None)
        if entry is not None:
            self.state.release(dispatch_id, entry[1], now_us)

    def set_vgpu_up(self, vgpu_id: str, up: bool, now_us: float) -> None:
        self.state.set_vgpu_up(vgpu_id, up, now_us)
        self._capacity.clear()

    def set_executor_saturated(self, saturated: bool) -> None:
        super().set_executor_saturated(saturated)
        self._waiting.clear()  # a held batch may now go (or a sent-at-once one wait): decide again

    # -- decisions -------------------------------------------------------------------------------
    def _housekeeping(self, now_us: float) -> None:
        self.state.prune(now_us)
        self._last_prune = now_us
        stale = [d for d, (c, _) in self.live.items() if c < now_us - self.forget_after_us]
        for d in stale:
            del self.live[d]

    def _probe_planned(self, pipes: list[CompiledPipeline], now: float) -> list[tuple[float, int, ProbeResult]]:
        """Every pipeline probed at its planned batch, as (wait, index, result), least wait first (to EPS_US), then
        the one that finishes first. Compared exactly, idle pipelines' waits of 0 differed by rounding, which then
        picked the pool: tf_efficientdet_d1 at 100 req/s kept its 12 T4s 5.3 % busy beside 4 idle-most L4s (10.5 %)."""
        out = []
        for i, cp in enumerate(pipes):
            r = self.state.probe(cp, cp.batch, now)
            if r is not None:
                out.append((r.completion_us - now - cp.ideal_us[cp.batch], i, r))
        if len(out) > 1:
            out.sort(key=lambda x: (round(x[0] / EPS_US), x[2].completion_us, x[1]))
        return out

    def _fit(self, cp: CompiledPipeline, r: ProbeResult, deadline: float, now: float) -> tuple[int, ProbeResult] | None:
        """The largest usable batch (its index in cp.batches) whose probe on ``cp`` meets ``deadline``."""
        batches = cp.batches
        k = len(batches) - 1
        while r.completion_us > deadline:
            k -= 1
            if k < 0:
                return None
            r = self.state.probe(cp, batches[k], now)
        return k, r

    def _decide(self, model: str, q: deque[RequestRow], now: float, result: StepResult) -> float | None:
        """Dispatch or drop from the head of ``q`` until it must wait; returns the wake-up time, if any."""
        pipes = self.state.pipelines[model]
        while q:
            self.drop_expired(q, now, result)
            if not q:
                return None
            oldest = q[0]
            ranked = self._probe_planned(pipes, now)
            if not ranked:
                result.drops.append(Drop(q.popleft(), "no vGPU in service for this model"))
                continue
            # the least-waiting pipeline; if even its batch 1 misses the oldest deadline, the next one
            # (a pipeline that waits longer may still be faster end to end) before dropping
            fit = None
            for _, i, r in ranked:
                fit = self._fit(pipes[i], r, oldest.deadline_us, now)
                if fit is not None:
                    cp = pipes[i]
                    break
            if fit is None:
                result.drops.append(Drop(q.popleft(), "deadline cannot be met"))
                continue
            k, r = fit
            batches = cp.batches
            n = len(q)
            if n < r.batch:
                # the smallest profiled batch that holds all n (timed as that batch): with the largest below n
                # instead, the wait would be timed for fewer requests than are queued, and at the wake-up the
                # rest could no longer make their deadline
                while k > 0 and batches[k - 1] >= n:
                    k -= 1
                if batches[k] != r.batch:
                    r = self.state.probe(cp, batches[k], now)
                latest = max(r.start_us, now) + (oldest.deadline_us - r.completion_us)
                if n < cp.batch and latest > now + EPS_US:
                    if not self.fill_aware:
                        return latest
                    if self._worth_waiting(model, batches[k], now, latest):
                        # decide again when the stream would count as stopped (a closed-loop client)
                        return min(latest, self.rates[model].stale_at_us(now))
            self._dispatch(model, cp, r, now, result)
        return None

    def _worth_waiting(self, model: str, batch: int, now: float, latest: float) -> bool:
        """Whether holding a partial batch of ``batch`` until ``latest`` pays:
        another request is expected by then and the pools could not keep up with the rate at this batch size
        (at the speed the servers really run, which may be slower than profiled). Otherwise nothing is gained
        by waiting; filling the batch for its own sake (the paper) cost an application's later module its
        slack (benchmarks/beyond_ppipe_appserve.py: 6 of 476 shed) and gained nothing in the simulator."""
        rate = self.rates[model].per_us(now)
        expected = rate * (latest - now)
        if expected < 1.0:
            return False
        if self.executor_saturated:
            return True  # every dispatch costs the executor a stage call: only fuller batches let it keep up
        return rate * max(1.0, self.slowness) > FILL_HEADROOM * self._capacity_per_us(model, batch)

    def _capacity_per_us(self, model: str, batch: int) -> float:
        """Requests per µs all the model's pipelines sustain in batches of ``batch`` (bottleneck stage)."""
        key = (model, batch)
        cap = self._capacity.get(key)
        if cap is None:
            cap = 0.0
            for cp in self.state.pipelines[model]:
                b = max((x for x in cp.batches if x <= batch), default=cp.batches[0])
                cap += min(len(st.active) * b / st.hold[b] for st in cp.stages)
            self._capacity[key] = cap
        return cap

    def _dispatch(self, model: str, cp: CompiledPipeline, r: ProbeResult, now: float, result: StepResult) -> None:
        did = self.new_dispatch_id()
        stages = self.state.commit(r, did)
        q = self.queues[model]
        requests = self.take_meeting(q, r.batch, r.completion_us)  # fewer than probed: reserved as that batch
        self.live[did] = (r.completion_us, stages)
        # the dispatch gets its own list: the policy moves its reservations in its own (advance), the driver
        # hands the executor the moved assignment
        result.dispatches.append(Dispatch(did, model, cp.id, requests, list(stages), r.completion_us))
