"""Property-based fuzzing of a live sidecar (two emulated tritonservers behind it): hypothesis generates malformed
KServe v2 requests over gRPC and HTTP (loadtest/fuzz_cases.py: names, datatypes, shapes, byte counts, huge and
negative dims, JSON, the binary-extension header, shared-memory references, outputs); every one is answered with
an error (never accepted, never a 500/UNKNOWN, never left hanging), cancellations leave it serving, and a valid
request still succeeds afterwards."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loadtest.fuzz_cases import GrpcCase, grpc_case, http_case, hypothesis_chooser, valid_grpc, valid_http
from loadtest.fuzz_client import cancel_grpc, cancel_http, fuzz_target, send_grpc, send_http
from runtime.launch import Deployment
from runtime.sidecar_process import SidecarProcess
from runtime.testbed import EMULATED_MODEL, build_emulated_deployment
from scheduler.server.planned.shm_pool import PREFIX

pytestmark = pytest.mark.triton
TIMEOUT_S = 15.0
FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class Live:
    """The sidecar under test, and a client event loop with a gRPC channel, an HTTP session and the target."""

    def __init__(self, sc: SidecarProcess) -> None:
        self.sc = sc
        self.loop = asyncio.new_event_loop()
        self.channel, self.session = self.run(self._open())
        self._target_cm = fuzz_target(self.channel, EMULATED_MODEL, "test")
        self.target = self.run(self._target_cm.__aenter__())

    async def _open(self) -> tuple[grpc.aio.Channel, aiohttp.ClientSession]:
        return grpc.aio.insecure_channel(self.sc.grpc_url), aiohttp.ClientSession()

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def valid_requests_succeed(self) -> None:
        for batch in (1, self.target.max_batch):
            assert self.run(send_grpc(self.channel, GrpcCase("valid", valid_grpc(self.target, batch)),
                                      TIMEOUT_S)).result == "accepted"
            o = self.run(send_http(self.session, f"http://{self.sc.http_url}", valid_http(self.target, batch),
                                   TIMEOUT_S))
            assert o.result == "accepted", o
        assert self.sc.proc is not None and self.sc.proc.poll() is None, "the sidecar exited"

    def close(self) -> None:
        self.run(self._target_cm.__aexit__(None, None, None))
        self.run(self.session.close())
        self.run(self.channel.close())
        self.loop.close()


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory):
    work = tmp_path_factory.mktemp("fuzz")
    deploy = build_emulated_deployment(work)
    with Deployment(deploy, check_hardware=False, log_dir=work / "logs"):
        sc = SidecarProcess(manifest=deploy, log_path=work / "sidecar.log").start()
        live = None
        try:
            live = Live(sc)
            live.run(_ready(live))
            yield live
        finally:
            if live is not None:
                live.close()
            pid = sc.proc.pid if sc.proc else None
            assert sc.stop() == 0
            assert not list(Path("/dev/shm").glob(f"{PREFIX}{pid}_*"))


async def _ready(live: Live, timeout_s: float = 60.0) -> None:
    for _ in range(int(timeout_s / 0.2)):
        o = await send_grpc(live.channel, GrpcCase("valid", valid_grpc(live.target)), TIMEOUT_S)
        if o.result == "accepted":
            return
        await asyncio.sleep(0.2)
    raise TimeoutError("the sidecar did not serve a valid request")


def test_malformed_grpc_requests_are_answered_with_errors(live: Live) -> None:
    @FUZZ
    @given(st.data())
    def check(data: st.DataObject) -> None:
        case = grpc_case(hypothesis_chooser(data.draw), live.target)
        o = live.run(send_grpc(live.channel, case, TIMEOUT_S))
        assert o.result == "error", (case.kind, case.request, o)
    check()
    live.valid_requests_succeed()


def test_malformed_http_requests_are_answered_with_errors(live: Live) -> None:
    @FUZZ
    @given(st.data())
    def check(data: st.DataObject) -> None:
        case = http_case(hypothesis_chooser(data.draw), live.target)
        o = live.run(send_http(live.session, f"http://{live.sc.http_url}", case, TIMEOUT_S))
        assert o.result == "error", (case.kind, case.path, case.headers, case.body[:300], o)
    check()
    live.valid_requests_succeed()


def test_concurrent_cancellations_leave_the_sidecar_serving(live: Live) -> None:
    t, base = live.target, f"http://{live.sc.http_url}"

    async def storm() -> list[str]:
        calls = [cancel_grpc(live.channel, valid_grpc(t, 1 + i % t.max_batch), i % 7 / 1000) for i in range(30)]
        calls += [cancel_http(live.session, base, valid_http(t, 1), 0.001 + i % 7 / 1000) for i in range(30)]
        return [o.result for o in await asyncio.gather(*calls)]

    results = live.run(storm())
    assert "unhandled" not in results and "hung" not in results, results
    assert results.count("cancelled") >= 30, results  # most were cancelled before their answer
    # Batches the storm's requests were dispatched in keep their reserved GPU time although their callers
    # left; on a busy machine a request sent into that backlog may be shed (explicitly). Once the storm's
    # deadlines (1 s) have passed, the sidecar must serve as before.
    live.run(asyncio.sleep(2.0))
    live.valid_requests_succeed()
