"""The HTTP/REST front end (aiohttp): KServe v2 JSON, Triton's binary-tensor and shared-memory extensions.

Each request is translated to the protobuf call the gRPC front end makes, so both share the Router.
"""

from __future__ import annotations

import base64
import json
import logging
from typing import Any

from aiohttp import web
from tritonclient.grpc import service_pb2

from scheduler.server.errors import ServeError, invalid
from scheduler.server.router import Router
from scheduler.server.tensors import (
    json_to_numpy,
    numpy_to_json,
    param_value,
    params_to_dict,
    proto_to_json,
    set_param,
    to_numpy,
    to_raw,
)

log = logging.getLogger("poolpipe.sidecar.http")
HEADER_LENGTH = "Inference-Header-Content-Length"
_HTTP_ONLY_PARAMS = ("binary_data", "binary_data_size", "binary_data_output")


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


# --- inference: HTTP <-> ModelInferRequest/Response -------------------------------------------------------

def parse_infer_request(model: str, version: str, body: bytes, header_length: int | None
                        ) -> tuple[service_pb2.ModelInferRequest, dict[str, bool], bool, dict[str, dict[str, Any]]]:
    """The protobuf request, per requested output whether it wants binary data, the default, and the outputs
    to be written to shared memory (gRPC responses do not mark those, HTTP ones do)."""
    n = len(body) if header_length is None else header_length
    if n > len(body):
        raise invalid(f"{HEADER_LENGTH} {n} is larger than the request body ({len(body)} bytes)")
    try:
        head = json.loads(body[:n])
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise invalid(f"failed to parse the request JSON buffer: {e}") from None
    if not isinstance(head, dict) or not isinstance(head.get("inputs"), list):
        raise invalid("the inference request JSON must be an object with an 'inputs' list")
    req = service_pb2.ModelInferRequest(model_name=model, model_version=version, id=str(head.get("id", "")))
    params = head.get("parameters") or {}
    default_binary = bool(params.get("binary_data_output", False))
    for k, v in params.items():
        if k not in _HTTP_ONLY_PARAMS:
            set_param(req.parameters, k, v)
    pos = n
    for i, t in enumerate(head["inputs"]):
        if not isinstance(t, dict) or "name" not in t or "datatype" not in t or "shape" not in t:
            raise invalid(f"input {i} must have 'name', 'datatype' and 'shape'")
        name, dt, shape = str(t["name"]), str(t["datatype"]), [int(x) for x in t["shape"]]
        tp = t.get("parameters") or {}
        inp = req.inputs.add(name=name, datatype=dt, shape=shape)
        for k, v in tp.items():
            if k not in _HTTP_ONLY_PARAMS:
                set_param(inp.parameters, k, v)
        if "shared_memory_region" in tp:
            continue
        if "binary_data_size" in tp:
            size = int(tp["binary_data_size"])
            if pos + size > len(body):
                raise invalid(f"unexpected end of the binary data of input '{name}': {size} bytes declared, "
                              f"{len(body) - pos} left in the request body")
            req.raw_input_contents.append(body[pos:pos + size])
            pos += size
        elif "data" in t:
            req.raw_input_contents.append(to_raw(json_to_numpy(t["data"], dt, shape, name), dt))
        else:
            raise invalid(f"input '{name}' has neither 'data', 'binary_data_size' nor 'shared_memory_region'")
    binary: dict[str, bool] = {}
    shm_outputs: dict[str, dict[str, Any]] = {}
    for o in head.get("outputs") or []:
        op = o.get("parameters") or {}
        out = req.outputs.add(name=str(o["name"]))
        for k, v in op.items():
            if k not in _HTTP_ONLY_PARAMS:
                set_param(out.parameters, k, v)
        binary[out.name] = bool(op.get("binary_data", default_binary))
        if "shared_memory_region" in op:
            shm_outputs[out.name] = {k: v for k, v in op.items() if k.startswith("shared_memory")}
    return req, binary, default_binary, shm_outputs


def infer_response_to_http(resp: service_pb2.ModelInferResponse, binary: dict[str, bool], default_binary: bool,
                           shm_outputs: dict[str, dict[str, Any]]) -> web.Response:
    head: dict[str, Any] = {"model_name": resp.model_name, "model_version": resp.model_version}
    if resp.id:
        head["id"] = resp.id
    if resp.parameters:
        head["parameters"] = params_to_dict(resp.parameters)
    outputs, blobs = [], []
    for i, o in enumerate(resp.outputs):
        d: dict[str, Any] = {"name": o.name, "datatype": o.datatype, "shape": list(o.shape)}
        p = {**params_to_dict(o.parameters), **shm_outputs.get(o.name, {})}
        if "shared_memory_region" not in p:
            raw = resp.raw_output_contents[i] if i < len(resp.raw_output_contents) else b""
            if binary.get(o.name, default_binary):
                p["binary_data_size"] = len(raw)
                blobs.append(raw)
            else:
                d["data"] = numpy_to_json(to_numpy(raw, o.datatype, list(o.shape)), o.datatype)
        if p:
            d["parameters"] = p
        outputs.append(d)
    head["outputs"] = outputs
    text = json.dumps(head).encode()
    if not blobs:
        return web.Response(body=text, content_type="application/json")
    return web.Response(body=b"".join([text, *blobs]), headers={HEADER_LENGTH: str(len(text))},
                        content_type="application/octet-stream")


# --- JSON views of the metadata calls -------------------------------------------------------------------

def metadata_json(r: service_pb2.ModelMetadataResponse) -> dict[str, Any]:
    def tensors(ts: Any) -> list[dict[str, Any]]:
        return [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in ts]
    return {"name": r.name, "versions": list(r.versions), "platform": r.platform,
            "inputs": tensors(r.inputs), "outputs": tensors(r.outputs)}


