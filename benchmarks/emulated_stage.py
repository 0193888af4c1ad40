"""What one stage call costs on an emulated device, beyond the profiled hold, side by side in one run.

Each row is one tritonserver model (instance count 1, KIND_CPU) on loopback, called with the gRPC client
the way the sidecar calls a stage (one unary call per batch, inputs and outputs of the profiled size):

- ``python trivial``: a Python-backend model that only returns a zero output of that size (the stub's floor);
- ``python emulated``: the partition backend with ``engine: emulated`` (backends/partition/), holding each
  batch for ``--hold-us``; ``shm`` rows start the server with larger Python-backend shared-memory settings;
- ``native emulated``: the same device as the native backend (backends/native/), when it builds here;
- ``native nothing``: the native backend with a zero hold (a native backend doing nothing).

Printed per row and tensor size: at idle (one call at a time) p50/p99 of the call, of lead (send -> compute start)
and of tail (compute end -> response), as the sidecar's overheads name them; under ``--concurrency`` calls
outstanding, p50/p99 of the call, calls per second, and the median gap: the device's idle time between one batch's
compute end and the next one's start while calls wait (what a stage call costs the device itself).

    python -P benchmarks/emulated_stage.py --quick     # about a minute on 2 cores
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

from backends import native
from model_repository_gen import triton_config as tc
from poolpipe_common.tensors import TensorSpec
from runtime.tritonserver import TritonProcess

TRIVIAL_MODEL_PY = '''
import os
import sys
import time

sys.path[:0] = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]  # the stub ignores PYTHONPATH
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Returns zeros of the output's size and the compute stamps: only the Python stub's cost remains."""

    def initialize(self, args):
        self.zeros = None

    def execute(self, requests):
        responses = []
        for request in requests:
            start = time.time_ns()
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            y = np.zeros((x.shape[0], {out_elems}), np.float32)
            stamps = [pb_utils.Tensor(n, np.full((x.shape[0], 1), t, np.int64)) for n, t in
                      (("POOLPIPE_COMPUTE_START_NS", start), ("POOLPIPE_COMPUTE_END_NS", time.time_ns()))]
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", y), *stamps]))
        return responses
