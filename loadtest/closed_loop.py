"""A closed loop of requests always outstanding on a Triton (or sidecar) gRPC endpoint, and the CPU a server's
processes spend meanwhile: how many requests per core a server takes (benchmarks/sidecar.py's trivial-model
lines). The open-loop client, with arrivals at scheduled times, is open_loop.py."""

from __future__ import annotations

import asyncio
import time

import psutil
import tritonclient.grpc.aio as grpcaio
from tritonclient.utils import InferenceServerException


async def closed_loop(url: str, model: str, inputs: list, concurrency: int, duration_s: float,
                      connections: int = 1) -> tuple[float, int, list[float]]:
    """``concurrency`` requests always outstanding over ``connections`` gRPC connections; returns (requests/s,
    errors, latencies in s)."""
    clients = [grpcaio.InferenceServerClient(url, channel_args=[("grpc.use_local_subchannel_pool", 1)])
               for _ in range(connections)]
    done = errors = 0
    lat: list[float] = []
    end = time.perf_counter() + duration_s

    async def worker(client: grpcaio.InferenceServerClient) -> None:
        nonlocal done, errors
        while time.perf_counter() < end:
            t = time.perf_counter()
            try:
                await client.infer(model, inputs, client_timeout=10)
                lat.append(time.perf_counter() - t)
                done += 1
            except InferenceServerException as e:
                errors += 1
                if errors == 1:
                    print(f"  first error: {e}", flush=True)

    t0 = time.perf_counter()
    await asyncio.gather(*[worker(clients[i % connections]) for i in range(concurrency)])
    elapsed = time.perf_counter() - t0
    for client in clients:
        await client.close()
    return done / elapsed, errors, lat


def closed_loop_cores(url: str, model: str, pid: int, inputs: list, duration_s: float, concurrency: int = 64
                      ) -> tuple[float, int, float, float]:
    """``model`` at ``concurrency`` outstanding on the server at ``url`` after a 1 s warm-up: (requests/s, errors,
    cores its process ``pid`` and its children used meanwhile, cores of ``pid`` alone)."""
    asyncio.run(closed_loop(url, model, inputs, concurrency, 1.0))
    cpu0, own0, t0 = cpu_seconds(pid), cpu_seconds(pid, recursive=False), time.perf_counter()
    rps, errors, _ = asyncio.run(closed_loop(url, model, inputs, concurrency, duration_s))
    wall = time.perf_counter() - t0
    return rps, errors, (cpu_seconds(pid) - cpu0) / wall, (cpu_seconds(pid, recursive=False) - own0) / wall


def cpu_seconds(pid: int, recursive: bool = True) -> float:
    """CPU seconds of the process and of every process below it (serve --workers: the parent and its workers; a
    tritonserver: its Python backend stubs)."""
    procs = [psutil.Process(pid)]
    procs += procs[0].children(recursive=True) if recursive else []
    return sum(t.user + t.system for t in (p.cpu_times() for p in procs))
