"""What one stage call costs on an emulated device, beyond the profiled hold, side by side in one run.

Each row is one tritonserver model (instance count 1, KIND_CPU) on loopback, called with the gRPC client
the way the sidecar calls a stage (one unary call per batch, inputs and outputs of the profiled size):

- ``python trivial``: a Python-backend model that only returns a zero output of that size (the stub's floor);
- ``python emulated``: the partition backend with ``engine: emulated`` (backends/partition/), holding each
  batch for ``--hold-us``; ``shm`` rows start the server with larger Python-backend shared-memory settings;
- ``native emulated``: the same device as the native backend (backends/native/), when it builds here;
- ``native nothing``: the native backend with a zero hold (a native backend doing nothing).

Printed per row: at idle (one call at a time) p50/p99 of the call, of lead (send -> compute start) and of tail
(compute end -> response), as the sidecar's overheads name them; under ``--concurrency`` calls outstanding, p50
and p99 of the call and the serial cost per call (wall time / calls - hold: what the device loses per batch).

    python -P benchmarks/emulated_stage.py --quick     # about a minute on 2 cores
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

from backends import native
from model_repository_gen import triton_config as tc
from poolpipe_common.tensors import TensorSpec
from runtime.tritonserver import TritonProcess

TRIVIAL_MODEL_PY = '''
import time
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


def _write_models(repo: Path, in_elems: int, out_elems: int, hold_us: float, max_batch: int, native_ok: bool
                  ) -> None:
    ins, outs = [TensorSpec("x", "FP32", (in_elems,))], [TensorSpec("y", "FP32", (out_elems,))]
    table = ((1, hold_us), (max_batch, hold_us))
    variants = {"emu_py": ("python", hold_us)} | ({"emu_native": (native.BACKEND, hold_us),
                                                   "nothing_native": (native.BACKEND, 0.0)} if native_ok else {})
    for name, (backend, us) in variants.items():
        settings = tc.EmulatedSettings(tuple((b, us) for b, _ in table), stage=0, backend=backend)
        tc.write_model(repo, tc.partition_config(name, ins, outs, max_batch,
                                                 settings=tc.BackendSettings(emulated=settings)))
    cfg = tc.partition_config("trivial_py", ins, outs, max_batch)
    cfg.ClearField("parameters")
    (repo / "trivial_py" / "1").mkdir(parents=True, exist_ok=True)
    (repo / "trivial_py" / "config.pbtxt").write_text(tc.config_text(cfg))
    (repo / "trivial_py" / "1" / "model.py").write_text(TRIVIAL_MODEL_PY.replace("{out_elems}", str(out_elems)))


def _call(client: grpcclient.InferenceServerClient, model: str, x: np.ndarray) -> tuple[float, float, float]:
    """One stage call: (call, lead, tail) in µs."""
    inp = grpcclient.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    outs = [grpcclient.InferRequestedOutput(n) for n in ("y", *tc.TIMING_OUTPUTS)]
    sent = time.time_ns()
    res = client.infer(model, [inp], outputs=outs)
    recv = time.time_ns()
    start = int(res.as_numpy(tc.COMPUTE_START_OUTPUT)[0, 0])
    end = int(res.as_numpy(tc.COMPUTE_END_OUTPUT)[0, 0])
    return (recv - sent) / 1e3, (start - sent) / 1e3, (recv - end) / 1e3


def _idle(url: str, model: str, x: np.ndarray, calls: int) -> np.ndarray:
    with grpcclient.InferenceServerClient(url) as client:
        for _ in range(5):
            _call(client, model, x)
        return np.array([_call(client, model, x) for _ in range(calls)])


def _loaded(url: str, model: str, x: np.ndarray, concurrency: int, seconds: float) -> tuple[np.ndarray, float]:
    """``concurrency`` clients calling back to back for ``seconds``: (call µs of every call, calls per second)."""
    results: list[list[float]] = [[] for _ in range(concurrency)]
    stop = time.monotonic() + seconds

    def client_loop(out: list[float]) -> None:
        with grpcclient.InferenceServerClient(url) as client:
            while time.monotonic() < stop:
                out.append(_call(client, model, x)[0])

    threads = [threading.Thread(target=client_loop, args=(r,)) for r in results]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    calls = np.concatenate([np.array(r) for r in results])
    return calls, len(calls) / wall


def _measure(url: str, row: Row, x: np.ndarray, args: argparse.Namespace, hold_us: float) -> str:
    idle = _idle(url, row.model, x, args.calls)
    p = lambda a, q: float(np.percentile(a, q))  # noqa: E731
    loaded, rate = _loaded(url, row.model, x, args.concurrency, args.seconds)
    serial = 1e6 / rate - hold_us
    return (f"{row.label:<26} {p(idle[:, 0], 50):8.0f} {p(idle[:, 0], 99):8.0f} {p(idle[:, 1], 50):7.0f} "
            f"{p(idle[:, 1], 99):7.0f} {p(idle[:, 2], 50):7.0f} {p(idle[:, 2], 99):7.0f} | "
            f"{p(loaded, 50):8.0f} {p(loaded, 99):8.0f} {rate:8.0f} {serial:8.0f}")


def _server(repo: Path, log: Path, shm: bool) -> TritonProcess:
    extra: tuple[str, ...] = ()
    if shm:
        extra = (f"--backend-config=python,shm-default-byte-size={64 << 20}",
                 f"--backend-config=python,shm-growth-byte-size={64 << 20}")
    return TritonProcess(repo, log_path=log, extra_args=extra, name="shm" if shm else "default")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hold-us", type=float, default=1000.0, help="profiled latency of the emulated stage (µs)")
    ap.add_argument("--kib", type=int, default=512, help="input and output size per request (KiB, FP32)")
    ap.add_argument("--calls", type=int, default=400, help="calls at idle per row")
    ap.add_argument("--concurrency", type=int, default=4, help="calls outstanding under load")
    ap.add_argument("--seconds", type=float, default=5.0, help="duration of the loaded run per row")
    ap.add_argument("--quick", action="store_true", help="150 idle calls and 2 s loaded per row")
    args = ap.parse_args(argv)
    if args.quick:
        args.calls, args.seconds = 150, 2.0
    elems = args.kib * 256
    native_ok = native.library() is not None
    rows = [Row("python trivial", "trivial_py"), Row("python emulated", "emu_py"),
            Row("python emulated, shm 64M", "emu_py", shm=True)]
    if native_ok:
        rows += [Row("native emulated", "emu_native"), Row("native nothing (hold 0)", "nothing_native")]
    x = np.random.default_rng(0).standard_normal((1, elems)).astype(np.float32)
    print(f"emulated stage cost: hold {args.hold_us:.0f} µs, {args.kib} KiB in and out per request, batch 1, "
          f"idle {args.calls} calls, loaded {args.concurrency} outstanding for {args.seconds:g} s (µs)")
    print(f"{'stage':<26} {'call p50':>8} {'call p99':>8} {'lead50':>7} {'lead99':>7} {'tail50':>7} {'tail99':>7} | "
          f"{'load p50':>8} {'load p99':>8} {'calls/s':>8} {'serial':>8}")
    with tempfile.TemporaryDirectory(prefix="emulated-stage-") as tmp:
        repo = Path(tmp) / "repo"
        _write_models(repo, elems, elems, args.hold_us, 8, native_ok)
        for shm in (False, True):
            with _server(repo, Path(tmp) / f"triton-{shm}.log", shm) as server:
                for row in (r for r in rows if r.shm == shm):
                    hold = 0.0 if "trivial" in row.model or "nothing" in row.model else args.hold_us
                    print(_measure(server.grpc_url, row, x, args, hold), flush=True)
    if not native_ok:
        print("native emulated: not built here (see the log line above); rows skipped")


if __name__ == "__main__":
    main()
