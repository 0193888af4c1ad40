"""`fifs`: first idle vGPU, batch of up to the planned size, no deadlines (Triton's default dynamic batcher).

A batch leaves when some pipeline's first pool has an idle vGPU; later stages go to the vGPU of their
pool with the fewest outstanding batches. Requests are dropped only once their deadline has passed.
"""

from __future__ import annotations

from scheduler.core.api import Dispatch, StageAssignment, StepResult
from scheduler.core.policies.base import QueueingPolicy
from scheduler.core.policies.queue_model import VGpuQueues
from scheduler.core.topology import Topology


class FifsPolicy(QueueingPolicy):
    name = "fifs"

    def __init__(self, topology: Topology) -> None:
        super().__init__(topology)
        self.vq = VGpuQueues(topology)
        self._rr = {m: 0 for m in topology.pipelines}

    def step(self, now_us: float) -> StepResult:
        result = StepResult()
        self.take_unknown(result)
        out = self.vq.outstanding
        for model, q in self.queues.items():
            self.drop_expired(q, now_us, result)
            pipes = self.vq.compiled.pipelines[model]
            while q and pipes:
                chosen = None
                for j in range(len(pipes)):
                    cp = pipes[(self._rr[model] + j) % len(pipes)]
                    idle = next((v for v, _, _ in cp.stages[0].active if out[v] == 0), None)
                    if idle is not None:
                        chosen = (cp, idle)
                        self._rr[model] = (self._rr[model] + j + 1) % len(pipes)
                        break
                if chosen is None:
                    break
                cp, first = chosen
                b = max(x for x in cp.batches if x <= len(q)) if cp.batches[0] <= len(q) else cp.batches[0]
                stages = []
                t = now_us
                prev = None
                for st in cp.stages:
                    if prev is None:
                        v = first
                    else:
                        v = min((x[0] for x in st.active), key=lambda x: out[x], default=None)
                        if v is None:
                            break
                    crosses = prev is not None and self.vq.server[v] != self.vq.server[prev]
                    xfer = st.xfer_us_per_request * b if crosses else 0.0
                    s = max(t + xfer, self.vq.busy_until[v])
                    e = s + st.latency[b]
                    stages.append(StageAssignment(st.index, v, s, e, t if xfer else None, t + xfer if xfer else None))
                    t, prev = e, v
                if len(stages) != len(cp.stages):
                    break
                did = self.new_dispatch_id()
                self.vq.sent(did, stages)
                result.dispatches.append(Dispatch(did, model, cp.id, self.take(q, min(b, len(q))), stages, t,
                                                  reserved=False))
        result.wake_at_us = self.queue_wake(result.wake_at_us)
        return result

    def report(self, dispatch_id: int, stage: int, start_us: float, end_us: float) -> None:
        self.vq.reported(dispatch_id, stage, end_us)

    def release(self, dispatch_id: int, now_us: float) -> None:
        self.vq.release(dispatch_id, now_us)

    def set_vgpu_up(self, vgpu_id: str, up: bool, now_us: float) -> None:
        self.vq.set_up(vgpu_id, up, now_us)
