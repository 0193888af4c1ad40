"""`elsa`: slack-aware dispatch (after ELSA, heterogeneity-aware scheduling without reservations).

ELSA's slack (PARIS/ELSA Eq. 1-2): ``slack = SLA - alpha * (T_wait + beta * T_est)`` where T_est is the
profiled latency of the batch on a path and T_wait the time until the path can run it: the queued work on
its vGPUs plus the remaining time of the batch running there (its profiled latency less the time it has
run; each vGPU's predicted free time, corrected by the executors' reports). SLA is what is left of the
oldest request's deadline. The batch goes to the smallest pipeline (slowest at batch 1, i.e. the least
capable hardware) with positive slack, else to the one that finishes first (least T_wait + T_est).
``alpha`` scales the whole prediction (> 1: conservative, for servers slower than profiled), ``beta`` the
new batch's own latency; 1 and 1 trust the profile. A batch is sent once its first vGPU will be free
within one batch time, so batches grow while every first vGPU is busy.
"""

from __future__ import annotations

from scheduler.core.api import Dispatch, StageAssignment, StepResult
from scheduler.core.policies.base import QueueingPolicy
from scheduler.core.policies.queue_model import VGpuQueues
from scheduler.core.probe import CompiledPipeline
from scheduler.core.topology import Topology


class ElsaPolicy(QueueingPolicy):
    name = "elsa"

    def __init__(self, topology: Topology, alpha: float = 1.0, beta: float = 1.0) -> None:
        super().__init__(topology)
        for name, x in (("alpha", alpha), ("beta", beta)):
            if not 0 < x < float("inf"):
                raise ValueError(f"elsa: {name}={x} must be a positive number (1 = trust the profile)")
        self.alpha, self.beta = alpha, beta
        self.vq = VGpuQueues(topology)
        # smallest first: the pipeline with the longest batch-1 latency is the least capable
        self.order = {m: sorted(p, key=lambda cp: -cp.ideal_us[cp.batches[0]])
                      for m, p in self.vq.compiled.pipelines.items()}

    def _predict(self, cp: CompiledPipeline, b: int, now: float) -> list[StageAssignment] | None:
        t = now
        prev = None
        out = []
        busy, server = self.vq.busy_until, self.vq.server
        for st in cp.stages:
            best = None
            d = st.latency[b]
            for v, _, srv in st.active:
                xfer = st.xfer_us_per_request * b if prev is not None and srv != server[prev] else 0.0
                s = max(t + xfer, busy[v])
                if best is None or s + d < best[2]:
                    best = (v, s, s + d, xfer)
            if best is None:
                return None
            v, s, e, xfer = best
            out.append(StageAssignment(st.index, v, s, e, t if xfer else None, t + xfer if xfer else None))
            t, prev = e, v
        return out

    def step(self, now_us: float) -> StepResult:
        result = StepResult()
        self.take_unknown(result)
        for model, q in self.queues.items():
            self.drop_expired(q, now_us, result)
            pipes = self.order[model]
            while q and pipes:
                oldest = q[0]
                fallback = None
                chosen = None
                for cp in pipes:
                    b = max((x for x in cp.batches if x <= len(q)), default=cp.batches[0])
                    path = self._predict(cp, b, now_us)
                    if path is None:
                        continue
                    t_est = cp.ideal_us[b]
                    t_wait = path[-1].end_us - now_us - t_est
                    if oldest.deadline_us - now_us - self.alpha * (t_wait + self.beta * t_est) > 0:
                        chosen = (cp, b, path)
                        break
                    if fallback is None or path[-1].end_us < fallback[2][-1].end_us:
                        fallback = (cp, b, path)
                chosen = chosen or fallback
                if chosen is None:
                    break
                cp, b, path = chosen
                first = path[0]
                if first.start_us > now_us + (first.end_us - first.start_us):
                    break  # its first vGPU is still busy: let the batch grow
                did = self.new_dispatch_id()
                self.vq.sent(did, path)
                result.dispatches.append(Dispatch(did, model, cp.id, self.take(q, min(b, len(q))), path,
                                                  path[-1].end_us, reserved=False))
        result.wake_at_us = self.queue_wake(result.wake_at_us)
        return result

    def report(self, dispatch_id: int, stage: int, start_us: float, end_us: float) -> None:
        self.vq.reported(dispatch_id, stage, end_us)

    def release(self, dispatch_id: int, now_us: float) -> None:
        self.vq.release(dispatch_id, now_us)

    def set_vgpu_up(self, vgpu_id: str, up: bool, now_us: float) -> None:
        self.vq.set_up(vgpu_id, up, now_us)
