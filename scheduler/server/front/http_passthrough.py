"""``serve --passthrough-http``: the HTTP port forwards a pass-through model's inference to the pass-through
Triton's HTTP endpoint as HTTP: the body as received (JSON or binary tensors, compressed or not) and the client's
headers, hop-by-hop ones dropped; Triton's answer comes back as it was sent (status, body and its framing headers),
so what only HTTP carries (JSON parameters, binary_data_output, Accept-Encoding) arrives unchanged."""

from __future__ import annotations

import logging
import time

import aiohttp
import grpc
from aiohttp import web

from scheduler.server.common.forwarding import NOT_FORWARDED
from scheduler.server.common.metrics import SidecarMetrics

log = logging.getLogger("poolpipe.sidecar.http")
# what a response carries from Triton to the client: the body's framing (the rest is the sidecar's connection's)
RESPONSE_HEADERS = ("content-type", "content-encoding", "inference-header-content-length")
# an HTTP status as the gRPC code of sidecar's failure counts
STATUS_CODES = {400: grpc.StatusCode.INVALID_ARGUMENT, 403: grpc.StatusCode.PERMISSION_DENIED,
                404: grpc.StatusCode.NOT_FOUND, 408: grpc.StatusCode.DEADLINE_EXCEEDED,
                429: grpc.StatusCode.RESOURCE_EXHAUSTED, 499: grpc.StatusCode.CANCELLED,
                500: grpc.StatusCode.INTERNAL, 503: grpc.StatusCode.UNAVAILABLE}
KEPT_REQUEST_HEADERS = frozenset({"content-type", "content-encoding", "accept-encoding",
                                  "inference-header-content-length"})


def forwarded_headers(headers: dict[str, str]) -> dict[str, str]:
    """The client's headers for the upstream request: all but hop-by-hop ones and those the connection sets, the
    body's own framing kept."""
    return {k: v for k, v in headers.items()
            if k.lower() in KEPT_REQUEST_HEADERS or k.lower() not in NOT_FORWARDED}


class HttpPassthrough:
    """Open with ``await start()``, close with ``await close()``; ``infer`` forwards one request."""

    def __init__(self, address: str, metrics: SidecarMetrics) -> None:
        self.base = f"http://{address}"
        self.metrics = metrics
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        # no pool limit (as the gRPC channel multiplexes), bodies passed as they come (no decompression here)
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), auto_decompress=False,
                                              timeout=aiohttp.ClientTimeout(total=None))

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def infer(self, model: str, request: web.Request, body: bytes) -> web.Response:
        series = self.metrics.series(model, "passthrough")
        series.requests.inc()
        t0 = time.monotonic()
        try:
            async with self._session.post(self.base + request.path_qs, data=body,
                                          headers=forwarded_headers(dict(request.headers))) as r:
                data = await r.read()
                status = r.status
                headers = {k: v for k, v in r.headers.items() if k.lower() in RESPONSE_HEADERS}
        except aiohttp.ClientError as e:
            self.metrics.child(self.metrics.failures, model, "UNAVAILABLE").inc()
            return web.json_response({"error": f"the pass-through Triton at {self.base} cannot be reached: {e}"},
                                     status=503)
        if status == 200:
            series.successes.inc()
            series.latency.observe(time.monotonic() - t0)
        else:
            code = STATUS_CODES.get(status, grpc.StatusCode.UNKNOWN)
            self.metrics.child(self.metrics.failures, model, code.name).inc()
        return web.Response(status=status, body=data, headers=headers)
