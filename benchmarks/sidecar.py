"""The sidecar against Triton's own dynamic batcher, on the same zoo model, machine and offered load.

(a) clients straight to one tritonserver serving the whole model with Triton's dynamic batcher (the
    ``ensembles/`` baseline: what a Triton user runs today), its engine given every core;
(b) clients through ``poolpipe serve`` in front of the generated deployment of the same model (three
    partitions on five tritonservers over two host classes on loopback, runtime/testbed.py), planned at the
    baseline's largest batch (MAX_BATCH).

Printed: the highest Poisson load each sustains at >= 99 % SLO attainment (both up one ladder of rates, each rate
run on (a), then on (b), so that the host's speed drifting weighs on both alike) and their ratio; p50/p99
latency at low load through the sidecar and straight to Triton (the sidecar's planned path waits for
batches by design, so its pure proxy cost is also shown: one request at a time on a trivial model,
pass-through mode against the same Triton, beside a bare Python gRPC proxy: the floor under any proxy in Python,
and through the native front end, which forwards pass-through models from C: ``serve --passthrough-http``),
and straight to Triton computing on one thread as each stage server does, with no queue delay (what the sidecar's
path adds per stage), beside the same stage calls chained by a bare Python client (what the calls alone cost);
and the sidecar's maximum request rate on a trivial planned model with the CPU its own process uses, beside a
bare servicer that answers at once under the same client (the most requests per core on Python's gRPC stack); then the
same with ``serve --workers 2`` (a pool of two vGPUs, one per worker; clients on 16 connections, since the kernel
spreads connections over the workers) with the CPU of all its processes, against Triton direct under the same
clients. The low-load points and the one-request-at-a-time points are measured in turns, each system a few
seconds (or a few dozen requests) at a time with the order rotating (loadtest/side_by_side.py), so that the host's
speed drifting weighs on all alike. Where the native front end builds, the same sidecars also serve through it
(``serve --native-grpc-port``: Triton's own gRPC front end hands each request to the sidecar over a Unix socket),
and the highest load, the low load and the trivial model's rate and CPU (counting the front tritonserver)
are printed for it too.

    .venv/bin/python benchmarks/sidecar.py            # about 3-4 minutes on 2 cores
    .venv/bin/python benchmarks/sidecar.py --quick    # fewer, shorter points
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psutil
import tritonclient.grpc as grpcclient

from backends import native_front
from ensembles.triton_baseline import start_baseline, write_whole_model
from loadtest.closed_loop import closed_loop, closed_loop_cores, cpu_seconds
from loadtest.grpc_floor import bare_answerer, bare_proxy, chained_stage_calls
from loadtest.open_loop import no_collector_pauses
from loadtest.side_by_side import highest_sustained, one_at_a_time_in_turns, poisson_in_turns
from model_repository_gen import triton_config as tc
from model_repository_gen.generate import generate
from plans.plan_json import ModelPlan, PartitionPlan, PipelinePlan, Plan
from plans.spec.planning_spec import ClusterSpec
from poolpipe_common.net import free_port
from profiling.profile import Block, DeviceTiming, Profile
from runtime.launch import Deployment
from runtime.sidecar_process import SidecarProcess
from runtime.testbed import STAGES, build_deployment, write_trivial_onnx

MODEL = "resnet"
MAX_BATCH = 8  # the largest batch either side runs (Triton's max_batch_size; the plan's batch)


def p50_p99_ms(lat: list[float]) -> tuple[float, float]:
    return float(np.percentile(lat, 50) * 1e3), float(np.percentile(lat, 99) * 1e3)


def trivial_deployment(work: Path, gpus: int = 1) -> tuple[Path, Path]:
    """A one-partition plan of a Relu on 16 floats on a pool of ``gpus`` vGPUs: the sidecar's own cost dominates."""
    path = write_trivial_onnx(work / "trivial.onnx")
    batches = (1, 2, 4, 8, 16, 32)
    profile = Profile("trivial", (Block("block0", 64, ("y",)),),
                      {"A": {1: DeviceTiming(batches, np.array([[200.0 + 10 * b for b in batches]]))}},
                      input_bytes=64, input_tensors=("x",))
    part = PartitionPlan((0, 1), "A", 1, 32, gpus, profile.latency_us("A", 1, 32))
    pipe = PipelinePlan((part,), gpus * 32 / part.latency_us * 1e6, part.latency_us)
    plan = Plan("bench", "manual", 0.0, ClusterSpec({"A": gpus}, {"A": gpus}, 10.0, {"A": 1}),
                (ModelPlan("trivial", 1_000_000.0, pipe.throughput_rps, (pipe,), profile),))
    cluster = work / f"trivial-cluster{gpus}.json"
    cluster.write_text(json.dumps({"hosts": [{"name": "hostT", "address": "127.0.0.1", "gpu_type": "A", "gpus": gpus,
                                              "bandwidth_gbps": 10, "device": "cpu", "cpu_cores": gpus,
                                              "base_port": 0}]}))
    generate(plan, {"trivial": path}, cluster, work / f"trivial-deploy{gpus}")
    return work / f"trivial-deploy{gpus}", path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--slo-ms", type=float, default=200.0)
    args = ap.parse_args()
    duration = 2.0 if args.quick else 4.0
    low_s = 12.0  # the low-load points: 60 requests at 5 rps, enough for a p50 that does not hang on a few
    # up to where Triton itself misses on this machine: a ratio against a baseline that held the top rate would
    # flatter the sidecar
    rates = [20, 40, 60, 80, 100, 130, 160, 200, 250, 300, 350] if args.quick else \
        [10, 20, 30, 40, 50, 60, 70, 80, 100, 120, 140, 160, 180, 200, 230, 260, 300, 350, 400]
    slo_s = args.slo_ms / 1e3
    x = np.random.default_rng(0).standard_normal((1, 3, 112, 112)).astype(np.float32)
    inp = grpcclient.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)

    # the load clients below run in this process: no pauses of their own collector counted against a system
    with no_collector_pauses(), tempfile.TemporaryDirectory(prefix="poolpipe-bench-sidecar-") as tmp:
        work = Path(tmp)
        # the plan's batch is the baseline's largest: neither side is given larger batches than the other
        deploy, onnx_path, manifest = build_deployment(work / "tb", name=MODEL, slo_us=args.slo_ms * 1e3,
                                                       batch=MAX_BATCH)
        repo = work / "baseline"
        write_whole_model(repo, onnx_path, MODEL, MAX_BATCH, tc.DynamicBatching((4, MAX_BATCH), 5000),
                          settings=tc.BackendSettings(engine="ort", intra_op_threads=os.cpu_count() or 2))
        # What the sidecar's path adds over calling Triton: the same model computing on one thread, as each stage
        # server of the testbed does (cpu_cores 1 per host), and sent on at once (no queue delay). At low load the
        # baseline above waits up to 5 ms for a preferred batch and computes alone on two threads (2.9 ms, against
        # 5.6 on one, in-process): neither is the sidecar's to add or save.
        repo1 = work / "baseline-one-thread"
        write_whole_model(repo1, onnx_path, MODEL, MAX_BATCH, tc.DynamicBatching((), 0),
                          settings=tc.BackendSettings(engine="ort", intra_op_threads=1))
        print(f"model {MODEL} (zoo), SLO {args.slo_ms:.0f} ms, {os.cpu_count()} cores, Poisson load "
              f"{duration:.0f} s per point\n")

        print("(a) Triton dynamic batcher, whole model, one server, and (b) poolpipe sidecar, 3 partitions on 5 "
              "tritonservers (2 host classes), each rate in turn:", flush=True)
        with start_baseline(repo, log_path=work / "baseline.log") as triton, \
                Deployment(deploy, check_hardware=False, log_dir=work / "logs"), \
                SidecarProcess(manifest=deploy, log_path=work / "sidecar.log", extra_args=native_args()) as sc, \
                start_baseline(repo1, log_path=work / "baseline-one-thread.log") as triton1, \
                bare_proxy(triton1.grpc_url) as bare_url:  # the front hop's floor with this input
            targets = [("triton", triton.grpc_url), ("sidecar", sc.grpc_url)]
            if NATIVE:
                targets.append(("native", native_url(sc)))
            best = highest_sustained(targets, MODEL, [inp], rates, duration, slo_s)
            base_max, side_max = best["triton"], best["sidecar"]
            # the low-load points in turns (each a third of low_s, the order rotating), so that no system is
            # measured in a slower minute than the others
            low = poisson_in_turns([*targets, ("triton1", triton1.grpc_url), ("bare1", bare_url)], MODEL, [inp], 5,
                                   low_s, slo_s, seed=5)
            # the floor of the planned path: its stage calls chained by a bare client, no sidecar
            chained, _ = asyncio.run(chained_stage_calls(manifest, MODEL, x, int(5 * low_s)))
        low_direct, low_side, low_native = low["triton"], low["sidecar"], low.get("native")
        low_direct1, low_bare1 = low["triton1"], low["bare1"]

        print("(c) trivial planned model (Relu on 16 floats, one tritonserver), 64 requests outstanding:", flush=True)
        tdeploy, tpath = trivial_deployment(work)
        t_in = grpcclient.InferInput("x", [1, 16], "FP32")
        t_in.set_data_from_numpy(np.ones((1, 16), np.float32))
        trepo = work / "trivial-baseline"
        write_whole_model(trepo, tpath, "trivial", 32, tc.DynamicBatching((8, 16, 32), 1000),
                          settings=tc.BackendSettings(engine="ort", intra_op_threads=1))
        with start_baseline(trepo, log_path=work / "trivial-baseline.log") as triton:
            # its CPU too: what Triton's front end, dynamic batcher and engine spend per request together
            direct_rps, _, direct_cores, _ = closed_loop_cores(triton.grpc_url, "trivial", triton.proc.pid, [t_in],
                                                               duration)
            # The proxy's own latency: one request at a time, straight, through the sidecar (pass-through), through
            # the same sidecar forwarding from C on its native port (serve --passthrough-http), and through a bare
            # Python gRPC proxy, in turns of a few dozen requests each
            nargs = ("--passthrough-http", triton.http_url, *native_args()) if NATIVE else ()
            with SidecarProcess(passthrough=triton.grpc_url, log_path=work / "proxy.log", extra_args=nargs) as proxy, \
                    bare_proxy(triton.grpc_url) as bare_url:  # the floor under any proxy on Python's gRPC stack
                seq = asyncio.run(one_at_a_time_in_turns(
                    [("direct", triton.grpc_url), ("proxy", proxy.grpc_url), ("bare", bare_url),
                     *([("native", native_url(proxy))] if NATIVE else [])], "trivial", [t_in], 2 * duration))
        seq_direct, seq_proxy, seq_bare, seq_native = seq["direct"], seq["proxy"], seq["bare"], seq.get("native")
        with Deployment(tdeploy, check_hardware=False, log_dir=work / "tlogs"), \
                SidecarProcess(manifest=tdeploy, log_path=work / "tsidecar.log", extra_args=native_args()) as sc:
            side_rps, side_err, side_cores, _ = closed_loop_cores(sc.grpc_url, "trivial", sc.proc.pid, [t_in], duration)
            # the same sidecar through Triton's front end: its CPU counts the front tritonserver (a child)
            nat = closed_loop_cores(native_url(sc), "trivial", sc.proc.pid, [t_in], duration) if NATIVE else None
        with bare_answerer() as (answerer_url, answerer_pid):  # the most any server on grpc.aio takes per core
            floor_rps, _, floor_cores, _ = closed_loop_cores(answerer_url, "trivial", answerer_pid, [t_in], duration)
        workers = trivial_workers(work, trepo, t_in, duration)

    print("\n=== results ===")
    ratio = f"{side_max / base_max:.2f}x" if base_max else "n/a (baseline sustained none of the rates)"
    print(f"highest load at >= 99% SLO attainment: Triton dynamic batcher {base_max:.0f} rps, "
          f"poolpipe sidecar {side_max:.0f} rps, ratio sidecar/Triton {ratio}")
    if NATIVE:
        n_ratio = f"{best['native'] / base_max:.2f}x" if base_max else "n/a"
        print(f"  through the native front end (serve --native-grpc-port): poolpipe sidecar {best['native']:.0f} rps, "
              f"ratio sidecar/Triton {n_ratio}")
    print(f"low load (5 rps) latency p50/p99: Triton direct {low_direct.p50_ms:.1f}/{low_direct.p99_ms:.1f} ms, "
          f"sidecar planned {low_side.p50_ms:.1f}/{low_side.p99_ms:.1f} ms "
          f"(added {low_side.p50_ms - low_direct.p50_ms:+.1f}/{low_side.p99_ms - low_direct.p99_ms:+.1f} ms; "
          "includes waiting for a batch up to the SLO)")
    added1 = low_side.p50_ms - low_direct1.p50_ms
    print(f"  the same model on one thread as each stage server computes, no queue delay: Triton direct "
          f"{low_direct1.p50_ms:.1f}/{low_direct1.p99_ms:.1f} ms; the sidecar adds {added1:+.1f}/"
          f"{low_side.p99_ms - low_direct1.p99_ms:+.1f} ms, {added1 / len(STAGES):+.2f} ms p50 per stage "
          f"({len(STAGES)} stages)")
    c50, c99 = p50_p99_ms(chained)
    print(f"  its {len(STAGES)} stage calls chained by a bare Python gRPC client, no sidecar (raw bytes, each pool's "
          f"first vGPU; loadtest/grpc_floor.py): {c50:.1f}/{c99:.1f} ms, "
          f"{(c50 - low_direct1.p50_ms) / len(STAGES):+.2f} ms p50 per stage; the sidecar adds "
          f"{low_side.p50_ms - c50:+.1f} ms p50 beyond them, of which a bare Python gRPC proxy's hop with this input "
          f"is {low_bare1.p50_ms - low_direct1.p50_ms:+.1f} ms (the rest: its decisions and waits)")
    if low_native is not None:
        n_added = low_native.p50_ms - low_direct1.p50_ms
        print(f"  through the native front end (serve --native-grpc-port): {low_native.p50_ms:.1f}/"
              f"{low_native.p99_ms:.1f} ms; adds {n_added:+.1f} ms p50 over the one-thread Triton, "
              f"{n_added / len(STAGES):+.2f} ms per stage")
    (d50, d99), (p50, p99) = p50_p99_ms(seq_direct), p50_p99_ms(seq_proxy)
    print(f"sidecar proxy cost (trivial model, one request at a time) p50/p99: Triton direct {d50:.2f}/{d99:.2f} ms, "
          f"through the sidecar (pass-through) {p50:.2f}/{p99:.2f} ms (added {p50 - d50:+.2f}/{p99 - d99:+.2f} ms)")
    b50, b99 = p50_p99_ms(seq_bare)
    print(f"  a bare Python gRPC proxy (grpc.aio, raw bytes, nothing else; loadtest/grpc_floor.py) adds "
          f"{b50 - d50:+.2f}/{b99 - d99:+.2f} ms: the floor under any proxy on Python's gRPC stack here; the sidecar's "
          f"pass-through adds {p50 - b50:+.2f} ms p50 beyond it")
    if seq_native is not None:
        n50, n99 = p50_p99_ms(seq_native)
        print(f"  through the native front end (serve --native-grpc-port --passthrough-http: Triton's front end "
              f"forwards to the pass-through Triton over HTTP from C, no Python on the path): {n50:.2f}/{n99:.2f} ms "
              f"(added {n50 - d50:+.2f}/{n99 - d99:+.2f} ms)")
    print(f"trivial model, 64 outstanding: sidecar {side_rps:.0f} req/s ({side_err} errors) using "
          f"{side_cores:.2f} of {os.cpu_count()} cores; Triton direct with dynamic batcher {direct_rps:.0f} req/s; "
          f"ratio {side_rps / direct_rps:.2f}x")
    per_req_us = side_cores / side_rps * 1e6
    print(f"  per sidecar core {side_rps / side_cores / direct_rps:.2f}x Triton direct ({per_req_us:.0f} "
          f"us of CPU per request); a bare grpc.aio servicer that answers at once (nothing forwarded or computed; "
          f"loadtest/grpc_floor.py), same client: {floor_rps:.0f} req/s using {floor_cores:.2f} cores, "
          f"{floor_cores / floor_rps * 1e6:.0f} us per request, per core {floor_rps / floor_cores / direct_rps:.2f}x: "
          "the most a server on Python's gRPC stack takes here")
    if nat is not None:
        n_rps, n_err, n_cores, n_own = nat
        print(f"  through the native front end (serve --native-grpc-port: Triton's gRPC front end hands each request "
              f"to the sidecar over a Unix socket): {n_rps:.0f} req/s ({n_err} errors) using {n_cores:.2f} cores "
              f"(the sidecar and its front tritonserver); ratio {n_rps / direct_rps:.2f}x; per sidecar core "
              f"{n_rps / n_cores / direct_rps:.2f}x ({n_cores / n_rps * 1e6:.0f} us of CPU per request: "
              f"{n_own / n_rps * 1e6:.0f} in the sidecar's process, {(n_cores - n_own) / n_rps * 1e6:.0f} in the "
              "front tritonserver)")
    else:
        print("  native front end: not built here (no C compiler); skipped")
    print(f"  Triton direct meanwhile used {direct_cores:.2f} cores ({direct_cores / direct_rps * 1e6:.0f} us of CPU "
          f"per request): per core {direct_rps / max(direct_cores, 1e-9):.0f} req/s")
    (w_direct, w_direct_cores), w, wn = workers
    print(f"trivial model, {OUTSTANDING} outstanding on {CONNECTIONS} connections, serve --workers 2: sidecar "
          f"{w.rps:.0f} req/s ({w.errors} errors) using {w.cores:.2f} of {os.cpu_count()} cores (all its processes); "
          f"Triton direct with dynamic batcher {w_direct:.0f} req/s (same clients); ratio {w.rps / w_direct:.2f}x; "
          f"per sidecar core {w.rps / max(w.cores, 1e-9) / w_direct:.2f}x (meanwhile the client used "
          f"{w.others[0]:.2f} cores, the two tritonservers {w.others[1]:.2f}; requests per worker "
          f"{'/'.join(f'{n:.0f}' for n in w.split)})")
    if wn is not None:
        print(f"  through each worker's native front end (serve --workers 2 --native-grpc-port: one port, a front "
              f"tritonserver per worker): {wn.rps:.0f} req/s ({wn.errors} errors) using {wn.cores:.2f} cores (the "
              f"workers and their front tritonservers); ratio {wn.rps / w_direct:.2f}x; per sidecar core "
              f"{wn.rps / max(wn.cores, 1e-9) / w_direct:.2f}x (client {wn.others[0]:.2f} cores, the two "
              f"tritonservers {wn.others[1]:.2f}; requests per worker {'/'.join(f'{n:.0f}' for n in wn.split)})")
    print(f"  Triton direct meanwhile used {w_direct_cores:.2f} cores ({w_direct_cores / w_direct * 1e6:.0f} us of "
          f"CPU per request): per core {w_direct / max(w_direct_cores, 1e-9):.0f} req/s")
    return 0


