"""A request cancelled while the sidecar holds it (its client gave up: a gRPC deadline passed) through the native
front end is dropped, as Triton's schedulers drop a cancelled request: the front answers it CANCELLED at once and
withdraws it with a cancel frame, and the sidecar answers each id exactly once so the front can reuse it."""

from __future__ import annotations

import asyncio
import struct
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from backends import native_front
from poolpipe_common.net import free_port
from runtime.launch import Deployment
from runtime.sidecar_process import SidecarProcess
from runtime.testbed import EMULATED_MODEL, build_emulated_deployment
from scheduler.server.common.wire import RawAnswer
from scheduler.server.front.native_frames import CANCEL_ID, HELLO_ID, decode_cancel, split_frames
from scheduler.server.front.native_front import _Connection
from tests.test_native_front import _request_frame, _s


class _Router:
    """The router's submit as the connection sees it: each request's future, answered by the test."""

    def __init__(self) -> None:
        self.futures: list[asyncio.Future] = []

    def submit(self, request) -> asyncio.Future:
        self.futures.append(asyncio.get_running_loop().create_future())
        return self.futures[-1]


class _Transport:
    def __init__(self) -> None:
        self.data = bytearray()

    def write(self, data: bytes) -> None:
        self.data += data

    def is_closing(self) -> bool:
        return False


def _frame(body: bytes) -> bytes:
    return struct.pack("<I", len(body)) + body


def test_each_id_gets_one_answer_frame_whether_the_cancel_comes_before_or_after_its_answer() -> None:
    async def scenario() -> list[tuple[int, int]]:
        router, transport = _Router(), _Transport()
        conn = _Connection(router)  # type: ignore[arg-type]
        conn.connection_made(transport)  # type: ignore[arg-type]
        x = np.ones((1, 3), np.float32)
        conn.data_received(_frame(struct.pack("<I", HELLO_ID) + _s("m")) + _request_frame(0, x, ())
                           + _request_frame(1, x, ()) + _request_frame(2, x, ()))
        queued, answered, raced = router.futures
        answered.set_result(RawAnswer((("y", "FP32", (1, 3), x.tobytes()),)))
        await asyncio.sleep(0.01)  # answered's frame leaves
        raced.set_result(RawAnswer((("y", "FP32", (1, 3), x.tobytes()),)))  # done, its callback not yet run
        conn.data_received(b"".join(_frame(struct.pack("<II", CANCEL_ID, i)) for i in (0, 1, 2)))
        await asyncio.sleep(0.01)
        assert queued.cancelled()  # a queued request is dropped
        frames, _ = split_frames(bytearray(transport.data))
        return [struct.unpack_from("<II", f) for f in frames]

    # 1: its answer, sent before the cancel (no second frame); 0 and 2: the cancel frame's answer (CANCELLED)
    assert sorted(asyncio.run(scenario())) == [(0, 7), (1, 0), (2, 7)]
    assert decode_cancel(struct.pack("<II", CANCEL_ID, 5)) == 5 and decode_cancel(struct.pack("<II", 5, 0)) is None


@pytest.mark.triton
@pytest.mark.skipif(native_front.library() is None, reason="no C compiler here")
def test_requests_whose_clients_gave_up_are_not_scheduled(tmp_path: Path) -> None:
    """400 requests at once with a 0.3 s deadline, where the pipeline serves about 150 req/s: those still queued
    when their clients give up are dropped, not run (before the cancel watcher, all 400 ran)."""
    deploy = build_emulated_deployment(tmp_path, slo_us=3_000_000.0)
    port, n = free_port("127.0.0.1"), 400
    with Deployment(deploy, check_hardware=False, log_dir=tmp_path / "logs"), \
            SidecarProcess(manifest=deploy, log_path=tmp_path / "sidecar.log",
                           extra_args=("--native-grpc-port", str(port))) as sc:
        own = grpcclient.InferenceServerClient(sc.grpc_url)
        meta = own.get_model_metadata(EMULATED_MODEL)
        shape = [1, *[int(d) for d in meta.inputs[0].shape[1:]]]
        inp = grpcclient.InferInput(meta.inputs[0].name, shape, "FP32")
        inp.set_data_from_numpy(np.zeros(shape, np.float32))
        out = meta.outputs[0].name
        native = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
        want = native.infer(EMULATED_MODEL, [inp]).as_numpy(out)
        statuses: list[str] = []
        lock, all_back = threading.Lock(), threading.Event()

        def answered(result, error) -> None:
            with lock:
                right = error is None and np.array_equal(result.as_numpy(out), want)
                statuses.append("right" if right else error.status() if error is not None else "wrong")
                if len(statuses) == n:
                    all_back.set()

        for _ in range(n):
            native.async_infer(EMULATED_MODEL, [inp], answered, client_timeout=0.3)
        assert all_back.wait(30), "a request got no answer"
        gave_up = statuses.count("StatusCode.DEADLINE_EXCEEDED")
        assert gave_up > n / 2 and statuses.count("right") + gave_up == n
        # what was running or queued then finishes (the SLO is 3 s); only what was scheduled counts
        time.sleep(4.0)
        scheduled = own.get_inference_statistics(EMULATED_MODEL).model_stats[0].inference_count - 1
        assert scheduled < n / 2, f"{scheduled} of {n} requests were scheduled, {gave_up} of them abandoned"
        # the ids the cancelled requests held are reused: the next requests are answered right
        for _ in range(3):
            assert np.array_equal(native.infer(EMULATED_MODEL, [inp]).as_numpy(out), want)
