"""Stage calls over a tritonserver's HTTP/REST endpoint (KServe v2 with Triton's binary tensor extension) on plain
asyncio connections, kept open and reused.

Why not gRPC: a unary call on grpc.aio costs the sidecar's process about twice the CPU of this path and 0.2 ms more
wall time per call (``benchmarks/stage_calls.py``), and boundary tensors between servers of one machine move
through shared memory either way, so a stage call carries a small JSON header. ``serve --stage-protocol grpc``
keeps gRPC (servers without an HTTP endpoint).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

import grpc

from model_repository_gen.manifest import StageInfo
from model_repository_gen.triton_config import TIMING_OUTPUTS
from scheduler.server.planned.shm_pool import Region
from scheduler.server.planned.stage_io import output_offsets

# The gRPC code of each HTTP status Triton answers with (its HTTP front end answers 404 where gRPC says NOT_FOUND).
STATUS_CODES = {400: grpc.StatusCode.INVALID_ARGUMENT, 403: grpc.StatusCode.PERMISSION_DENIED,
                404: grpc.StatusCode.NOT_FOUND, 409: grpc.StatusCode.ALREADY_EXISTS, 499: grpc.StatusCode.CANCELLED,
                500: grpc.StatusCode.INTERNAL, 501: grpc.StatusCode.UNIMPLEMENTED,
                503: grpc.StatusCode.UNAVAILABLE, 504: grpc.StatusCode.DEADLINE_EXCEEDED}
HEADER_LENGTH = "inference-header-content-length"
MAX_IDLE = 16  # connections kept open per server; the sidecar has about one call in flight per vGPU batch


class StageCallError(Exception):
    """A stage call that failed, with the gRPC status code its cause maps to (the executor's fault handling is
    written in gRPC's terms)."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code, self.details = code, details


def _shm(region: str, size: int, offset: int) -> dict[str, Any]:
    return {"shared_memory_region": region, "shared_memory_byte_size": size, "shared_memory_offset": offset}


def encode_call(stage: StageInfo, inputs: list, out_region: Region | None, batch: int, request_id: str,
                parameters: Mapping[str, Any] | None = None) -> tuple[bytes, list[bytes], dict[str, int]]:
    """The call's JSON header, its binary tensors in order, and each shm output's offset (``inputs``: HopTensors;
    ``parameters``: the batch's request parameters, stage_parameters.py)."""
    ins, binary = [], []
    for spec, h in zip(stage.inputs, inputs):
        if h.region is not None:
            params = _shm(h.region.name, h.nbytes, h.offset)
        else:
            params = {"binary_data_size": len(h.data)}
            binary.append(h.data)
        ins.append({"name": spec.name, "datatype": spec.datatype, "shape": h.shape, "parameters": params})
    offsets = output_offsets(stage, out_region, batch)
    outs = [{"name": s.name, "parameters": _shm(out_region.name, s.bytes_per_request() * batch, offsets[s.name])
             if out_region is not None else {"binary_data": True}} for s in stage.outputs]
    outs += [{"name": n, "parameters": {"binary_data": True}} for n in TIMING_OUTPUTS]
    call = {"id": request_id, **({"parameters": dict(parameters)} if parameters else {}), "inputs": ins,
            "outputs": outs}
    head = json.dumps(call, separators=(",", ":")).encode()
    return head, binary, offsets


def decode_answer(body: bytes, header_length: int | None) -> dict[str, tuple[list[int], bytes]]:
    """name -> (shape, raw bytes) of an answer; outputs written to shared memory have empty bytes."""
    head = json.loads(body[:header_length] if header_length is not None else body)
    out, pos = {}, header_length or 0
    for o in head.get("outputs", []):
        size = (o.get("parameters") or {}).get("binary_data_size")
        data = b""
        if size is not None:
            data, pos = body[pos:pos + size], pos + size
        out[o["name"]] = (list(o.get("shape", [])), data)
    return out


def error_of(status: int, body: bytes) -> StageCallError:
    """The StageCallError of a non-200 answer (Triton's body is {"error": "..."})."""
    try:
        details = json.loads(body).get("error", "")
    except (ValueError, AttributeError):
        details = body[:200].decode("utf-8", "replace")
    return StageCallError(STATUS_CODES.get(status, grpc.StatusCode.UNKNOWN), f"HTTP {status}: {details}")


def _expire(answer: asyncio.Future, timeout_s: float) -> None:
    if not answer.done():
        answer.set_exception(StageCallError(grpc.StatusCode.DEADLINE_EXCEEDED, f"no answer within {timeout_s:.3f} s"))


class _Connection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection with at most one call in flight; parses the answer as bytes arrive."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.answer: asyncio.Future | None = None
        self.reusable = True

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if self.answer is None or self.answer.done():
            return
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return
        lines = bytes(self.buf[:end]).decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        if "content-length" not in headers:
            self._fail(StageCallError(grpc.StatusCode.INTERNAL, "an HTTP answer without Content-Length"))
            return
        length = int(headers["content-length"])
        if len(self.buf) < end + 4 + length:
            return
        body = bytes(self.buf[end + 4:end + 4 + length])
        del self.buf[:end + 4 + length]
        self.reusable = headers.get("connection", "").lower() != "close"
        status = int(lines[0].split(" ", 2)[1])
        header_length = int(headers[HEADER_LENGTH]) if HEADER_LENGTH in headers else None
        self.answer.set_result((status, header_length, body))

    def _fail(self, error: Exception) -> None:
        self.reusable = False
        if self.answer is not None and not self.answer.done():
            self.answer.set_exception(error)
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(StageCallError(grpc.StatusCode.UNAVAILABLE, f"connection closed by the server ({exc or 'EOF'})"))


class HttpStageClient:
    """Calls to one tritonserver's HTTP endpoint (``address`` is host:port); each call takes an idle connection or
    opens one, and gives it back when its answer is whole."""

    def __init__(self, address: str, max_idle: int = MAX_IDLE) -> None:
        host, _, port = address.rpartition(":")
        self.host, self.port, self.max_idle = host.strip("[]"), int(port), max_idle
        self.idle: list[_Connection] = []
        self.closed = False

    async def _connection(self, timeout_s: float) -> tuple[_Connection, bool]:
        """An open connection, and whether it was kept from an earlier call. A new one that is not made within
        ``timeout_s`` (a host cut off the network answers no SYN: the kernel would retry for minutes) is UNAVAILABLE."""
        while self.idle:
            conn = self.idle.pop()
            if conn.reusable and not conn.transport.is_closing():
                return conn, True
        try:
            _, conn = await asyncio.wait_for(
                asyncio.get_running_loop().create_connection(_Connection, self.host, self.port), max(timeout_s, 0.0))
        except asyncio.TimeoutError:
            raise StageCallError(grpc.StatusCode.UNAVAILABLE, f"cannot connect to {self.host}:{self.port} within "
                                 f"{timeout_s:.3f} s") from None
        except OSError as e:
            raise StageCallError(grpc.StatusCode.UNAVAILABLE, f"cannot connect to {self.host}:{self.port}: {e}"
                                 ) from None
        return conn, False

    async def reachable(self, timeout_s: float) -> bool:
        """Whether the endpoint takes a connection now (kept for the next call): Triton opens its HTTP port after
        its gRPC port, so a server that answers gRPC health may still refuse stage calls for a moment."""
        try:
            conn, _ = await self._connection(timeout_s)
        except StageCallError:
            return False
        self._give_back(conn)
        return True

    def _give_back(self, conn: _Connection) -> None:
        """Keep a connection whose exchange is whole for the next call, or close it."""
        if conn.reusable and not self.closed and len(self.idle) < self.max_idle:
            self.idle.append(conn)
        elif conn.transport is not None:
            conn.transport.close()

    async def infer(self, model: str, head: bytes, binary: list[bytes], timeout_s: float,
                    traceparent: str | None = None) -> dict[str, tuple[list[int], bytes]]:
        """POST one inference (with a W3C ``traceparent`` header where given); its outputs by name, or a
        StageCallError (a timeout is DEADLINE_EXCEEDED)."""
        trace = b"traceparent: %s\r\n" % traceparent.encode("ascii") if traceparent is not None else b""
        request = [b"POST /v2/models/%s/infer HTTP/1.1\r\nHost: %s\r\nContent-Type: application/octet-stream\r\n"
                   b"Inference-Header-Content-Length: %d\r\nContent-Length: %d\r\n%s\r\n"
                   % (model.encode(), self.host.encode(), len(head), len(head) + sum(map(len, binary)), trace),
                   head, *binary]
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout_s  # one timeout for the connection and the exchange together
        conn, kept = await self._connection(timeout_s)
        try:
            status, header_length, body = await self._exchange(conn, request, end - loop.time())
        except StageCallError as e:
            if not (kept and e.code == grpc.StatusCode.UNAVAILABLE):
                raise
            # The server closed a kept connection as this call went out (an idle timeout): once more on a new one.
            conn, _ = await self._connection(end - loop.time())
            status, header_length, body = await self._exchange(conn, request, end - loop.time())
        self._give_back(conn)
        if status != 200:
            raise error_of(status, body)
        return decode_answer(body, header_length)

    @staticmethod
    async def _exchange(conn: _Connection, request: list[bytes], timeout_s: float) -> tuple[int, int | None, bytes]:
        # A timer on the answer itself, not asyncio.wait_for: that wraps the answer in a second future and wakes the
        # caller one loop iteration later, on every call (issue 24: a stage boundary's own cost).
        loop = asyncio.get_running_loop()
        conn.answer = answer = loop.create_future()
        timer = loop.call_later(timeout_s, _expire, answer, timeout_s)
        conn.transport.writelines(request)
        try:
            return await answer
        finally:
            timer.cancel()
            if answer.cancelled() or answer.exception() is not None:  # done either way once awaited
                # timed out, abandoned or lost: an answer may still come on this connection, so it is not reused
                conn._fail(StageCallError(grpc.StatusCode.CANCELLED, "call abandoned"))
            conn.answer = None

    def close(self) -> None:
        self.closed = True
        for conn in self.idle:
            if conn.transport is not None:
                conn.transport.close()
        self.idle.clear()
