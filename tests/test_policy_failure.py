"""A failure inside a policy step strands nothing (issue 52, item 4): the requests the driver holds get an explicit
error at once, counted as Triton counts a failed request (nv_inference_request_failure, reason BACKEND) and in the
sidecar's own poolpipe_sidecar_policy_failures_total; a new policy serves what comes next."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2

from runtime.launch import Deployment
from runtime.testbed import EMULATED_MODEL, build_emulated_deployment
from scheduler.core.driver import Driver, DriverConfig, StageOutcome
from scheduler.core.policies.retired import POLICY_FAILED
from scheduler.server.common.client_shm import ClientShmRegistry
from scheduler.server.common.errors import ServeError
from scheduler.server.common.metrics import SidecarMetrics
from scheduler.server.common.wire import InferRequest
from scheduler.server.planned.service import PlannedService
from tests.test_driver import SLO_US, _OneShot, _Recorder, two_stage_topology

HELD = 6  # requests queued when the step fails


def test_a_retired_driver_hands_back_what_it_held_and_refuses_retries() -> None:
    """The core side: retire() returns every row it held (queued ones) and drops the policy; a batch in flight still
    completes through the retired driver, and its failed rows are refused at once, never queued where nothing
    steps them."""
    ex, core = _Recorder(), _OneShot()
    drv = Driver(core, two_stage_topology(), ex, DriverConfig.live(), callers=ex)
    drv.submit("running", "m", 0.0, SLO_US)
    drv.step(0.0)
    d, rows, report = ex.executed.pop()
    for i in range(3):
        drv.submit(f"queued{i}", "m", 10.0, SLO_US)
    held = drv.retire()
    assert sorted(t.call for t in held) == ["queued0", "queued1", "queued2"] and not drv.rows
    assert drv.step(20.0) is None and not ex.executed  # nothing decides any more
    report(StageOutcome(d, 0, 100.0, failed="vGPU a0 failed", wanted=rows))  # its retry is refused, answered
    assert ex.rejected == [("running", POLICY_FAILED, False)]


@pytest.mark.triton
def test_every_request_a_failing_step_held_gets_an_explicit_error(tmp_path: Path) -> None:
    deploy = build_emulated_deployment(tmp_path / "deploy", slo_us=5_000_000.0)
    with Deployment(deploy, check_hardware=False, log_dir=tmp_path / "logs"):
        outcome = asyncio.run(_scenario(deploy))
    errors, after, metrics, triton = outcome
    assert len(errors) == HELD  # every held request answered, none left waiting
    for e in errors:
        assert isinstance(e, ServeError) and e.code == grpc.StatusCode.INTERNAL, e
        assert "scheduling policy 'ppipe' failed" in e.message and "policy bug" in e.message
    assert after.model_name == EMULATED_MODEL and len(after.outputs) >= 1  # a new policy serves what comes next
    assert "poolpipe_sidecar_policy_failures_total 1.0" in metrics
    failed = [ln for ln in triton.splitlines()
              if ln.startswith("nv_inference_request_failure{") and 'reason="BACKEND"' in ln]
    assert failed and float(failed[0].rsplit(" ", 1)[1]) == HELD
    ok = [ln for ln in triton.splitlines() if ln.startswith("nv_inference_request_success{")]
    assert ok and float(ok[0].rsplit(" ", 1)[1]) == 1


def _request(service: PlannedService, i: int) -> InferRequest:
    meta = service.metadata(EMULATED_MODEL)
    req = service_pb2.ModelInferRequest(model_name=EMULATED_MODEL, id=f"r{i}")
    shape = [1, *[int(d) for d in meta.inputs[0].shape[1:]]]
    req.inputs.add(name=meta.inputs[0].name, datatype=meta.inputs[0].datatype, shape=shape)
    req.raw_input_contents.append(np.zeros(shape, np.float32).tobytes())
    return InferRequest.from_message(req, None)


async def _scenario(deploy: Path) -> tuple[list[BaseException | None], object, str, str]:
    metrics = SidecarMetrics()
    service = await PlannedService.create(deploy, "ppipe", metrics, ClientShmRegistry())
    try:
        def broken(now_us: float) -> None:
            raise RuntimeError("policy bug")

        service.driver.scheduler.step = broken  # type: ignore[method-assign]  # the serving policy's next step
        futures = [service.submit(_request(service, i)) for i in range(HELD)]  # all queued before the loop runs
        done, pending = await asyncio.wait(futures, timeout=60.0)  # answered at the failed step (old code: never)
        errors = [f.exception() for f in done] + [TimeoutError("never answered")] * len(pending)
        after = await asyncio.wait_for(service.submit(_request(service, HELD)), 60.0)
        return errors, after, metrics.exposition().decode(), service.triton_metrics().decode()
    finally:
        await service.close()
