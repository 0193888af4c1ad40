"""What one stage call costs the sidecar's process: unary ``ModelInfer`` on grpc.aio (``serve --stage-protocol
grpc``), one bidirectional ``ModelStreamInfer`` stream per server on grpc.aio, and the sidecar's own HTTP stage
client (``scheduler/server/planned/stage_http.py``, the default), side by side in one run on one tritonserver
serving a trivial model (a Relu on 16 floats, so the server's work is negligible).

Printed per transport and number of calls in flight: the calling process's CPU per call (its event loop and
grpc.aio's polling thread, ``time.process_time``) and the wall time per call, then the ratios to unary. The
sidecar keeps a handful of stage calls in flight per server (one per vGPU batch), so 1 and 4 are measured.

    python -P benchmarks/stage_calls.py            # 3,000 calls per row, two rounds (about 20 s)
    python -P benchmarks/stage_calls.py --quick    # 1,000 calls per row, one round (about 10 s)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
import numpy as np
from tritonclient.grpc import service_pb2, service_pb2_grpc

from ensembles.triton_baseline import start_baseline, write_whole_model
from runtime.testbed import write_trivial_onnx
from scheduler.server.planned.stage_http import HttpStageClient

Call = Callable[[service_pb2.ModelInferRequest], Awaitable[None]]


def _request(i: int) -> service_pb2.ModelInferRequest:
    """A batch of 3 rows, as a stage call of the ppipe policy on the trivial model carries about 3 requests."""
    r = service_pb2.ModelInferRequest(model_name="trivial", id=str(i))
    t = r.inputs.add()
    t.name, t.datatype = "x", "FP32"
    t.shape.extend([3, 16])
    r.raw_input_contents.append(np.ones((3, 16), np.float32).tobytes())
    return r


async def _measure(call: Call, n: int, in_flight: int) -> tuple[float, float]:
    """(CPU µs, wall µs) per call for ``n`` calls, ``in_flight`` at a time, after a warm-up call."""
    await call(_request(-1))
    sem = asyncio.Semaphore(in_flight)

    async def one(i: int) -> None:
        async with sem:
            await call(_request(i))

    c0, t0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    return (time.process_time() - c0) / n * 1e6, (time.perf_counter() - t0) / n * 1e6


async def unary(url: str, n: int, in_flight: int) -> tuple[float, float]:
    async with grpc.aio.insecure_channel(url) as ch:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(ch)

        async def call(req: service_pb2.ModelInferRequest) -> None:
            await stub.ModelInfer(req, timeout=10)
        return await _measure(call, n, in_flight)


async def stream(url: str, n: int, in_flight: int) -> tuple[float, float]:
    """One stream; writes one at a time (grpc.aio allows one outstanding write), answers matched by request id."""
    async with grpc.aio.insecure_channel(url) as ch:
        rpc = service_pb2_grpc.GRPCInferenceServiceStub(ch).ModelStreamInfer()
        pending: dict[str, asyncio.Future] = {}
        write = asyncio.Lock()

        async def read() -> None:
            async for resp in rpc:
                fut = pending.pop(resp.infer_response.id, None)
                if fut is not None and not fut.done():
                    fut.set_result(resp.error_message)

        reader = asyncio.create_task(read())

        async def call(req: service_pb2.ModelInferRequest) -> None:
            fut = asyncio.get_running_loop().create_future()
            pending[req.id] = fut
            async with write:
                await rpc.write(req)
            error = await asyncio.wait_for(fut, 10)
            if error:
                raise RuntimeError(f"stream answered an error: {error}")
        try:
            return await _measure(call, n, in_flight)
        finally:
            await rpc.done_writing()
            reader.cancel()


async def http(url: str, n: int, in_flight: int) -> tuple[float, float]:
    """The sidecar's HTTP stage client on the same batch of 3 (binary tensors, kept-open connections)."""
    client = HttpStageClient(url)
    data = np.ones((3, 16), np.float32).tobytes()
    head = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [3, 16],
                                   "parameters": {"binary_data_size": len(data)}}],
                       "outputs": [{"name": "y", "parameters": {"binary_data": True}}]}).encode()

    async def call(req: service_pb2.ModelInferRequest) -> None:
        out = await client.infer("trivial", head, [data], 10.0)
        if len(out["y"][1]) != len(data):
            raise RuntimeError(f"HTTP answer of {len(out['y'][1])} bytes")
    try:
        return await _measure(call, n, in_flight)
    finally:
        client.close()


TRANSPORTS = {"unary": unary, "stream": stream, "http": http}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=3000, help="calls per row")
    ap.add_argument("--rounds", type=int, default=2, help="times each row is measured (alternating transports)")
    ap.add_argument("--quick", action="store_true", help="1,000 calls per row, one round")
    args = ap.parse_args(argv)
    if args.quick:
        args.calls, args.rounds = 1000, 1
    with tempfile.TemporaryDirectory(prefix="stage-calls-") as tmp:
        work = Path(tmp)
        write_whole_model(work / "repo", write_trivial_onnx(work / "trivial.onnx"), "trivial", 32)
        with start_baseline(work / "repo", log_path=work / "triton.log") as triton:
            print(f"stage calls to one tritonserver (trivial model, batch of 3), {args.calls} calls per row; "
                  "µs per call of the calling process")
            print(f"{'in flight':>9} {'transport':<9} {'CPU':>7} {'wall':>7}")
            ratios = []
            for in_flight in (1, 4):
                got: dict[str, list[tuple[float, float]]] = {k: [] for k in TRANSPORTS}
                for _ in range(args.rounds):
                    for name, fn in TRANSPORTS.items():
                        url = triton.http_url if name == "http" else triton.grpc_url
                        cpu, wall = asyncio.run(fn(url, args.calls, in_flight))
                        got[name].append((cpu, wall))
                        print(f"{in_flight:>9} {name:<9} {cpu:7.0f} {wall:7.0f}", flush=True)
                u, st, h = (np.mean(got[k], axis=0) for k in TRANSPORTS)
                ratios.append(f"{in_flight} in flight: stream CPU {st[0] / u[0]:.2f}x, wall {st[1] / u[1]:.2f}x; "
                              f"http CPU {h[0] / u[0]:.2f}x, wall {h[1] / u[1]:.2f}x")
            print("to unary (means): " + "; ".join(ratios))


if __name__ == "__main__":
    main()
