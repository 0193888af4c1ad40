"""A light open-loop client for benchmarks: requests leave at scheduled times (not when answers come back),
spread round-robin over one or more Triton/sidecar gRPC endpoints (as a Kubernetes Service would), and
each outcome is recorded against the SLO. Locust (`poolpipe loadtest`) is the user-facing load generator;
this one costs less CPU per request, which matters when it shares two cores with the system under test."""

from __future__ import annotations

import asyncio
import gc
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace

import numpy as np
import tritonclient.grpc.aio as grpcaio
from tritonclient.grpc import InferInput
from tritonclient.utils import InferenceServerException, triton_to_np_dtype

from loadtest.host_cpu import busy_cores, cpu_jiffies
from poolpipe_common.overheads import SIDECAR_LATENCY_PARAMETER
from scheduler.server.common.event_loop import new_loop


@dataclass(frozen=True)
class RunResult:
    offered: int
    met: int  # answered within the SLO
    late: int  # answered after it
    errors: int  # answered with an error (shed, failed)
    latencies_ms: tuple[float, ...]  # of answered requests
    first_error: str | None
    send_lag_ms_p99: float  # how late requests left after their scheduled time (the client's own lateness)
    # per answer that reported the sidecar's own time (poolpipe_common.overheads.SIDECAR_LATENCY_PARAMETER): the
    # client's latency less it, the way outside the sidecar's clock (Overheads.with_front_samples takes them)
    front_us: tuple[float, ...] = ()
    host_busy_cores: float | None = None  # the host's CPUs kept busy over the run (loadtest.host_cpu), all processes

    @property
    def attainment(self) -> float:
        return self.met / self.offered if self.offered else 1.0

    def latency_ms(self, q: float) -> float | None:
        return float(np.percentile(self.latencies_ms, q)) if self.latencies_ms else None


async def _inputs(client: grpcaio.InferenceServerClient, model: str) -> list[InferInput]:
    """Zero tensors of the model's input shapes (batch 1), from its metadata."""
    meta = await client.get_model_metadata(model)
    out = []
    for t in meta.inputs:
        shape = [1, *[d if d > 0 else 1 for d in list(t.shape)[1:]]]
        inp = InferInput(t.name, shape, t.datatype)
        inp.set_data_from_numpy(np.zeros(shape, dtype=triton_to_np_dtype(t.datatype)))
        out.append(inp)
    return out


@contextmanager
def no_collector_pauses() -> Iterator[None]:
    """No cyclic garbage collection while a run measures: a full collection over the client's heap (thousands of
    request tasks) paused its event loop for 57 ms in a 6 s run at 385 req/s, and every answer arriving meanwhile
    was counted late against the system under test. The heap is frozen and the collector off until the run ends
    (its cycles are few and short-lived; they are collected after)."""
    enabled, frozen = gc.isenabled(), gc.get_freeze_count()
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        if not frozen:  # what the caller froze itself stays frozen
            gc.unfreeze()
        if enabled:
            gc.enable()
        gc.collect()


async def run_open_loop(urls: Sequence[str], model: str, arrivals_s: Sequence[float], slo_ms: float,
                        timeout_s: float = 10.0) -> RunResult:
    """Send one batch-1 request of ``model`` at each time of ``arrivals_s`` (seconds from now), endpoint by
    endpoint in turn; wait for every answer (or ``timeout_s`` past the last send)."""
    clients = [grpcaio.InferenceServerClient(u) for u in urls]
    try:
        inputs = await _inputs(clients[0], model)
        latencies: list[float] = []
        lags: list[float] = []
        counts = {"met": 0, "late": 0, "errors": 0}
        first_error: list[str] = []
        fronts: list[float] = []

        async def one(i: int) -> None:
            t0 = time.perf_counter()
            try:
                result = await clients[i % len(clients)].infer(model, inputs, client_timeout=timeout_s)
            except InferenceServerException as e:
                counts["errors"] += 1
                if not first_error:
                    first_error.append(e.message() or str(e))
                return
            ms = (time.perf_counter() - t0) * 1e3
            latencies.append(ms)
            counts["met" if ms <= slo_ms else "late"] += 1
            params = result.get_response().parameters
            if SIDECAR_LATENCY_PARAMETER in params:
                fronts.append(ms * 1e3 - params[SIDECAR_LATENCY_PARAMETER].int64_param)

        start = time.perf_counter()
        tasks = []
        for i, t in enumerate(arrivals_s):
            wait = start + t - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
            lags.append(max(0.0, (time.perf_counter() - start - t) * 1e3))
            tasks.append(asyncio.ensure_future(one(i)))
        await asyncio.gather(*tasks)
    finally:
        for c in clients:
            await c.close()
    return RunResult(len(arrivals_s), counts["met"], counts["late"], counts["errors"], tuple(latencies),
                     first_error[0] if first_error else None, float(np.percentile(lags, 99)) if lags else 0.0,
                     tuple(fronts))


def open_loop(urls: Sequence[str], model: str, arrivals_s: Sequence[float], slo_ms: float,
              timeout_s: float = 10.0) -> RunResult:
    """Blocking wrapper of run_open_loop (its own event loop), without the client's own collector pauses, on the
    sidecar's loop whose timers end on time: on asyncio's own, each send left up to 2 ms after its arrival time,
    which bunched arrivals less than that apart (docs/serving.md, "Timers that end on time")."""
    with no_collector_pauses(), asyncio.Runner(loop_factory=new_loop) as runner:
        before = cpu_jiffies()
        r = runner.run(run_open_loop(urls, model, arrivals_s, slo_ms, timeout_s))
        return replace(r, host_busy_cores=busy_cores(before, cpu_jiffies(), os.cpu_count() or 1))