OUTSTANDING, CONNECTIONS = 64, 16
NATIVE = native_front.library() is not None  # serve --native-grpc-port can run here


def native_args() -> tuple[str, ...]:
    """serve flags for the sidecar also to serve through its native front end (on a free port), where it builds."""
    return ("--native-grpc-port", str(free_port("127.0.0.1"))) if NATIVE else ()


def native_url(sc: SidecarProcess) -> str:
    return f"127.0.0.1:{sc.extra_args[sc.extra_args.index('--native-grpc-port') + 1]}"


@dataclass
class WorkersRun:
    """One closed loop through ``serve --workers 2``: req/s, errors, the cores of all its processes (the workers'
    front-end tritonservers included), the client's and the stage tritonservers' cores, each worker's requests."""

    rps: float
    errors: int
    cores: float
    others: tuple[float, float]
    split: list[float]


def trivial_workers(work: Path, trepo: Path, t_in: grpcclient.InferInput, duration: float
                    ) -> tuple[tuple[float, float], WorkersRun, WorkersRun | None]:
    """``serve --workers 2`` on the trivial model over a pool of two vGPUs, and Triton direct, both under
    OUTSTANDING requests on CONNECTIONS connections: ((direct req/s, its cores), the sidecar's ports, the native
    front ends' port where they build)."""
    print("(d) trivial planned model, serve --workers 2 (one vGPU each), "
          f"{OUTSTANDING} outstanding on {CONNECTIONS} connections:", flush=True)
    with start_baseline(trepo, log_path=work / "trivial-baseline2.log") as triton:
        asyncio.run(closed_loop(triton.grpc_url, "trivial", [t_in], OUTSTANDING, 1.0, CONNECTIONS))
        cpu0, t0 = cpu_seconds(triton.proc.pid), time.perf_counter()
        direct, _, _ = asyncio.run(closed_loop(triton.grpc_url, "trivial", [t_in], OUTSTANDING, duration,
                                               CONNECTIONS))
        direct_cores = (cpu_seconds(triton.proc.pid) - cpu0) / (time.perf_counter() - t0)
    deploy, _ = trivial_deployment(work, gpus=2)
    with Deployment(deploy, check_hardware=False, log_dir=work / "wlogs") as dep, \
            SidecarProcess(manifest=deploy, log_path=work / "wsidecar.log",
                           extra_args=("--workers", "2", *native_args())) as sc:
        sc.wait_ready()
        servers = [s.proc.pid for s in dep.servers.values() if s.proc is not None]
        grpc_run = _workers_run(sc, sc.grpc_url, servers, t_in, duration)
        native_run = _workers_run(sc, native_url(sc), servers, t_in, duration) if NATIVE else None
    return (direct, direct_cores), grpc_run, native_run


