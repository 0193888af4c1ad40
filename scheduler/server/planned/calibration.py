"""Calibration: how long a stage takes from being sent to computing (lead) and from computing to its response
back at the sidecar (tail), measured through the executor's normal stage path with batches of zeros.

The core's stage intervals are compute intervals, but a stage computes only some time after the sidecar
sends it (serialisation, transfer, the backend's input copy). The sidecar sends each stage that much
ahead of its reserved start and steps the core that much ahead of the real clock, so reservations match
when computes really run. The lead overlaps the previous batch's compute on a busy server, so it does not
add to the vGPU's occupancy; the tail does (the next stage, the answer and the server's next compute wait
for it), so it joins each stage's latency in the core's tables.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from model_repository_gen.manifest import ModelInfo, PipelineInfo
from poolpipe_common.overheads import driver_margin_us
from scheduler.server.planned.calls import now_us
from scheduler.server.planned.executor import LiveExecutor
from scheduler.server.planned.stage_io import HopTensor, StageTiming

CALIBRATION_RUNS = 4  # the first is warm-up; the median of the rest is used
CALIBRATION_TIMEOUT_S = 10.0


class NotCalibratable(Exception):
    """The pipeline cannot be measured now (a stage has no vGPU in service, or a server sent no timestamps)."""


@dataclass(frozen=True)
class StageOverheads:
    """Per stage of one pipeline: batch -> lead (send -> compute start) and tail (compute end -> response), µs."""

    lead_us: list[dict[int, float]]
    tail_us: list[dict[int, float]]


async def _one_run(ex: LiveExecutor, p: PipelineInfo, model: ModelInfo, vgpus: list[str], batch: int
                   ) -> np.ndarray:
    hops = [HopTensor(t, [batch, *t.shape], bytes(batch * t.bytes_per_request()))
            for t in model.inputs]
    deadline = now_us() + CALIBRATION_TIMEOUT_S * 1e6
    timings: list[StageTiming] = []
    try:
        for k, (stage, v) in enumerate(zip(p.stages, vgpus)):
            nxt = vgpus[k + 1] if k + 1 < len(vgpus) else None
            hops, timing = await ex.run_stage(v, stage, hops, nxt, deadline, f"calibrate.{p.id}.{k}")
            if timing is None:
                raise NotCalibratable(f"stage {k} on {v} returned no compute timestamps")
            timings.append(timing)
    finally:
        ex.release(hops)
    return np.array([(t.start_us - t.ready_us, t.recv_us - t.end_us) for t in timings])


async def calibrate_pipeline(ex: LiveExecutor, p: PipelineInfo, model: ModelInfo, prefer: str | None = None
                             ) -> StageOverheads:
    """Measure at batch 1 and the planned batch (linear in between) on ``prefer`` (a vGPU that just joined)
    where it serves a stage, else on the first vGPU in service of each pool.
    Raises NotCalibratable, or executor.StageFault when a server fails meanwhile."""
    servers = ex.fleet.servers
    vgpus = [prefer if prefer in s.vgpus and servers[prefer].up else next((v for v in s.vgpus if servers[v].up), None)
             for s in p.stages]
    if None in vgpus:
        raise NotCalibratable("a stage has no vGPU in service")
    measured: dict[int, np.ndarray] = {}
    for b in sorted({1, p.batch}):
        runs = [await _one_run(ex, p, model, vgpus, b) for _ in range(CALIBRATION_RUNS)]  # type: ignore[arg-type]
        measured[b] = np.median(np.stack(runs[1:] if len(runs) > 1 else runs), axis=0)
    span = max(p.batch - 1, 1)
    lead: list[dict[int, float]] = []
    tail: list[dict[int, float]] = []
    for k, stage in enumerate(p.stages):
        batches = [b for b in stage.latency_us if b <= p.batch]
        for i, out in ((0, lead), (1, tail)):
            lo, hi = float(measured[1][k][i]), float(measured[max(measured)][k][i])
            out.append({b: max(0.0, lo + (hi - lo) * (b - 1) / span) for b in batches})
    return StageOverheads(lead, tail)


async def recalibrate_vgpu(ex: LiveExecutor, p: PipelineInfo, vgpu: str, previous: StageOverheads
                           ) -> StageOverheads:
    """A vGPU that rejoined: measure only the stages of ``p`` it serves, on it alone (zeros as their inputs), and
    keep ``previous`` for the others, so that no unreserved batch runs on a vGPU the core has planned for."""
    lead = [dict(x) for x in previous.lead_us]
    tail = [dict(x) for x in previous.tail_us]
    for k, stage in enumerate(p.stages):
        if vgpu not in stage.vgpus:
            continue
        measured: dict[int, np.ndarray] = {}
        for b in sorted({1, p.batch}):
            runs = []
            for _ in range(CALIBRATION_RUNS):
                hops = [HopTensor(t, [b, *t.shape], bytes(b * t.bytes_per_request()))
                        for t in stage.inputs]
                out, t = await ex.run_stage(vgpu, stage, hops, None, now_us() + CALIBRATION_TIMEOUT_S * 1e6,
                                            f"calibrate.{p.id}.{k}")
                ex.release(out)
                if t is None:
                    raise NotCalibratable(f"stage {k} on {vgpu} returned no compute timestamps")
                runs.append((t.start_us - t.ready_us, t.recv_us - t.end_us))
            measured[b] = np.median(np.array(runs[1:]), axis=0)
        lo, hi = measured[1], measured[max(measured)]
        span = max(p.batch - 1, 1)
        for b in lead[k]:
            lead[k][b] = max(0.0, float(lo[0] + (hi[0] - lo[0]) * (b - 1) / span))
            tail[k][b] = max(0.0, float(lo[1] + (hi[1] - lo[1]) * (b - 1) / span))
    return StageOverheads(lead, tail)


def no_slack_warning(p: PipelineInfo, slo_us: float, o: StageOverheads, front_us: float = 0.0,
                     transfer_us: float = 0.0) -> str | None:
    """One line when the calibrated pipeline, at its smallest batch with its transfers between servers
    (``transfer_us``), leaves no slack under its SLO (less the driver's margin and the way outside the sidecar's
    clock, ``front_us``): then every request to it is shed as 'deadline cannot be met', and the plan should be made
    again with the costs measured here."""
    batches = set.intersection(*(set(s.latency_us) for s in p.stages))
    if not batches:
        return None
    b = min(batches)
    total = transfer_us + sum(s.latency_us[b] + lead.get(b, 0.0) + tail.get(b, 0.0)
                              for s, lead, tail in zip(p.stages, o.lead_us, o.tail_us))
    budget = slo_us - driver_margin_us(slo_us) - front_us
    if total <= budget:
        return None
    front = f" and {front_us / 1e3:.1f} ms outside the sidecar's clock (serve --front-us)" if front_us else ""
    moved = f", {transfer_us / 1e3:.1f} ms of it transfers between servers" if transfer_us else ""
    return (f"pipeline {p.id}: calibrated latency {total / 1e3:.1f} ms at batch {b} (compute + per-stage lead and "
            f"tail{moved}) leaves no slack under its SLO {slo_us / 1e3:.1f} ms less the driver's margin "
            f"{driver_margin_us(slo_us) / 1e3:.1f} ms{front}, so its requests will be shed; re-plan with the costs "
            f"measured here (poolpipe serve --overheads-out FILE, then poolpipe plan --overheads FILE) or raise the "
            f"SLO")
