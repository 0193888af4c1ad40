"""The floor under the sidecar's pass-through: a bare Python gRPC proxy that forwards Triton's ``ModelInfer`` as raw
bytes (no decode, no checks, no metrics) on grpc.aio, as the sidecar's front end and stage calls do. What it adds
over calling Triton directly is what any proxy written on Python's gRPC stack adds on this machine, so
``benchmarks/sidecar.py`` prints it beside the sidecar's own pass-through cost.
"""

from __future__ import annotations

import asyncio
import multiprocessing
from collections.abc import Iterator
from contextlib import contextmanager

import grpc

SERVICE = "inference.GRPCInferenceService"
START_TIMEOUT_S = 30.0


def _identity(b: bytes) -> bytes:
    return b


def _serve(target: str, ports: multiprocessing.Queue, stop: multiprocessing.Event) -> None:
    """The proxy's process: forward every ModelInfer to ``target`` until ``stop``; its port goes to ``ports``."""
    async def main() -> None:
        channel = grpc.aio.insecure_channel(target)
        call = channel.unary_unary(f"/{SERVICE}/ModelInfer", request_serializer=_identity,
                                   response_deserializer=_identity)

        async def model_infer(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            return await call(request)

        handler = grpc.method_handlers_generic_handler(SERVICE, {"ModelInfer": grpc.unary_unary_rpc_method_handler(
            model_infer, request_deserializer=_identity, response_serializer=_identity)})
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((handler,))
        ports.put(server.add_insecure_port("127.0.0.1:0"))
        await server.start()
        while not stop.is_set():
            await asyncio.sleep(0.05)
        await server.stop(0)
        await channel.close()

    asyncio.run(main())


@contextmanager
def bare_proxy(target: str) -> Iterator[str]:
    """A bare grpc.aio proxy to the Triton at ``target`` ("host:port") in its own process; yields its URL and
    stops it (by its PID) on the way out, also on failure."""
    ctx = multiprocessing.get_context("spawn")
    ports, stop = ctx.Queue(), ctx.Event()
    proc = ctx.Process(target=_serve, args=(target, ports, stop), daemon=True)
    proc.start()
    try:
        yield f"127.0.0.1:{ports.get(timeout=START_TIMEOUT_S)}"
    finally:
        stop.set()
        proc.join(5.0)
        if proc.is_alive():
            proc.kill()
            proc.join()
