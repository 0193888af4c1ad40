"""An application DAG (detector -> classifier, fan-out 2; runtime/app_testbed.py) served two ways at one offered
load, on loopback CPU servers running the real (tiny) ONNX models:

(a) through ``poolpipe serve`` as one KServe model (each module's rows batched by the sidecar's driver loop);
(b) as a Triton ensemble over the whole models, each with Triton's dynamic batcher (ensembles/app_ensemble.py).

Printed: app-level p50/p99 latency, errors and SLO attainment (answered within the app's SLO / sent) of each.
Measured on CPU servers sharing this machine's cores, not on GPUs and not emulated: the figures compare the two
serving paths' overheads at a small scale, not what a GPU cluster would reach.

    .venv/bin/python benchmarks/beyond_ppipe_appserve.py [--rate 50] [--seconds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import numpy as np
import tritonclient.grpc.aio as grpcaio
from tritonclient.utils import InferenceServerException

from ensembles.app_ensemble import write_app_ensemble
from ensembles.triton_baseline import start_baseline
from model_repository_gen import triton_config as tc
from runtime.app_testbed import IMAGE, build_app_deployment
from runtime.launch import Deployment
from runtime.sidecar_process import SidecarProcess

APP = "traffic"


async def poisson_load(url: str, rate: float, seconds: float, slo_s: float, seed: int = 0) -> dict:
    """Open-loop Poisson arrivals of one-image requests; latency of each answered one."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((1, *IMAGE)).astype(np.float32)
    client = grpcaio.InferenceServerClient(url)
    latencies: list[float] = []
    errors = 0
    reasons: dict[str, int] = {}

    async def one() -> None:
        nonlocal errors
        inp = grpcaio.InferInput("image", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        t0 = time.perf_counter()
        try:
            await client.infer(APP, [inp], client_timeout=10)
            latencies.append(time.perf_counter() - t0)
        except InferenceServerException as e:
            errors += 1
            why = str(e.message()).split(": request ")[-1][:90]
            reasons[why] = reasons.get(why, 0) + 1

    tasks = []
    t_end = time.perf_counter() + seconds
    try:
        while time.perf_counter() < t_end:
            tasks.append(asyncio.ensure_future(one()))
            await asyncio.sleep(rng.exponential(1.0 / rate))
        await asyncio.gather(*tasks)
    finally:
        await client.close()
    lat = np.array(latencies) if latencies else np.array([np.nan])
    return {"sent": len(tasks), "errors": errors, "p50_ms": float(np.percentile(lat, 50) * 1e3),
            "p99_ms": float(np.percentile(lat, 99) * 1e3),
            "attainment": float((lat <= slo_s).sum()) / max(len(tasks), 1),
            "why": max(reasons, key=reasons.__getitem__) if reasons else ""}


def _line(name: str, r: dict) -> str:
    return (f"{name:<28} sent={r['sent']:<5d} errors={r['errors']:<4d} p50={r['p50_ms']:7.2f} ms "
            f"p99={r['p99_ms']:7.2f} ms attainment={r['attainment'] * 100:6.2f} %"
            + (f"\n{'':<28} most errors: {r['why']}" if r["why"] else ""))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=50.0, help="app requests per second (one image each)")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--slo-ms", type=float, default=50.0, help="the app's end-to-end SLO")
    args = ap.parse_args()
    slo_us = args.slo_ms * 1e3
    with tempfile.TemporaryDirectory(prefix="appserve-") as tmp:
        work = Path(tmp)
        deploy, paths, manifest = build_app_deployment(work, slo_us=slo_us)
        with Deployment(deploy, check_hardware=False, log_dir=work / "logs"):
            sc = SidecarProcess(manifest=deploy, log_path=work / "sidecar.log").start()
            try:
                sidecar = asyncio.run(poisson_load(sc.grpc_url, args.rate, args.seconds, slo_us / 1e6))
            finally:
                sc.stop()
        repo = work / "ensemble"
        write_app_ensemble(repo, manifest.applications[0], {m.name: m for m in manifest.models}, paths,
                           tc.DynamicBatching((4,), int(slo_us / 10)), settings=tc.BackendSettings(intra_op_threads=1))
        with start_baseline(repo, log_path=work / "triton.log") as server:
            ensemble = asyncio.run(poisson_load(server.grpc_url, args.rate, args.seconds, slo_us / 1e6))
    print(f"app {APP} (det -> cls, fan-out 2), SLO {args.slo_ms:g} ms, Poisson {args.rate:g} req/s for "
          f"{args.seconds:g} s each; loopback CPU servers, real ONNX models (measured, not emulated):")
    print(_line("sidecar (poolpipe serve)", sidecar))
    print(_line("Triton ensemble + batcher", ensemble))


if __name__ == "__main__":
    main()