def _workers_run(sc: SidecarProcess, url: str, servers: list[int], t_in: grpcclient.InferInput, duration: float
                 ) -> WorkersRun:
    asyncio.run(closed_loop(url, "trivial", [t_in], OUTSTANDING, 1.0, CONNECTIONS))
    pids = [sc.proc.pid, os.getpid(), *servers]
    cpu0, t0, split0 = [cpu_seconds(p, p != os.getpid()) for p in pids], time.perf_counter(), worker_requests(sc)
    rps, err, _ = asyncio.run(closed_loop(url, "trivial", [t_in], OUTSTANDING, duration, CONNECTIONS))
    used = [(cpu_seconds(p, p != os.getpid()) - c) / (time.perf_counter() - t0) for p, c in zip(pids, cpu0)]
    split = [b - a for a, b in zip(split0, worker_requests(sc))]
    return WorkersRun(rps, err, used[0], (used[1], sum(used[2:])), split)


def worker_requests(sc: SidecarProcess) -> list[float]:
    """Requests each worker of ``serve --workers`` answered so far, from its own metrics (its private port)."""
    counts = []
    for p in sorted(psutil.Process(sc.proc.pid).children(), key=lambda p: p.cmdline()):
        cmd = p.cmdline()
        with urllib.request.urlopen(f"http://127.0.0.1:{cmd[cmd.index('--metrics-port') + 1]}/metrics") as r:
            text = r.read().decode()
        m = re.search(r'^poolpipe_sidecar_requests_total\{model="trivial",route="planned"\} (\S+)$', text, re.M)
        counts.append(float(m.group(1)) if m else 0.0)
    return counts


if __name__ == "__main__":
    raise SystemExit(main())
