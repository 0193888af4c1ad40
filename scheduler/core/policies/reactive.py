"""`reactive`: every pool batches on its own, with its own share of the SLO and no reservations.

A request is assigned to a pipeline in proportion to the planned throughputs; each stage's pool keeps
its own queue, and a batch is formed when one of the pool's vGPUs is idle: the largest batch <=
planned that finishes within the oldest request's stage deadline (arrival + SLO x the stage's
cumulative share of the pipeline's latency), waiting for more requests no later than that deadline
allows. A stage is its own Dispatch (``final`` only for the last stage); when the driver reports it,
the requests move to the next pool's queue.
"""

from __future__ import annotations

from collections import deque

from scheduler.core.api import Dispatch, Drop, RequestRow, StageAssignment, StepResult
from scheduler.core.policies.base import EPS_US, QueueingPolicy
from scheduler.core.policies.queue_model import VGpuQueues
from scheduler.core.probe import CompiledPipeline
from scheduler.core.topology import Topology


class ReactivePolicy(QueueingPolicy):
    name = "reactive"
    honours_batcher = False  # its own queue order (by deadline / per pool)

    def __init__(self, topology: Topology) -> None:
        super().__init__(topology)
        self.vq = VGpuQueues(topology)
        self.pipes: dict[str, CompiledPipeline] = {}
        self.assigned: dict[str, int] = {}
        # (pipeline id, stage) -> queue of (request, server its input is on)
        self.stage_queues: dict[tuple[str, int], deque[tuple[RequestRow, str | None]]] = {}
        self.share: dict[tuple[str, int], float] = {}  # cumulative SLO share at the end of the stage
        self.remaining_us: dict[tuple[str, int], float] = {}  # batch-1 latency from this stage on
        for pipes in self.vq.compiled.pipelines.values():
            for cp in pipes:
                self.pipes[cp.id] = cp
                self.assigned[cp.id] = 0
                b = cp.batch
                total = cp.ideal_us[b]
                acc = 0.0
                for st in cp.stages:
                    acc += st.latency[b] + st.xfer_us_per_request * b
                    self.stage_queues[(cp.id, st.index)] = deque()
                    self.share[(cp.id, st.index)] = acc / total
                    self.remaining_us[(cp.id, st.index)] = sum(
                        s.latency[cp.batches[0]] + s.xfer_us_per_request for s in cp.stages[st.index:])
        self.in_flight: dict[int, tuple[str, int, str, list[RequestRow]]] = {}

    def queue_lengths(self) -> dict[str, int]:
        """Waiting in the model's FIFO or in any stage pool's queue (between stages counts as waiting)."""
        out = super().queue_lengths()
        for (pid, _), q in self.stage_queues.items():
            m = self.pipes[pid].pipeline.model
            out[m] = out.get(m, 0) + len(q)
        return out

    def _route(self, request: RequestRow) -> None:
        pipes = self.vq.compiled.pipelines.get(request.model)
        if not pipes:
            self._unknown.append(request)
            return
        cp = min(pipes, key=lambda p: (self.assigned[p.id] + 1) / max(p.pipeline.throughput_rps, 1e-9))
        self.assigned[cp.id] += 1
        self.stage_queues[(cp.id, 0)].append((request, None))

    def step(self, now_us: float) -> StepResult:
        result = StepResult()
        for q in self.queues.values():  # the FIFO per model only feeds the pools
            while q:
                self._route(q.popleft())
        self.take_unknown(result)
        wake = None
        for key, q in self.stage_queues.items():
            if q:
                w = self._serve_pool(key, q, now_us, result)
                if w is not None and (wake is None or w < wake):
                    wake = w
        result.wake_at_us = wake
        return result

    def _serve_pool(self, key: tuple[str, int], q: deque, now: float, result: StepResult) -> float | None:
        pid, k = key
        cp = self.pipes[pid]
        st = cp.stages[k]
        slo = self.topology.slo_us[cp.pipeline.model]
        while q and q[0][0].deadline_us < now + self.remaining_us[key]:
            result.drops.append(Drop(q.popleft()[0], "deadline cannot be met"))
        out, server = self.vq.outstanding, self.vq.server
        idle = [v for v, _, _ in st.active if out[v] == 0]
        while q and idle:
            oldest, src = q[0]
            stage_deadline = oldest.arrival_us + slo * self.share[key]
            v = next((x for x in idle if server[x] == src), idle[0])
            xfer_per = st.xfer_us_per_request if src is not None and server[v] != src else 0.0
            fits = [b for b in cp.batches if now + xfer_per * b + st.latency[b] <= stage_deadline]
            b = fits[-1] if fits else cp.batches[0]
            n = len(q)
            if n < b:
                b = max((x for x in cp.batches if x <= n), default=cp.batches[0])
                latest = stage_deadline - xfer_per * b - st.latency[b]
                if latest > now + EPS_US:
                    return latest
            idle.remove(v)
            items = [q.popleft() for _ in range(min(b, n))]
            xfer = xfer_per * b
            a = StageAssignment(k, v, now + xfer, now + xfer + st.latency[b], now if xfer else None,
                                now + xfer if xfer else None)
            did = self.new_dispatch_id()
            self.vq.sent(did, [a])
            reqs = [r for r, _ in items]
            final = k == len(cp.stages) - 1
            self.in_flight[did] = (pid, k, v, reqs)
            result.dispatches.append(Dispatch(did, cp.pipeline.model, pid, reqs, [a], a.end_us, final=final,
                                              reserved=False))
        return None

    def report(self, dispatch_id: int, stage: int, start_us: float, end_us: float) -> None:
        if self.vq.reported(dispatch_id, stage, end_us) is None:
            return
        pid, k, v, reqs = self.in_flight.pop(dispatch_id)
        if k + 1 < len(self.pipes[pid].stages):
            nq = self.stage_queues[(pid, k + 1)]
            src = self.vq.server[v]
            nq.extend((r, src) for r in reqs)

    def release(self, dispatch_id: int, now_us: float) -> None:
        """An abandoned stage dispatch: its vGPU's queue shrinks and its requests go no further."""
        self.vq.release(dispatch_id, now_us)
        self.in_flight.pop(dispatch_id, None)

    def set_vgpu_up(self, vgpu_id: str, up: bool, now_us: float) -> None:
        self.vq.set_up(vgpu_id, up, now_us)
