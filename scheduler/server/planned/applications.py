"""Applications served as one KServe model each: a request to an app runs its DAG of planned models in the sidecar.

Each module's request enters that module's model as a client request would (the same driver loop, batched with
the model's other traffic), with deadline = the app request's deadline less the SLO shares the modules after it
need (``ApplicationInfo.after_us``), so slack a module leaves passes on to the next. A module's outputs come back
to the sidecar from its pipeline's last stage (as every planned model's answer does) and are handed on in memory,
without a round trip to the client: the next module's batch is formed later with other traffic, on a vGPU not
known when the upstream batch is sent, so the shared-memory pool that hops between stages of one pipeline cannot
carry them. Fan-out: an upstream row with N items becomes N rows of the downstream model (each batched on its
own) and its answers are put back together in order. An error or a shed in any module answers the app request
with one explicit error naming the module.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2

from model_repository_gen.app_manifest import ApplicationInfo
from model_repository_gen.manifest import ModelInfo
from scheduler.server.common.client_shm import ClientShmRegistry
from scheduler.server.common.errors import ServeError
from scheduler.server.planned.calls import Answers, now_us, request_deadline_us
from scheduler.server.planned.validate import check_request

Arrays = dict[str, np.ndarray]
# (model, inputs [rows, ...], absolute deadline µs, request id) -> the model's outputs [rows, ...]
RunModule = Callable[[str, Arrays, float, str], Awaitable[Arrays]]


def app_model_info(app: ApplicationInfo) -> ModelInfo:
    """The app as one model: the source module's inputs, the sinks' outputs (per app row), no pipelines."""
    return ModelInfo(app.name, app.slo_us, app.max_batch_size, tuple(t.spec for t in app.inputs),
                     tuple(t.spec for t in app.outputs), ())


def app_config(app: ApplicationInfo) -> mc.ModelConfig:
    cfg = mc.ModelConfig(name=app.name, platform="poolpipe_application", max_batch_size=app.max_batch_size)
    for t in app.inputs:
        cfg.input.add(name=t.spec.name, data_type=mc.DataType.Value("TYPE_" + t.spec.datatype), dims=list(t.spec.shape))
    for t in app.outputs:
        cfg.output.add(name=t.spec.name, data_type=mc.DataType.Value("TYPE_" + t.spec.datatype),
                       dims=list(t.spec.shape))
    cfg.parameters["poolpipe_slo_us"].string_value = str(app.slo_us)
    cfg.parameters["poolpipe_modules"].string_value = ",".join(f"{m.name}:{m.model}" for m in app.modules)
    cfg.parameters["poolpipe_module_slo_us"].string_value = ",".join(f"{m.name}:{m.slo_us:g}" for m in app.modules)
    return cfg


def module_inputs(app: ApplicationInfo, module: str, outputs: dict[str, Arrays]) -> Arrays:
    """A non-source module's inputs from its upstream modules' outputs (fan-out edges: [R, N, *S] -> [R*N, *S])."""
    inputs: Arrays = {}
    for e in app.incoming(module):
        for out, inp in e.tensors:
            a = outputs[e.src][out]
            inputs[inp] = a.reshape(a.shape[0] * e.rows, *a.shape[2:]) if e.rows > 1 else a
    return inputs


def app_outputs(app: ApplicationInfo, outputs: dict[str, Arrays], batch: int) -> Arrays:
    """The app's outputs per app row: a sink with R rows per app row gives [batch, R, *S]."""
    result: Arrays = {}
    for t in app.outputs:
        a = outputs[t.module][t.tensor]
        result[t.spec.name] = a.reshape(batch, *t.spec.shape)
    return result


class Applications:
    """The apps of one manifest; ``run_module`` runs one module's request through its planned model."""

    def __init__(self, apps: tuple[ApplicationInfo, ...], answers: Answers, run_module: RunModule,
                 front_us: float = 0.0) -> None:
        self.apps = {a.name: a for a in apps}
        self.infos = {a.name: app_model_info(a) for a in apps}
        self.answers = answers
        self.run_module = run_module
        self.front_us = front_us  # serve --front-us: the way outside the sidecar's clock

    def has(self, name: str) -> bool:
        return name in self.apps

    def names(self) -> list[str]:
        return list(self.apps)

    def models_of(self, name: str) -> list[str]:
        return [m.model for m in self.apps[name].modules]

    def metadata(self, name: str) -> service_pb2.ModelMetadataResponse:
        m = self.infos[name]
        return service_pb2.ModelMetadataResponse(
            name=name, versions=["1"], platform="poolpipe_application",
            inputs=[service_pb2.ModelMetadataResponse.TensorMetadata(name=t.name, datatype=t.datatype,
                                                                     shape=[-1, *t.shape]) for t in m.inputs],
            outputs=[service_pb2.ModelMetadataResponse.TensorMetadata(name=t.name, datatype=t.datatype,
                                                                      shape=[-1, *t.shape]) for t in m.outputs])

    def config(self, name: str) -> service_pb2.ModelConfigResponse:
        return service_pb2.ModelConfigResponse(config=app_config(self.apps[name]))

    async def infer(self, request: service_pb2.ModelInferRequest, deadline_s: float | None,
                    client_shm: ClientShmRegistry) -> service_pb2.ModelInferResponse:
        app, info = self.apps[request.model_name], self.infos[request.model_name]
        t = now_us()
        call = check_request(request, info, client_shm)
        call.arrival_us = t
        call.deadline_us = deadline = request_deadline_us(t, app.slo_us, call.timeout_us, deadline_s, self.front_us)
        call.future = asyncio.get_running_loop().create_future()
        try:
            outputs = await self._run_dag(app, call.inputs, deadline, request.id)
        except ServeError as e:
            self.answers.fail(call, e)  # counted; the error goes to the client from here, not from the future
            call.future.exception()
            raise
        result = app_outputs(app, outputs, call.batch)
        call.rows = [{n: np.ascontiguousarray(a[i:i + 1]).tobytes() for n, a in result.items()}
                     for i in range(call.batch)]
        call.left = 0
        self.answers.answer(call)
        return await call.future

    async def _run_dag(self, app: ApplicationInfo, inputs: Arrays, deadline_us: float, rid: str
                       ) -> dict[str, Arrays]:
        """Every module once its upstream modules answered (modules on parallel branches run at once)."""
        outputs: dict[str, Arrays] = {}
        tasks: dict[str, asyncio.Task] = {}

        async def run(module: str, model: str) -> None:
            for e in app.incoming(module):
                await tasks[e.src]
            mine = inputs if not app.incoming(module) else module_inputs(app, module, outputs)
            try:
                outputs[module] = await self.run_module(model, mine, deadline_us - app.after_us(module),
                                                        f"{rid}/{module}" if rid else module)
            except ServeError as e:
                raise ServeError(e.code, f"application '{app.name}': module '{module}' (model '{model}') failed: "
                                         f"{e.message}") from None

        for m in app.modules:  # topological order: a module's upstream tasks exist before it starts
            tasks[m.name] = asyncio.ensure_future(run(m.name, m.model))
        try:
            await asyncio.gather(*tasks.values())
        finally:
            for task in tasks.values():
                task.cancel()
            await asyncio.gather(*tasks.values(), return_exceptions=True)
        return outputs