class HttpFront:
    def __init__(self, router: Router) -> None:
        self.router = router

    def app(self) -> web.Application:
        app = web.Application(client_max_size=1 << 31, middlewares=[self._errors])
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
        except (ValueError, KeyError, TypeError) as e:
            return error_response(invalid(f"malformed request: {e}"))

    async def live(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def ready(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if await self.router.server_ready() else 400)

    async def server_metadata(self, request: web.Request) -> web.Response:
        r = await self.router.call("ServerMetadata", service_pb2.ServerMetadataRequest())
        return web.json_response({"name": r.name, "version": r.version, "extensions": list(r.extensions)})

    def _names(self, request: web.Request) -> tuple[str, str]:
        return request.match_info.get("model", ""), request.match_info.get("version", "")

    async def model_metadata(self, request: web.Request) -> web.Response:
        m, v = self._names(request)
        r = await self.router.call("ModelMetadata", service_pb2.ModelMetadataRequest(name=m, version=v))
        return web.json_response(metadata_json(r))

    async def model_ready(self, request: web.Request) -> web.Response:
        m, v = self._names(request)
        r = await self.router.call("ModelReady", service_pb2.ModelReadyRequest(name=m, version=v))
        return web.Response(status=200 if r.ready else 400)

    async def model_config(self, request: web.Request) -> web.Response:
        m, v = self._names(request)
        r = await self.router.call("ModelConfig", service_pb2.ModelConfigRequest(name=m, version=v))
        return web.json_response(proto_to_json(r.config))

    async def stats(self, request: web.Request) -> web.Response:
        m, v = self._names(request)
        r = await self.router.call("ModelStatistics", service_pb2.ModelStatisticsRequest(name=m, version=v))
        return web.json_response(proto_to_json(r))

    async def repository_index(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        r = await self.router.call("RepositoryIndex", service_pb2.RepositoryIndexRequest(ready=bool(body.get("ready"))))
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
        await self.router.call("RepositoryModelLoad", req)
        return web.Response(status=200)

    async def unload(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        req = service_pb2.RepositoryModelUnloadRequest(model_name=request.match_info["model"])
        for k, v in (body.get("parameters") or {}).items():
            set_param(req.parameters, k, v)
        await self.router.call("RepositoryModelUnload", req)
        return web.Response(status=200)

    @staticmethod
    def _cuda(request: web.Request) -> bool:
        return request.path.startswith("/v2/cudasharedmemory")

    async def shm_status(self, request: web.Request) -> web.Response:
        name = request.match_info.get("region", "")
        if self._cuda(request):
            r = await self.router.call("CudaSharedMemoryStatus", service_pb2.CudaSharedMemoryStatusRequest(name=name))
            return web.json_response([{"name": x.name, "device_id": x.device_id, "byte_size": x.byte_size}
                                      for x in r.regions.values()])
        r = await self.router.call("SystemSharedMemoryStatus", service_pb2.SystemSharedMemoryStatusRequest(name=name))
        return web.json_response([{"name": x.name, "key": x.key, "offset": x.offset, "byte_size": x.byte_size}
                                  for x in r.regions.values()])

    async def shm_register(self, request: web.Request) -> web.Response:
        name, body = request.match_info["region"], await _json_body(request)
        if self._cuda(request):
            handle = base64.b64decode((body.get("raw_handle") or {}).get("b64", ""))
            await self.router.call("CudaSharedMemoryRegister", service_pb2.CudaSharedMemoryRegisterRequest(
                name=name, raw_handle=handle, device_id=int(body.get("device_id", 0)),
                byte_size=int(body["byte_size"])))
        else:
            await self.router.call("SystemSharedMemoryRegister", service_pb2.SystemSharedMemoryRegisterRequest(
                name=name, key=str(body["key"]), offset=int(body.get("offset", 0)), byte_size=int(body["byte_size"])))
        return web.Response(status=200)

    async def shm_unregister(self, request: web.Request) -> web.Response:
        name = request.match_info.get("region", "")
        if self._cuda(request):
            await self.router.call("CudaSharedMemoryUnregister",
                                   service_pb2.CudaSharedMemoryUnregisterRequest(name=name))
        else:
            await self.router.call("SystemSharedMemoryUnregister",
                                   service_pb2.SystemSharedMemoryUnregisterRequest(name=name))
        return web.Response(status=200)

    async def trace(self, request: web.Request) -> web.Response:
        body = await _json_body(request) if request.method == "POST" else {}
        req = service_pb2.TraceSettingRequest(model_name=request.match_info.get("model", ""))
        for k, v in body.items():
            values = v if isinstance(v, list) else ([] if v is None else [v])
            req.settings[k].value.extend(str(x) for x in values)
        r = await self.router.call("TraceSetting", req)
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
        r = await self.router.call("LogSettings", req)
        return web.json_response({k: param_value(v) for k, v in r.settings.items()})

    async def infer(self, request: web.Request) -> web.Response:
        m, v = self._names(request)
        body = await request.read()
        hl = request.headers.get(HEADER_LENGTH)
        req, binary, default_binary, shm_outputs = parse_infer_request(m, v, body, int(hl) if hl else None)
        resp = await self.router.infer(req, None)
        return infer_response_to_http(resp, binary, default_binary, shm_outputs)


async def start_http(app: web.Application, bind: str, port: int, drain_timeout_s: float = 30.0) -> web.AppRunner:
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=drain_timeout_s)
    await runner.setup()
    await web.TCPSite(runner, bind, port).start()
    return runner
