"""The per-stage costs the sidecar itself measures (``serve --overheads-out``) on an emulated deployment, with the
emulated partitions on the Python backend and on the native one, side by side in one run.

The deployment: PPipe's measured googlenet-v3 profile (``data/ppipe``) cut in three stages, a T4 and two halves of
an L4 on two loopback addresses (one gRPC hop, one shared-memory hop), tensors at ``--scale`` of the profiled
bytes; the same plan generated twice (``generate --emulated-backend python`` / ``native``). Full batches are sent
one at a time (each goes at once), so what is added to the profiled latency is the sidecar's and the stage calls'
own cost at idle. Printed per backend: p50/p99 of the request, what it adds over the profiled stages, and the
sidecar's mean lead (stage sent -> compute start) and tail (compute end -> response) per stage.

    python -P benchmarks/emulated_sidecar.py --quick   # about a minute on 2 cores
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

from backends import native
from model_repository_gen.generate import generate
from model_repository_gen.manifest import Manifest
from planner.plan_json import ModelPlan, PartitionPlan, PipelinePlan, Plan
from planner.spec.planning_spec import ClusterSpec
from profiling.reference import import_ppipe_profile
from runtime.launch import Deployment
from runtime.sidecar_process import SidecarProcess
from scheduler.core.probe import ReservationState
from scheduler.server.planned.manifest_topology import topology_from_manifest

ROOT = Path(__file__).resolve().parents[1]
MODEL = "googlenet-v3-pytorch"
STAGES = (((0, 2), "T4", 1), ((2, 5), "L4", 2), ((5, 10), "L4", 2))  # (blocks, GPU type, vGPU level)


def _plan(batch: int) -> Plan:
    profile = import_ppipe_profile(ROOT / "data" / "ppipe", MODEL)
    parts = tuple(PartitionPlan(blocks, gpu, v, batch, 1, profile.latency_us(gpu, v, batch, *blocks))
                  for blocks, gpu, v in STAGES)
    pipe = PipelinePlan(parts, 100.0, sum(p.latency_us for p in parts))
    cluster = ClusterSpec({"T4": 1, "L4": 1}, {"T4": 1, "L4": 1}, 10.0, {"T4": 1, "L4": 2})
    return Plan("hand", "none", 0.0, cluster, (ModelPlan(MODEL, 400_000.0, 100.0, (pipe,), profile),))


def _cluster(path: Path) -> Path:
    hosts = [{"name": "t4box", "address": "127.0.0.1", "gpu_type": "T4", "gpus": 1, "bandwidth_gbps": 10,
              "device": "emulated", "base_port": 0},
             {"name": "l4box", "address": "127.0.0.2", "gpu_type": "L4", "gpus": 1, "bandwidth_gbps": 10,
              "device": "emulated", "base_port": 0}]
    path.write_text(json.dumps({"hosts": hosts}))
    return path


def _serve(work: Path, backend: str, args: argparse.Namespace) -> str:
    plan = _plan(args.batch)
    manifest = generate(plan, {}, _cluster(work / "cluster.json"), work / "deploy",
                        emulated_tensor_scale=args.scale, emulated_backend=backend)
    model = manifest.model(MODEL)
    profiled_ms = _profiled_ms(manifest, args.batch)
    spec = model.inputs[0]
    x = np.random.default_rng(0).standard_normal((args.batch, *spec.shape)).astype(np.float32)
    overheads = work / "overheads.json"
    with Deployment(work / "deploy", log_dir=work / "logs"):
        sc = SidecarProcess(manifest=work / "deploy", log_path=work / "sidecar.log",
                            extra_args=("--overheads-out", str(overheads)))
        sc.start()
        try:
            times = _requests(sc.grpc_url, spec.name, x, args.requests)
        finally:
            sc.stop()
    o = json.loads(overheads.read_text())
    p50, p99 = np.percentile(times, 50), np.percentile(times, 99)
    return (f"{backend:<8} {p50:8.2f} {p99:8.2f} {profiled_ms:9.2f} {p50 - profiled_ms:9.2f} "
            f"{o['lead_us']:8.0f} {o['tail_us']:8.0f}")


def _profiled_ms(manifest: Manifest, batch: int) -> float:
    """The stages' profiled compute plus each hop between hosts at the profiled bytes over the cluster's link: what
    the sidecar's core reserves for a batch on the idle deployment (its probe's completion time)."""
    state = ReservationState(topology_from_manifest(manifest))
    return state.probe(state.pipelines[MODEL][0], batch, 0.0).completion_us / 1e3


def _requests(url: str, name: str, x: np.ndarray, n: int) -> np.ndarray:
    """``n`` requests of one full batch each, one at a time: request latency (ms)."""
    out = []
    with grpcclient.InferenceServerClient(url) as client:
        for i in range(n + 3):
            inp = grpcclient.InferInput(name, list(x.shape), "FP32")
            inp.set_data_from_numpy(x)
            t0 = time.perf_counter()
            client.infer(MODEL, [inp])
            if i >= 3:  # the first calls warm up channels and the sidecar's calibration
                out.append((time.perf_counter() - t0) * 1e3)
    return np.array(out)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=200, help="requests per backend (one full batch each)")
    ap.add_argument("--batch", type=int, default=2, help="the planned batch (each request carries one)")
    ap.add_argument("--scale", type=float, default=0.01, help="tensor bytes as a fraction of the profiled ones")
    ap.add_argument("--quick", action="store_true", help="60 requests per backend")
    args = ap.parse_args(argv)
    if args.quick:
        args.requests = 60
    backends = ["python"] + (["native"] if native.library() is not None else [])
    print(f"through the sidecar: {MODEL}, 3 emulated stages (T4, L4/2, L4/2), batch {args.batch}, tensors x"
          f"{args.scale:g}, {args.requests} requests one at a time; ms, lead/tail µs per stage (serve --overheads-out)")
    print(f"{'backend':<8} {'p50':>8} {'p99':>8} {'profiled':>9} {'added50':>9} {'lead':>8} {'tail':>8}")
    for backend in backends:
        with tempfile.TemporaryDirectory(prefix=f"emulated-sidecar-{backend}-") as tmp:
            print(_serve(Path(tmp), backend, args), flush=True)
    if len(backends) == 1:
        print("native: not built here (see the log line above); row skipped")


if __name__ == "__main__":
    main()