'''


@dataclass(frozen=True)
class Row:
    """One measured stage: a label, its model and whether it needs the large-shm server."""

    label: str
    model: str
    shm: bool = False


def _write_models(repo: Path, kib: int, hold_us: float, max_batch: int, native_ok: bool) -> None:
    """The rows' models with ``kib`` KiB inputs and outputs, named ``<variant>_<kib>k``."""
    ins, outs = [TensorSpec("x", "FP32", (kib * 256,))], [TensorSpec("y", "FP32", (kib * 256,))]
    variants = {"emu_py": ("python", hold_us)} | ({"emu_native": (native.BACKEND, hold_us),
                                                   "nothing_native": (native.BACKEND, 0.0)} if native_ok else {})
    for name, (backend, us) in variants.items():
        settings = tc.EmulatedSettings(((1, us), (max_batch, us)), stage=0, backend=backend)
        tc.write_model(repo, tc.partition_config(f"{name}_{kib}k", ins, outs, max_batch,
                                                 settings=tc.BackendSettings(emulated=settings)))
    name = f"trivial_py_{kib}k"
    cfg = tc.partition_config(name, ins, outs, max_batch)
    cfg.ClearField("parameters")
    (repo / name / "1").mkdir(parents=True, exist_ok=True)
    (repo / name / "config.pbtxt").write_text(tc.config_text(cfg))
    (repo / name / "1" / "model.py").write_text(TRIVIAL_MODEL_PY.replace("{out_elems}", str(kib * 256)))


def _call(client: grpcclient.InferenceServerClient, model: str, x: np.ndarray) -> tuple[float, ...]:
    """One stage call: (call, lead, tail) in µs and the compute (start, end) stamps in ns."""
    inp = grpcclient.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    outs = [grpcclient.InferRequestedOutput(n) for n in ("y", *tc.TIMING_OUTPUTS)]
    sent = time.time_ns()
    res = client.infer(model, [inp], outputs=outs)
    recv = time.time_ns()
    start = int(res.as_numpy(tc.COMPUTE_START_OUTPUT)[0, 0])
    end = int(res.as_numpy(tc.COMPUTE_END_OUTPUT)[0, 0])
    return (recv - sent) / 1e3, (start - sent) / 1e3, (recv - end) / 1e3, start, end


def _idle(url: str, model: str, x: np.ndarray, calls: int) -> np.ndarray:
    with grpcclient.InferenceServerClient(url) as client:
        for _ in range(5):
            _call(client, model, x)
        return np.array([_call(client, model, x) for _ in range(calls)])


def _loaded(url: str, model: str, x: np.ndarray, concurrency: int, seconds: float) -> tuple[np.ndarray, float]:
    """``concurrency`` clients calling back to back for ``seconds``: (every call's _call tuple, calls per second)."""
    results: list[list[tuple[float, ...]]] = [[] for _ in range(concurrency)]
    stop = time.monotonic() + seconds

    def client_loop(out: list[tuple[float, ...]]) -> None:
        with grpcclient.InferenceServerClient(url) as client:
            while time.monotonic() < stop:
                out.append(_call(client, model, x))

    threads = [threading.Thread(target=client_loop, args=(r,)) for r in results]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    calls = np.array([c for r in results for c in r])
    return calls, len(calls) / wall


def _gaps_us(calls: np.ndarray) -> np.ndarray:
    """The device's idle time between consecutive batches (next compute start - this compute end), µs."""
    order = np.argsort(calls[:, 3])
    start, end = calls[order, 3], calls[order, 4]
    return np.maximum(start[1:] - end[:-1], 0) / 1e3


def _measure(url: str, row: Row, x: np.ndarray, args: argparse.Namespace) -> str:
    idle = _idle(url, row.model, x, args.calls)
    loaded, rate = _loaded(url, row.model, x, args.concurrency, args.seconds)
    gaps = _gaps_us(loaded)
    cols = [idle[:, 0], idle[:, 1], idle[:, 2]]
    cells = " ".join(f"{np.percentile(a, 50):7.0f} {np.percentile(a, 99):7.0f}" for a in cols)
    return (f"{row.label:<26} {x.nbytes >> 10:5d} {cells} | {np.percentile(loaded[:, 0], 50):7.0f} "
            f"{np.percentile(loaded[:, 0], 99):7.0f} {rate:7.0f} {np.percentile(gaps, 50):7.0f}")


def _server(repo: Path, log: Path, shm: bool) -> TritonProcess:
    extra: tuple[str, ...] = ()
    if shm:
        extra = (f"--backend-config=python,shm-default-byte-size={64 << 20}",
                 f"--backend-config=python,shm-growth-byte-size={64 << 20}")
    return TritonProcess(repo, log_path=log, extra_args=extra, name="shm" if shm else "default")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hold-us", type=float, default=1000.0, help="profiled latency of the emulated stage (µs)")
    ap.add_argument("--kib", default="4,512", help="input and output sizes per request to measure (KiB, FP32, "
                                                    "comma-separated; default 4,512)")
    ap.add_argument("--calls", type=int, default=400, help="calls at idle per row")
    ap.add_argument("--concurrency", type=int, default=4, help="calls outstanding under load")
    ap.add_argument("--seconds", type=float, default=5.0, help="duration of the loaded run per row")
    ap.add_argument("--quick", action="store_true", help="150 idle calls and 2 s loaded per row")
    ap.add_argument("--only", default="", metavar="TEXT", help="measure only the rows whose label contains TEXT")
    args = ap.parse_args(argv)
    if args.quick:
        args.calls, args.seconds = 150, 2.0
    sizes = [int(k) for k in args.kib.split(",")]
    native_ok = native.library() is not None
    rows = [Row("python trivial", "trivial_py"), Row("python emulated", "emu_py"),
            Row("python emulated, shm 64M", "emu_py", shm=True)]
    if native_ok:
        rows += [Row("native emulated", "emu_native"), Row("native nothing (hold 0)", "nothing_native")]
    rows = [r for r in rows if args.only in r.label]
    print(f"emulated stage cost: hold {args.hold_us:.0f} µs (0 for trivial/nothing), batch 1, idle {args.calls} "
          f"calls, loaded {args.concurrency} outstanding for {args.seconds:g} s; times in µs; gap: the device's idle "
          "time between batches under load")
    print(f"{'stage':<26} {'KiB':>5} {'call50':>7} {'call99':>7} {'lead50':>7} {'lead99':>7} {'tail50':>7} "
          f"{'tail99':>7} | {'load50':>7} {'load99':>7} {'calls/s':>7} {'gap50':>7}")
    with tempfile.TemporaryDirectory(prefix="emulated-stage-") as tmp:
        repo = Path(tmp) / "repo"
        for kib in sizes:
            _write_models(repo, kib, args.hold_us, 8, native_ok)
        for shm in sorted({r.shm for r in rows}):
            with _server(repo, Path(tmp) / f"triton-{shm}.log", shm) as server:
                for kib in sizes:
                    x = np.random.default_rng(0).standard_normal((1, kib * 256)).astype(np.float32)
                    for row in (r for r in rows if r.shm == shm):
                        print(_measure(server.grpc_url, replace(row, model=f"{row.model}_{kib}k"), x, args),
                              flush=True)
    if not native_ok:
        print("native emulated: not built here (see the log line above); rows skipped")


if __name__ == "__main__":
    main()
