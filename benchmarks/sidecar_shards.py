"""One sidecar against two sidecar shards (``poolpipe serve --shard I/2``) over the same deployment.

A trivial planned model (a Relu on 16 floats, so the sidecar's own cost dominates) on two tritonservers (one
pool of two vGPUs): (a) one sidecar in front of both, (b) two shards, each serving one of them, clients split
between the shards as a Service would. Printed per setup: requests/s with 64 requests outstanding, the CPU the
sidecar processes used (cores), requests/s per sidecar core, and the ratios two shards / one sidecar. Then what
sharding costs in sustained load (what ``serve --workers 2`` and ``--shard I/2`` give up in pooling):
``poolpipe simulate --shards 2`` against one sidecar on PPipe's googlenet profile planned on emulated 4 L4 + 12 T4.

    .venv/bin/python -P benchmarks/sidecar_shards.py            # about a minute
    .venv/bin/python -P benchmarks/sidecar_shards.py --quick
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
from tritonclient.utils import InferenceServerException

from model_repository_gen.generate import generate
from plans.plan_json import ModelPlan, PartitionPlan, PipelinePlan, Plan
from plans.spec.planning_spec import ClusterSpec
from profiling.profile import Block, DeviceTiming, Profile
from runtime.launch import Deployment
from runtime.sidecar_process import SidecarProcess
from runtime.testbed import write_trivial_onnx

OUTSTANDING = 64


def trivial_deployment(work: Path) -> Path:
    """One partition (Relu on 16 floats) served by a pool of two vGPUs on two CPU tritonservers."""
    write_trivial_onnx(work / "trivial.onnx")
    batches = (1, 2, 4, 8, 16, 32)
    profile = Profile("trivial", (Block("block0", 64, ("y",)),),
                      {"A": {1: DeviceTiming(batches, np.array([[200.0 + 10 * b for b in batches]]))}},
                      input_bytes=64, input_tensors=("x",))
    part = PartitionPlan((0, 1), "A", 1, 32, 2, profile.latency_us("A", 1, 32))
    pipe = PipelinePlan((part,), 2 * 32 / part.latency_us * 1e6, part.latency_us)
    plan = Plan("bench", "manual", 0.0, ClusterSpec({"A": 2}, {"A": 2}, 10.0, {"A": 1}),
                (ModelPlan("trivial", 1_000_000.0, pipe.throughput_rps, (pipe,), profile),))
    (work / "cluster.json").write_text(json.dumps({"hosts": [
        {"name": "hostT", "address": "127.0.0.1", "gpu_type": "A", "gpus": 2, "bandwidth_gbps": 10, "device": "cpu",
         "cpu_cores": 2, "base_port": 0}]}))
    generate(plan, {"trivial": work / "trivial.onnx"}, work / "cluster.json", work / "deploy")
    return work / "deploy"


async def closed_loop(urls: list[str], inputs: list, duration_s: float) -> tuple[int, int, float]:
    """OUTSTANDING requests always in flight, spread over ``urls``; returns (answered, errors, seconds)."""
    clients = [grpcaio.InferenceServerClient(u) for u in urls]
    done = errors = 0
    end = time.perf_counter() + duration_s

    async def worker(c: grpcaio.InferenceServerClient) -> None:
        nonlocal done, errors
        while time.perf_counter() < end:
            try:
                await c.infer("trivial", inputs, client_timeout=10)
                done += 1
            except InferenceServerException:
                errors += 1

    t0 = time.perf_counter()
    await asyncio.gather(*[worker(clients[i % len(clients)]) for i in range(OUTSTANDING)])
    elapsed = time.perf_counter() - t0
    for c in clients:
        await c.close()
    return done, errors, elapsed


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(sidecars: list[SidecarProcess], inputs: list, duration_s: float) -> dict[str, float]:
    urls = [s.grpc_url for s in sidecars]
    for s in sidecars:
        c = grpcclient.InferenceServerClient(s.grpc_url)
        deadline = time.monotonic() + 60
        while not c.is_model_ready("trivial"):
            if time.monotonic() > deadline:
                raise TimeoutError("a sidecar did not turn ready")
            time.sleep(0.1)
    asyncio.run(closed_loop(urls, inputs, 1.0))  # warm-up
    cpu0 = sum(cpu_seconds(s.proc.pid) for s in sidecars)
    done, errors, elapsed = asyncio.run(closed_loop(urls, inputs, duration_s))
    cores = (sum(cpu_seconds(s.proc.pid) for s in sidecars) - cpu0) / elapsed
    return {"rps": done / elapsed, "errors": errors, "cores": cores, "rps_per_core": done / elapsed / max(cores, 1e-9)}


def simulated_shard_cost(work: Path, quick: bool) -> list[str]:
    """``poolpipe simulate --shards 2`` (one sidecar vs two shards) on PPipe's googlenet profile planned by ppipe
    (nominal objective) on 4 L4 + 12 T4; returns its comparison lines."""
    from planner.entry import plan
    from planner.request import PlanRequest
    from poolpipe.paper_experiment import PaperRun, paper_spec
    from runtime.testbed import EMULATED_MODEL

    spec = paper_spec(PaperRun(EMULATED_MODEL, l4=4, t4=12))
    plan(spec, PlanRequest("ppipe", objective="throughput", time_limit_s=60, verify=True)).plan.save(work / "plan.json")
    lfs = "0.1:1.0:0.1" if quick else "0.05:1.2:0.05"
    r = subprocess.run([sys.executable, "-m", "poolpipe", "simulate", "--plan", str(work / "plan.json"), "--shards",
                        "2", "--load-factors", lfs, "--duration-s", "5" if quick else "10", "--out",
                        str(work / "sim.json")], capture_output=True, text=True, check=True)
    return [line for line in r.stdout.splitlines() if "shards sustain" in line or "sharding cost" in line]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="3 s per setup instead of 8")
    args = ap.parse_args()
    duration = 3.0 if args.quick else 8.0
    t_in = grpcclient.InferInput("x", [1, 16], "FP32")
    t_in.set_data_from_numpy(np.ones((1, 16), np.float32))
    results = {}
    with tempfile.TemporaryDirectory(prefix="poolpipe-bench-shards-") as tmp:
        work = Path(tmp)
        deploy = trivial_deployment(work)
        with Deployment(deploy, check_hardware=False, log_dir=work / "logs"):
            for label, shards in (("one sidecar", [()]), ("two shards", [("--shard", "0/2"), ("--shard", "1/2")])):
                procs = [SidecarProcess(manifest=deploy, log_path=work / f"{label}-{i}.log", extra_args=extra)
                         for i, extra in enumerate(shards)]
                try:
                    for p in procs:
                        p.start()
                    results[label] = measure(procs, [t_in], duration)
                finally:
                    for p in procs:
                        p.stop()
                r = results[label]
                print(f"{label:<12} {r['rps']:8.0f} req/s  ({r['errors']} errors)  sidecar CPU {r['cores']:.2f} "
                      f"cores  {r['rps_per_core']:8.0f} req/s per sidecar core", flush=True)
    one, two = results["one sidecar"], results["two shards"]
    print(f"two shards / one sidecar: req/s {two['rps'] / one['rps']:.2f}x, req/s per sidecar core "
          f"{two['rps_per_core'] / one['rps_per_core']:.2f}x ({os.cpu_count()} cores on this machine, client "
          "included)")
    with tempfile.TemporaryDirectory(prefix="poolpipe-bench-shards-sim-") as tmp:
        print("simulated (PPipe's googlenet profile, ppipe plan on emulated 4 L4 + 12 T4, Poisson):")
        for line in simulated_shard_cost(Path(tmp), args.quick):
            print("  " + line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
