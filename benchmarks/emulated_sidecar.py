"""The per-stage costs the sidecar itself measures (``serve --overheads-out``) on an emulated deployment, with the
emulated partitions on the Python backend and on the native one, side by side in one run; and what the planned
path adds per stage over Triton direct at low load, where compute is the profile's (issue 24's low-load figure on
emulated devices: the CPU servers of benchmarks/sidecar.py compute a model's partitions slower than the whole).

The deployment: PPipe's measured googlenet-v3 profile (``data/ppipe``) cut in three stages, a T4 and two halves of
an L4 on two loopback addresses (one gRPC hop, one shared-memory hop), tensors at ``--scale`` of the profiled
bytes; the same plan generated twice (``generate --emulated-backend python`` / ``native``). Full batches are sent
one at a time (each goes at once), so what is added to the profiled latency is the sidecar's and the stage calls'
own cost at idle. Printed per backend: p50/p99 of the request, what it adds over the profiled stages, and the
sidecar's mean lead (stage sent -> compute start) and tail (compute end -> response) per stage. The native
backend's sidecar is also called through its native front end (``serve --native-grpc-port``), and beside it
Triton direct: the whole model on one emulated L4 (the native backend), called by the same client with the same
batch; what it adds over its profiled latency is what any call to Triton costs, and the planned path's added50
beyond it, over the three stages, is its cost per stage. These three are called in turns of ten requests, the
order rotating, so that the host's speed drifting weighs on all alike (one after the other, Triton direct's own
added50 moved between 0.56 and 1.38 ms from run to run).

    python -P benchmarks/emulated_sidecar.py --quick   # about a minute on 2 cores
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

from backends import native
from loadtest.request_timeline import medians, segments
from loadtest.side_by_side import rotated
from model_repository_gen.generate import generate
from model_repository_gen.manifest import Manifest, StageInfo
from plans.plan_json import ModelPlan, PartitionPlan, PipelinePlan, Plan
from plans.spec.planning_spec import ClusterSpec
from poolpipe_common.net import free_port
from profiling.reference import import_ppipe_profile
from runtime.launch import Deployment
from runtime.sidecar_process import SidecarProcess
from scheduler.core.probe import ReservationState
from scheduler.server.planned.manifest_topology import topology_from_manifest

ROOT = Path(__file__).resolve().parents[1]
MODEL = "googlenet-v3-pytorch"
STAGES = (((0, 2), "T4", 1), ((2, 5), "L4", 2), ((5, 10), "L4", 2))  # (blocks, GPU type, vGPU level)


def _plan(batch: int, stages: tuple = STAGES) -> Plan:
    profile = import_ppipe_profile(ROOT / "data" / "ppipe", MODEL)
    parts = tuple(PartitionPlan(blocks, gpu, v, batch, 1, profile.latency_us(gpu, v, batch, *blocks))
                  for blocks, gpu, v in stages)
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


@dataclass
class Row:
    name: str
    times_ms: np.ndarray
    profiled_ms: float
    lead_us: float | None = None
    tail_us: float | None = None
    timeline: dict[str, float] | None = None  # loadtest.request_timeline's medians (ms)

    @property
    def added50(self) -> float:
        return float(np.percentile(self.times_ms, 50)) - self.profiled_ms

    def line(self) -> str:
        costs = "" if self.lead_us is None else f" {self.lead_us:8.0f} {self.tail_us:8.0f}"
        return (f"{self.name:<14} {np.percentile(self.times_ms, 50):8.2f} {np.percentile(self.times_ms, 99):8.2f} "
                f"{self.profiled_ms:9.2f} {self.added50:9.2f}{costs}")


def _deploy(work: Path, backend: str, args: argparse.Namespace, stages: tuple = STAGES) -> Manifest:
    work.mkdir(exist_ok=True)
    return generate(_plan(args.batch, stages), {}, _cluster(work / "cluster.json"), work / "deploy",
                    emulated_tensor_scale=args.scale, emulated_backend=backend)


def _input(spec, batch: int) -> np.ndarray:
    return np.random.default_rng(0).standard_normal((batch, *spec.shape)).astype(np.float32)


def _serve(work: Path, backend: str, args: argparse.Namespace, direct_work: Path | None = None) -> list[Row]:
    """The sidecar over the three stages on ``backend``. With ``direct_work`` (the native backend) also its native
    front end and Triton direct (the whole model on one emulated L4, its tritonserver called by the client), the
    three called in turns of a few requests, the order rotating, so that the host's speed drifting weighs on all
    alike (the overheads file covers the own port's and the front's requests)."""
    manifest = _deploy(work, backend, args)
    profiled_ms = _profiled_ms(manifest, args.batch)
    spec = manifest.model(MODEL).inputs[0]
    x = _input(spec, args.batch)
    overheads, batch_log = work / "overheads.json", work / "batches.jsonl"
    front = free_port("127.0.0.1") if direct_work is not None else None
    extra = ("--overheads-out", str(overheads), "--batch-log", str(batch_log),
             *(("--native-grpc-port", str(front)) if front else ()))
    with contextlib.ExitStack() as stack:
        stack.enter_context(Deployment(work / "deploy", log_dir=work / "logs"))
        sc = stack.enter_context(SidecarProcess(manifest=work / "deploy", log_path=work / "sidecar.log",
                                                extra_args=extra))
        callers = {backend: _caller(stack, sc.grpc_url, spec.name, x)}
        if direct_work is not None:  # generated while the servers above hold their ports
            dm = _deploy(direct_work, "native", args, (((0, 10), "L4", 1),))
            stage: StageInfo = dm.model(MODEL).pipelines[0].stages[0]
            stack.enter_context(Deployment(direct_work / "deploy", log_dir=direct_work / "logs"))
            callers["native front"] = _caller(stack, f"127.0.0.1:{front}", spec.name, x)
            callers["triton direct"] = _caller(stack, dm.vgpu(stage.vgpus[0]).grpc_url, stage.inputs[0].name,
                                               _input(stage.inputs[0], args.batch), stage.triton_model)
        marks = _in_turns(callers, args.requests)
    lines = [json.loads(line) for line in batch_log.read_text().splitlines()]
    o = json.loads(overheads.read_text())
    rows = [Row(backend, _ms(marks[backend]), profiled_ms, o["lead_us"], o["tail_us"],
                medians(segments(marks[backend], lines)))]
    if direct_work is not None:
        rows.append(Row("native front", _ms(marks["native front"]), profiled_ms,
                        timeline=medians(segments(marks["native front"], lines))))
        rows.append(Row("triton direct", _ms(marks["triton direct"]), stage.latency_us[args.batch] / 1e3))
    return rows


def _profiled_ms(manifest: Manifest, batch: int) -> float:
    """The stages' profiled compute plus each hop between hosts at the profiled bytes over the cluster's link: what
    the sidecar's core reserves for a batch on the idle deployment (its probe's completion time)."""
    state = ReservationState(topology_from_manifest(manifest))
    return state.probe(state.pipelines[MODEL][0], batch, 0.0).completion_us / 1e3


def _caller(stack: contextlib.ExitStack, url: str, name: str, x: np.ndarray, model: str = MODEL
            ) -> Callable[[], tuple[float, float]]:
    """One request of one full batch to ``url`` (a client kept open on ``stack``): its send and receive on
    time.monotonic() (the sidecar's clock, for its batch log)."""
    client = stack.enter_context(grpcclient.InferenceServerClient(url))
    inp = grpcclient.InferInput(name, list(x.shape), "FP32")
    inp.set_data_from_numpy(x)

    def call() -> tuple[float, float]:
        t0 = time.monotonic()
        client.infer(model, [inp])
        return t0, time.monotonic()
    return call


def _in_turns(callers: dict[str, Callable[[], tuple[float, float]]], n: int, block: int = 10, warmup: int = 3
              ) -> dict[str, list[tuple[float, float]]]:
    """``n`` requests one at a time to each caller, ``block`` to each in turn with the order rotating, after
    ``warmup`` each (channels, the sidecar's calibration)."""
    for call in callers.values():
        for _ in range(warmup):
            call()
    marks: dict[str, list[tuple[float, float]]] = {name: [] for name in callers}
    turn = 0
    while min(map(len, marks.values())) < n:
        for name in rotated(list(callers), turn):
            for _ in range(min(block, n - len(marks[name]))):
                marks[name].append(callers[name]())
        turn += 1
    return marks


def _ms(marks: list[tuple[float, float]]) -> np.ndarray:
    return np.array([(t1 - t0) * 1e3 for t0, t1 in marks])


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
    print(f"{'backend':<14} {'p50':>8} {'p99':>8} {'profiled':>9} {'added50':>9} {'lead':>8} {'tail':>8}")
    rows: dict[str, Row] = {}
    for backend in backends:
        with tempfile.TemporaryDirectory(prefix=f"emulated-sidecar-{backend}-") as tmp:
            for row in _serve(Path(tmp), backend, args, Path(tmp) / "direct" if backend == "native" else None):
                rows[row.name] = row
                print(row.line() + ("   (the whole model on one emulated L4)" if row.name == "triton direct"
                                    else ""), flush=True)
    if len(backends) == 1:
        print("native: not built here (see the log line above); rows skipped")
        return
    direct = rows["triton direct"]
    per_stage = {name: (rows[name].added50 - direct.added50) / len(STAGES) for name in ("native", "native front")}
    print(f"the planned path adds over Triton direct (emulated, one request at a time): "
          f"{per_stage['native']:+.2f} ms p50 per stage through the sidecar's gRPC port, "
          f"{per_stage['native front']:+.2f} ms through its native front end ({len(STAGES)} stages, native backend)")
    _print_timeline(rows["native"], rows["native front"])


def _print_timeline(own: Row, front: Row) -> None:
    """Where the native backend's requests spent their time (medians, ms; loadtest/request_timeline.py)."""
    print(f"where the time goes (native backend; medians over the requests, ms; the batch log joined with the "
          f"client's clock):\n{'segment':<48} {'gRPC port':>10} {'native front':>13}")
    for name in own.timeline:
        print(f"{name:<48} {own.timeline[name]:10.3f} {front.timeline.get(name, float('nan')):13.3f}")


if __name__ == "__main__":
    main()
