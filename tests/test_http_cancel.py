"""An HTTP client that hangs up withdraws its request as a gRPC cancellation does: its queued rows are not run
(the planned model's statistics count what was scheduled), and the sidecar serves on."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from runtime.launch import Deployment
from runtime.sidecar_process import SidecarProcess
from runtime.testbed import EMULATED_MODEL, build_emulated_deployment

pytestmark = pytest.mark.triton


async def _hang_ups(url: str, body: bytes, header_length: int, n: int, give_up_s: float) -> list[str]:
    """``n`` HTTP inferences at once, each on its own connection, whose clients hang up after ``give_up_s``."""
    headers = {"Inference-Header-Content-Length": str(header_length), "Content-Type": "application/octet-stream"}
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=give_up_s)) as s:
        async def one() -> str:
            try:
                async with s.post(f"http://{url}/v2/models/{EMULATED_MODEL}/infer", data=body,
                                  headers=headers) as r:
                    await r.read()
                    return str(r.status)
            except asyncio.TimeoutError:
                return "gave up"
        return await asyncio.gather(*(one() for _ in range(n)))


def test_http_hang_ups_leave_the_queue(tmp_path: Path) -> None:
    """400 requests at once where the pipeline serves about 150 req/s; their clients hang up after 0.3 s: those
    still queued are dropped, not run (before, all 400 ran: aiohttp let the handler wait for its answer)."""
    deploy = build_emulated_deployment(tmp_path, slo_us=3_000_000.0)
    n = 400
    with Deployment(deploy, check_hardware=False, log_dir=tmp_path / "logs"), \
            SidecarProcess(manifest=deploy, log_path=tmp_path / "sidecar.log") as sc:
        sc.wait_ready()
        own = grpcclient.InferenceServerClient(sc.grpc_url)
        meta = own.get_model_metadata(EMULATED_MODEL)
        shape = [1, *[int(d) for d in meta.inputs[0].shape[1:]]]
        inp = httpclient.InferInput(meta.inputs[0].name, shape, "FP32")
        inp.set_data_from_numpy(np.zeros(shape, np.float32), binary_data=True)
        body, header_length = httpclient.InferenceServerClient.generate_request_body([inp])
        statuses = asyncio.run(_hang_ups(sc.http_url, body, header_length, n, 0.3))
        gave_up = statuses.count("gave up")
        assert gave_up > n / 2 and statuses.count("200") + gave_up == n, statuses
        time.sleep(4.0)  # what was running or queued then finishes (the SLO is 3 s); only what was scheduled counts
        scheduled = own.get_inference_statistics(EMULATED_MODEL).model_stats[0].inference_count
        assert scheduled < n / 2, f"{scheduled} of {n} requests were scheduled, {gave_up} of them abandoned"
        hc = httpclient.InferenceServerClient(sc.http_url)
        for _ in range(3):  # and it serves on
            assert hc.infer(EMULATED_MODEL, [inp]).as_numpy(meta.outputs[0].name) is not None
