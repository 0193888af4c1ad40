"""The HTTP/REST front end (aiohttp): KServe v2 JSON, Triton's binary-tensor and shared-memory extensions.

Each request is translated to the protobuf call the gRPC front end makes, so both share the Router.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import re
from typing import Any

from aiohttp import web
from tritonclient.grpc import service_pb2

from scheduler.server.common.errors import ServeError, invalid
from scheduler.server.common.forwarding import set_incoming
from scheduler.server.common.restricted import RestrictedApis, http_category
from scheduler.server.common.tensors import param_value, proto_to_json, set_param
from scheduler.server.common.tls import ServerTls
from scheduler.server.common.wire import InferRequest
from scheduler.server.front.http_infer import HEADER_LENGTH, infer_response_to_http, parse_infer_request
from scheduler.server.front.http_passthrough import HttpPassthrough
from scheduler.server.front.router import Router

log = logging.getLogger("poolpipe.sidecar.http")


COMPRESS_MIN_BYTES = 256  # smaller bodies go as they are: compressing them saves nothing


def _accepts_compression(request: web.Request) -> bool:
    accepted = request.headers.get("Accept-Encoding", "").lower()
    return "gzip" in accepted or "deflate" in accepted


def error_response(e: ServeError) -> web.Response:
    return web.json_response({"error": e.message}, status=e.http_status)


async def _json_body(request: web.Request) -> dict[str, Any]:
    body = await request.read()
    if not body:
        return {}
    try:
        d = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise invalid(f"failed to parse the request JSON buffer: {e}") from None
    if not isinstance(d, dict):
        raise invalid("the request body must be a JSON object")
    return d


# --- JSON views of the metadata calls -------------------------------------------------------------------

def metadata_json(r: service_pb2.ModelMetadataResponse) -> dict[str, Any]:
    def tensors(ts: Any) -> list[dict[str, Any]]:
        return [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in ts]
    return {"name": r.name, "versions": list(r.versions), "platform": r.platform,
            "inputs": tensors(r.inputs), "outputs": tensors(r.outputs)}


class HttpFront:
    def __init__(self, router: Router, restricted: RestrictedApis | None = None,
                 header_pattern: re.Pattern | None = None, passthrough: HttpPassthrough | None = None) -> None:
        self.router = router
        self.passthrough = passthrough  # serve --passthrough-http: pass-through inference forwarded as HTTP
        self.restricted = restricted or RestrictedApis()
        self.header_pattern = header_pattern  # --http-header-forward-pattern: headers as request parameters

    def app(self) -> web.Application:
        app = web.Application(client_max_size=1 << 31, middlewares=[self._compress, self._errors, self._restrict])
        r = app.router
        r.add_get("/v2/health/live", self.live)
        r.add_get("/v2/health/ready", self.ready)
        r.add_get("/v2", self.server_metadata)
        r.add_get("/v2/models/stats", self.stats)
        for base in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
            r.add_get(base, self.model_metadata)
            r.add_get(base + "/ready", self.model_ready)
            r.add_get(base + "/config", self.model_config)
            r.add_get(base + "/stats", self.stats)
            r.add_post(base + "/infer", self.infer)
        r.add_post("/v2/repository/index", self.repository_index)
        r.add_post("/v2/repository/models/{model}/load", self.load)
        r.add_post("/v2/repository/models/{model}/unload", self.unload)
        for path in ("/v2/trace/setting", "/v2/models/{model}/trace/setting"):
            r.add_get(path, self.trace)
            r.add_post(path, self.trace)
        r.add_get("/v2/logging", self.logging)
        r.add_post("/v2/logging", self.logging)
        for kind in ("systemsharedmemory", "cudasharedmemory"):
            r.add_get(f"/v2/{kind}/status", self.shm_status)
            r.add_get(f"/v2/{kind}/region/{{region}}/status", self.shm_status)
            r.add_post(f"/v2/{kind}/region/{{region}}/register", self.shm_register)
            r.add_post(f"/v2/{kind}/unregister", self.shm_unregister)
            r.add_post(f"/v2/{kind}/region/{{region}}/unregister", self.shm_unregister)
        return app

    @web.middleware
    async def _errors(self, request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            return await handler(request)
        except ServeError as e:
            return error_response(e)
        except (ValueError, KeyError, TypeError, AttributeError, OverflowError) as e:  # a JSON field of the wrong type
            return error_response(invalid(f"malformed request: {type(e).__name__}: {e}"))

    @web.middleware
    async def _compress(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """As Triton's HTTP endpoint: a body compressed with gzip or deflate when Accept-Encoding asks for it
        (aiohttp picks the coding; a request body sent with Content-Encoding is decompressed on reading). The
        request's headers are kept for its task first (scheduler/server/common/forwarding.py)."""
        set_incoming(request.headers.items, self.header_pattern)  # headers forwarded to the pass-through
        response = await handler(request)
        if (isinstance(response, web.Response) and response.body is not None and "Content-Encoding" not in
                response.headers and len(response.body) >= COMPRESS_MIN_BYTES and _accepts_compression(request)):
            response.enable_compression()
        return response

    @web.middleware
    async def _restrict(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """--http-restricted-api: a restricted API's call without its header is a 403 naming the header."""
        resource = request.match_info.route.resource
        category = http_category(resource.canonical) if resource is not None else None
        if category is not None and self.restricted.rules:
            self.restricted.check(category, request.headers.get, grpc_call=False)
        return await handler(request)

    async def _call(self, method: str, request: Any) -> Any:
        """A call other than inference: finished even when its client hangs up (the port cancels a handler whose
        connection is lost, so that an inference's rows leave the queue), so a shared-memory registration or a
        repository change is never left half done here and upstream."""
        return await asyncio.shield(self.router.call(method, request))

    async def live(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def ready(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if await self.router.server_ready() else 400)

    async def server_metadata(self, request: web.Request) -> web.Response:
        r = await self._call("ServerMetadata", service_pb2.ServerMetadataRequest())
        return web.json_response({"name": r.name, "version": r.version, "extensions": list(r.extensions)})

    def _names(self, request: web.Request) -> tuple[str, str]:
        return request.match_info.get("model", ""), request.match_info.get("version", "")

    async def model_metadata(self, request: web.Request) -> web.Response:
        m, v = self._names(request)
        r = await self._call("ModelMetadata", service_pb2.ModelMetadataRequest(name=m, version=v))
        return web.json_response(metadata_json(r))

    async def model_ready(self, request: web.Request) -> web.Response:
        m, v = self._names(request)
        r = await self._call("ModelReady", service_pb2.ModelReadyRequest(name=m, version=v))
        return web.Response(status=200 if r.ready else 400)

    async def model_config(self, request: web.Request) -> web.Response:
        m, v = self._names(request)
        r = await self._call("ModelConfig", service_pb2.ModelConfigRequest(name=m, version=v))
        return web.json_response(proto_to_json(r.config))

    async def stats(self, request: web.Request) -> web.Response:
        m, v = self._names(request)
        r = await self._call("ModelStatistics", service_pb2.ModelStatisticsRequest(name=m, version=v))
        return web.json_response(proto_to_json(r))

    async def repository_index(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        r = await self._call("RepositoryIndex", service_pb2.RepositoryIndexRequest(ready=bool(body.get("ready"))))
        return web.json_response([{k: v for k, v in (("name", x.name), ("version", x.version), ("state", x.state),
                                                     ("reason", x.reason)) if v} for x in r.models])

    async def load(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        req = service_pb2.RepositoryModelLoadRequest(model_name=request.match_info["model"])
        for k, v in (body.get("parameters") or {}).items():
            if k.startswith("file:"):
                req.parameters[k].bytes_param = base64.b64decode(v)
            else:
                set_param(req.parameters, k, v)
        await self._call("RepositoryModelLoad", req)
        return web.Response(status=200)

    async def unload(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        req = service_pb2.RepositoryModelUnloadRequest(model_name=request.match_info["model"])
        for k, v in (body.get("parameters") or {}).items():
            set_param(req.parameters, k, v)
        await self._call("RepositoryModelUnload", req)
        return web.Response(status=200)

    @staticmethod
    def _cuda(request: web.Request) -> bool:
        return request.path.startswith("/v2/cudasharedmemory")

    async def shm_status(self, request: web.Request) -> web.Response:
        name = request.match_info.get("region", "")
        if self._cuda(request):
            r = await self._call("CudaSharedMemoryStatus", service_pb2.CudaSharedMemoryStatusRequest(name=name))
            return web.json_response([{"name": x.name, "device_id": x.device_id, "byte_size": x.byte_size}
                                      for x in r.regions.values()])
        r = await self._call("SystemSharedMemoryStatus", service_pb2.SystemSharedMemoryStatusRequest(name=name))
        return web.json_response([{"name": x.name, "key": x.key, "offset": x.offset, "byte_size": x.byte_size}
                                  for x in r.regions.values()])

    async def shm_register(self, request: web.Request) -> web.Response:
        name, body = request.match_info["region"], await _json_body(request)
        if self._cuda(request):
            handle = base64.b64decode((body.get("raw_handle") or {}).get("b64", ""))
            await self._call("CudaSharedMemoryRegister", service_pb2.CudaSharedMemoryRegisterRequest(
                name=name, raw_handle=handle, device_id=int(body.get("device_id", 0)),
                byte_size=int(body["byte_size"])))
        else:
            await self._call("SystemSharedMemoryRegister", service_pb2.SystemSharedMemoryRegisterRequest(
                name=name, key=str(body["key"]), offset=int(body.get("offset", 0)), byte_size=int(body["byte_size"])))
        return web.Response(status=200)

    async def shm_unregister(self, request: web.Request) -> web.Response:
        name = request.match_info.get("region", "")
        if self._cuda(request):
            await self._call("CudaSharedMemoryUnregister",
                                   service_pb2.CudaSharedMemoryUnregisterRequest(name=name))
        else:
            await self._call("SystemSharedMemoryUnregister",
                                   service_pb2.SystemSharedMemoryUnregisterRequest(name=name))
        return web.Response(status=200)

    async def trace(self, request: web.Request) -> web.Response:
        body = await _json_body(request) if request.method == "POST" else {}
        req = service_pb2.TraceSettingRequest(model_name=request.match_info.get("model", ""))
        for k, v in body.items():
            values = v if isinstance(v, list) else ([] if v is None else [v])
            req.settings[k].value.extend(str(x) for x in values)
        r = await self._call("TraceSetting", req)
        return web.json_response({k: (list(v.value) if len(v.value) != 1 or k == "trace_level" else v.value[0])
                                  for k, v in r.settings.items()})

    async def logging(self, request: web.Request) -> web.Response:
        body = await _json_body(request) if request.method == "POST" else {}
        req = service_pb2.LogSettingsRequest()
        for k, v in body.items():
            if isinstance(v, bool):
                req.settings[k].bool_param = v
            elif isinstance(v, int):
                req.settings[k].uint32_param = v
            else:
                req.settings[k].string_param = str(v)
        r = await self._call("LogSettings", req)
        return web.json_response({k: param_value(v) for k, v in r.settings.items()})

    async def infer(self, request: web.Request) -> web.Response:
        m, v = self._names(request)
        body = await request.read()
        if self.passthrough is not None and not self.router.is_planned(m):
            return await self.passthrough.infer(m, request, body)
        req, binary, default_binary, shm_outputs = parse_infer_request(m, v, body, request.headers.get(HEADER_LENGTH))
        resp = await self.router.submit(InferRequest.from_message(req, None))
        return infer_response_to_http(resp, binary, default_binary, shm_outputs)


async def start_http(app: web.Application, bind: str, port: int, drain_timeout_s: float = 30.0,
                     reuse_port: bool = False, tls: ServerTls | None = None, cancel_on_hangup: bool = False
                     ) -> web.AppRunner:
    """``reuse_port``: several processes listen on the port (serve --workers), the kernel spreads connections;
    ``tls``: HTTPS (serve --http-use-ssl), else plaintext HTTP; ``cancel_on_hangup`` (the KServe port): a handler
    whose client hangs up is cancelled, and an inference's future with it, which withdraws its queued rows and their
    reserved GPU time as a gRPC cancellation does (calls that must finish are shielded: HttpFront._call)."""
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=drain_timeout_s,
                           handler_cancellation=cancel_on_hangup)
    await runner.setup()
    context = tls.ssl_context() if tls is not None else None
    await web.TCPSite(runner, bind, port, reuse_port=reuse_port or None, ssl_context=context).start()
    return runner
