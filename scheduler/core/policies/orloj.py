"""`orloj`: distribution-aware batching for variable-latency models (after Orloj, §3-§4).

A batch is padded to its longest request, so its latency is the maximum (order statistic) of its requests'
latencies: with every request of a model drawn from the profiled distribution F, a batch of k takes F^k
(``QuantileDist.order_statistic``, summed over the pipeline's stages level by level). Each batch size has its
own queue: the requests whose deadline its expected latency still meets. Because that latency grows with the
batch size and every request of a model shares it, each queue is a suffix of one deadline-ordered list, found
by bisection (no per-size copies to update). When a pipeline's first vGPU is idle the largest batch size whose
queue holds enough requests is formed from the top of that queue by Orloj's priority p(t) (expected cost of
delay over expected latency, with an exponentially distributed anticipated delay of rate ``b``): requests
certain to make it go earliest-deadline first, those whose deadline falls inside the distribution rank by
their chance of making it, so hopeless ones do not take a batch slot. A request is dropped once its last
feasible batch size is gone (even a batch of the smallest size is expected to miss its deadline).

Orloj schedules one worker; here each pipeline's first pool is the worker and later stages are assumed to
keep pace. Scoring a batch-size queue evaluates p only on the requests whose deadline lies inside the batch's
latency range that can still beat the ``k`` next ones (see ``_top_by_priority``), not on every pending request.
"""

from __future__ import annotations

import numpy as np

from scheduler.core.api import Dispatch, Drop, RequestRow, StageAssignment, StepResult
from scheduler.core.latency_dist import PriorityScore, TabulatedScore, comonotone_sum
from scheduler.core.policies.base import QueueingPolicy
from scheduler.core.policies.deadline_queue import DeadlineQueue
from scheduler.core.policies.queue_model import VGpuQueues
from scheduler.core.probe import CompiledPipeline
from scheduler.core.topology import Topology

B_PER_MS = 1e-4  # the paper's choice; the ordering is insensitive to it (its §5.6)


class _BatchModel:
    """One pipeline at one batch size: expected latency, latest possible latency and the priority score."""

    __slots__ = ("batch", "mean_us", "high_us", "score", "cdf_x", "cdf_u")

    def __init__(self, cp: CompiledPipeline, batch: int, b_per_us: float) -> None:
        xfer = sum(st.xfer_us_per_request for st in cp.stages) * batch
        one = comonotone_sum([s.dist(batch) for s in cp.pipeline.stages]).shifted(xfer)
        dist = one.order_statistic(batch)
        self.batch = batch
        self.mean_us = dist.mean
        self.high_us = dist.high
        self.score = TabulatedScore(PriorityScore.of(dist, b_per_us), dist.low, dist.high)
        self.cdf_x = np.asarray(dist.values)
        self.cdf_u = np.asarray(dist.levels)

    def bound(self, slack_us: float) -> float:
        """An upper bound of the priority at ``slack_us`` (and at any smaller slack): P(L < slack) / E[L]."""
        return float(np.interp(slack_us, self.cdf_x, self.cdf_u, left=0.0, right=1.0)) * self.score.inv_mean


def _top_by_priority(q: DeadlineQueue, bm: _BatchModel, lo: int, now: float) -> list[int]:
    """The ``bm.batch`` requests of q[lo:] with the highest priority (ties: earlier deadline).

    Past the batch's longest latency p falls as the deadline grows, so only the first k there can count. Below
    it p <= F(slack) / E[L], which falls with the deadline too: chunks are scored from the longest-latency
    end down (chunks of 2k, 4k, ...) until that bound cannot beat the k-th best score found."""
    k, n, dl = bm.batch, len(q), q.deadlines
    inside = max(q.first_at_or_after(now + bm.high_us), lo)
    hi = min(n, inside + k)
    if hi - lo == k:
        return list(range(lo, hi))
    idx = np.arange(inside, hi)
    score = bm.score(np.asarray(dl[inside:hi]) - now)
    chunk = 2 * k
    while inside > lo:
        if len(idx) >= k and bm.bound(dl[inside - 1] - now) <= np.partition(score, len(score) - k)[-k]:
            break
        start = max(lo, inside - chunk)
        chunk *= 2
        idx = np.concatenate((np.arange(start, inside), idx))
        score = np.concatenate((bm.score(np.asarray(dl[start:inside]) - now), score))
        inside = start
    best = np.lexsort((idx, -score))[:k]
    return [int(i) for i in idx[best]]


class OrlojPolicy(QueueingPolicy):
    name = "orloj"
    honours_batcher = False  # its own queue order (by deadline / per pool)

    def __init__(self, topology: Topology, b_per_ms: float = B_PER_MS) -> None:
        super().__init__(topology)
        if not b_per_ms > 0:
            raise ValueError(f"orloj: anticipation factor b={b_per_ms} per ms must be > 0")
        self.vq = VGpuQueues(topology)
        b_per_us = b_per_ms / 1000.0
        self.models: dict[str, list[tuple[CompiledPipeline, list[_BatchModel]]]] = {}
        self.min_latency_us: dict[str, float] = {}  # expected latency of the smallest batch on the fastest pipeline
        for m, pipes in self.vq.compiled.pipelines.items():
            per = [(cp, [_BatchModel(cp, b, b_per_us) for b in reversed(cp.batches)]) for cp in pipes]
            per.sort(key=lambda x: x[1][-1].mean_us)  # fastest pipeline first
            self.models[m] = per
            self.min_latency_us[m] = min((bms[-1].mean_us for _, bms in per), default=float("inf"))

    @staticmethod
    def new_queue() -> DeadlineQueue:  # type: ignore[override]
        return DeadlineQueue()

    def step(self, now_us: float) -> StepResult:
        result = StepResult()
        self.take_unknown(result)
        for model, q in self.queues.items():
            if not q:
                continue
            for r in q.pop_before(now_us + self.min_latency_us[model]):
                result.drops.append(Drop(r, "deadline cannot be met: even the smallest batch is expected to "
                                            "finish after it"))
            tried: set[str] = set()
            while q:
                found = self._idle_pipeline(model, tried)
                if found is None:
                    break
                cp, bms, vgpu = found
                picked = self._form(q, bms, now_us)
                if picked is None:
                    tried.add(cp.id)  # its requests all need a faster pipeline
                    continue
                self._dispatch(model, cp, vgpu, q.take(picked), now_us, result)
        return result

    def _idle_pipeline(self, model: str, tried: set[str]) -> tuple[CompiledPipeline, list[_BatchModel], str] | None:
        """The fastest pipeline (not yet tried) whose first pool has a vGPU with nothing outstanding."""
        out = self.vq.outstanding
        for cp, bms in self.models[model]:
            if cp.id in tried:
                continue
            idle = next((v for v, _, _ in cp.stages[0].active if out[v] == 0), None)
            if idle is not None:
                return cp, bms, idle
        return None

    @staticmethod
    def _form(q: DeadlineQueue, bms: list[_BatchModel], now: float) -> list[int] | None:
        """Indices in ``q`` of the next batch: the largest batch size whose queue (the requests its expected
        latency still serves in time) holds enough, filled by priority (None: no batch size can be formed)."""
        n = len(q)
        for bm in bms:  # largest batch size first
            lo = q.first_at_or_after(now + bm.mean_us)
            if n - lo >= bm.batch:
                return _top_by_priority(q, bm, lo, now)
        return None

    def _dispatch(self, model: str, cp: CompiledPipeline, first: str, requests: list[RequestRow], now: float,
                  result: StepResult) -> None:
        out, busy, server = self.vq.outstanding, self.vq.busy_until, self.vq.server
        b = len(requests)
        stages = []
        t, prev = now, None
        for st in cp.stages:
            v = first if prev is None else min((x[0] for x in st.active), key=lambda x: out[x], default=None)
            if v is None:
                v = st.pool[0][0]  # a later pool is down: send anyway, the executor fails it and the driver retries
            crosses = prev is not None and server[v] != server[prev]
            xfer = st.xfer_us_per_request * b if crosses else 0.0
            s = max(t + xfer, busy[v])
            e = s + st.latency[b]
            stages.append(StageAssignment(st.index, v, s, e, t if xfer else None, t + xfer if xfer else None))
            t, prev = e, v
        did = self.new_dispatch_id()
        self.vq.sent(did, stages)
        result.dispatches.append(Dispatch(did, model, cp.id, requests, stages, t, reserved=False))

    def report(self, dispatch_id: int, stage: int, start_us: float, end_us: float) -> None:
        self.vq.reported(dispatch_id, stage, end_us)

    def release(self, dispatch_id: int, now_us: float) -> None:
        self.vq.release(dispatch_id, now_us)

    def set_vgpu_up(self, vgpu_id: str, up: bool, now_us: float) -> None:
        self.vq.set_up(vgpu_id, up, now_us)
