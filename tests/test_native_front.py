"""``serve --native-grpc-port``: the planned models through Triton's own front end (backends/native_front/).
The frames codec on its own; then a live sidecar over one emulated deployment: the native port answers gRPC and
HTTP as the sidecar's own port does, Triton refuses bad input with its own error and keeps serving, the sidecar's
statistics count what came through it, and neither a stop nor a SIGKILLed sidecar leaves its tritonserver, port or
work directory behind."""

from __future__ import annotations

import os
import signal
import struct
import tempfile
import time
from pathlib import Path

import grpc
import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

from backends import native_front
from model_repository_gen.manifest import ModelInfo
from poolpipe_common.net import free_port, port_in_use
from poolpipe_common.overheads import SIDECAR_LATENCY_PARAMETER
from poolpipe_common.tensors import TensorSpec
from runtime.launch import Deployment
from runtime.sidecar_process import SidecarProcess
from runtime.testbed import EMULATED_MODEL, build_emulated_deployment
from scheduler.server.common.client_shm import ClientShmRegistry
from scheduler.server.common.errors import ServeError
from scheduler.server.common.wire import DecodedRequest, InferRequest, RawAnswer
from scheduler.server.front.native_frames import (
    HELLO_ID,
    FrameError,
    decode_hello,
    decode_request,
    encode_answer,
    encode_error,
    split_frames,
)
from scheduler.server.front.native_front import DIR_PREFIX, reclaim_dirs
from scheduler.server.planned.validate import check
from tests.conftest import run_cli


def _s(text: str) -> bytes:
    return struct.pack("<H", len(text)) + text.encode()


def _request_frame(ident: int, x: np.ndarray, outputs: tuple[str, ...], timeout_us: int = 0) -> bytes:
    """A request frame as poolpipe_front.c writes it (frames.h)."""
    body = struct.pack("<IH", ident, 1) + _s("x") + _s("FP32") + struct.pack("<H", x.ndim)
    body += struct.pack(f"<{x.ndim}q", *x.shape) + struct.pack("<Q", x.nbytes) + x.tobytes()
    body += struct.pack("<H", len(outputs)) + b"".join(_s(o) for o in outputs)
    body += _s(f"req-{ident}") + struct.pack("<Q", timeout_us)
    return struct.pack("<I", len(body)) + body


def test_frames_carry_requests_and_answers_and_refuse_what_does_not_parse() -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    hello = struct.pack("<I", HELLO_ID) + _s("m")
    stream = bytearray(struct.pack("<I", len(hello)) + hello + _request_frame(7, x, ("y",), 2500) + b"\x09\x00")
    frames, used = split_frames(stream)
    assert len(frames) == 2 and used == len(stream) - 2  # the partial third frame waits for its bytes
    assert decode_hello(frames[0]) == "m"
    ident, req = decode_request("m", frames[1])
    assert ident == 7 and req.model_name == "m" and req.outputs == ("y",) and req.id == "req-7"
    assert req.timeout_us == 2500
    assert req.inputs[0][:3] == ("x", "FP32", (2, 3))
    assert np.array_equal(np.frombuffer(req.inputs[0][3], np.float32).reshape(2, 3), x)
    proto = req.to_proto()  # what the gRPC front end would have decoded (application models take it)
    assert (proto.id, proto.inputs[0].name, list(proto.inputs[0].shape), proto.outputs[0].name) == \
        ("req-7", "x", [2, 3], "y") and proto.raw_input_contents[0] == x.tobytes()
    assert proto.parameters["timeout"].int64_param == 2500
    with pytest.raises(FrameError, match="not a hello"):
        decode_hello(frames[1])
    with pytest.raises(FrameError, match="bad request frame|past the frame"):
        decode_request("m", frames[1][:-9])

    resp = service_pb2.ModelInferResponse(model_name="m")  # an application model's answer
    resp.outputs.add(name="y", datatype="FP32", shape=[2, 3])
    resp.raw_output_contents.append(x.tobytes())
    answer = encode_answer(7, resp)
    size, ident, code, n = struct.unpack_from("<IIIH", answer)
    assert (size, ident, code, n) == (len(answer) - 4, 7, 0, 1)
    assert encode_answer(7, RawAnswer((("y", "FP32", (2, 3), x.tobytes()),))) == answer  # a planned model's
    assert answer.endswith(x.tobytes() + struct.pack("<H", 0))  # no response parameters
    resp.parameters["poolpipe_sidecar_latency_us"].int64_param = 1234
    resp.parameters["note"].string_param = "only int64 parameters ride in the frame"
    timed = encode_answer(7, resp)
    assert timed.endswith(x.tobytes() + struct.pack("<H", 1) + _s("poolpipe_sidecar_latency_us")
                          + struct.pack("<q", 1234))
    assert timed == encode_answer(7, RawAnswer((("y", "FP32", (2, 3), x.tobytes()),),
                                               (("poolpipe_sidecar_latency_us", 1234),)))
    shed = encode_error(8, grpc.StatusCode.UNAVAILABLE, "shed")
    assert struct.unpack_from("<II", shed, 4) == (8, 4) and shed.endswith(_s("shed"))  # TRITONSERVER UNAVAILABLE
    typed = service_pb2.ModelInferResponse(model_name="m")
    typed.outputs.add(name="y", datatype="FP32", shape=[1])  # contents, not raw: refused, never half-sent
    assert struct.unpack_from("<II", encode_answer(9, typed), 4) == (9, 1)


def test_reclaim_removes_only_the_directories_of_dead_sidecars(tmp_path: Path) -> None:
    dead = psutil.Popen(["true"])
    dead.wait()
    mine, theirs = tmp_path / f"{DIR_PREFIX}{psutil.Process().pid}-a", tmp_path / f"{DIR_PREFIX}{dead.pid}-b"
    for d in (mine, theirs):
        d.mkdir()
    assert reclaim_dirs(tmp_path) == [theirs] and mine.is_dir() and not theirs.exists()


def test_serve_refuses_native_front_combinations_it_cannot_serve(tmp_path: Path) -> None:
    deploy = build_emulated_deployment(tmp_path, gpus=2)
    ports = ("--grpc-port", "1", "--http-port", "2", "--metrics-port", "3")
    r = run_cli("serve", "--passthrough", "127.0.0.1:1", "--native-grpc-port", "4", *ports)
    assert r.returncode == 2 and "--native-grpc-port needs --manifest" in r.stderr
    r = run_cli("serve", "--manifest", deploy, "--workers", "2", "--native-grpc-port", "2", *ports)
    assert r.returncode == 2 and "--native-grpc-port: port 2" in r.stderr  # with --workers too, before any starts
    r = run_cli("serve", "--manifest", deploy, "--native-grpc-port", "2", *ports)
    assert r.returncode == 2 and "--native-grpc-port: port 2" in r.stderr


def _shm_round_trip(client: grpcclient.InferenceServerClient, inp: grpcclient.InferInput, x: np.ndarray, out: str,
                    want: np.ndarray) -> None:
    """One request with input and output in system shared memory registered on ``client``'s server."""
    names = (f"nf_in_{os.getpid()}", f"nf_out_{os.getpid()}")
    regions = [shm.create_shared_memory_region(names[0], f"/{names[0]}", x.nbytes),
               shm.create_shared_memory_region(names[1], f"/{names[1]}", want.nbytes)]
    try:
        shm.set_shared_memory_region(regions[0], [x])
        client.register_system_shared_memory(names[0], f"/{names[0]}", x.nbytes)
        client.register_system_shared_memory(names[1], f"/{names[1]}", want.nbytes)
        inp = grpcclient.InferInput(inp.name(), list(x.shape), "FP32")
        inp.set_shared_memory(names[0], x.nbytes)
        requested = grpcclient.InferRequestedOutput(out)
        requested.set_shared_memory(names[1], want.nbytes)
        client.infer(EMULATED_MODEL, [inp], outputs=[requested])
        got = shm.get_contents_as_numpy(regions[1], np.float32, list(want.shape))
        assert np.array_equal(got, want)
    finally:
        client.unregister_system_shared_memory()
        for r in regions:
            shm.destroy_shared_memory_region(r)


def _front(sc: SidecarProcess) -> psutil.Process:
    (proc,) = [p for p in psutil.Process(sc.proc.pid).children() if p.name() == "tritonserver"]
    return proc


@pytest.mark.triton
@pytest.mark.skipif(native_front.library() is None, reason="no C compiler here")
def test_native_front_serves_the_planned_models_and_leaves_nothing(tmp_path: Path) -> None:
    deploy = build_emulated_deployment(tmp_path, slo_us=3_000_000.0)
    port, http_port = free_port("127.0.0.1"), free_port("127.0.0.1")
    sc = SidecarProcess(manifest=deploy, log_path=tmp_path / "sidecar.log",
                        extra_args=("--native-grpc-port", str(port), "--native-http-port", str(http_port)))
    with Deployment(deploy, check_hardware=False, log_dir=tmp_path / "logs"):
        try:
            sc.start().wait_ready()
            front, pid = _front(sc), sc.proc.pid
            own = grpcclient.InferenceServerClient(sc.grpc_url)
            meta = own.get_model_metadata(EMULATED_MODEL)
            shape = [2, *[int(d) for d in meta.inputs[0].shape[1:]]]
            x = np.random.default_rng(0).random(shape, dtype=np.float32)
            inp = grpcclient.InferInput(meta.inputs[0].name, shape, "FP32")
            inp.set_data_from_numpy(x)
            out = meta.outputs[0].name
            want = own.infer(EMULATED_MODEL, [inp]).as_numpy(out)
            native = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
            for _ in range(3):
                t0 = time.perf_counter()
                answer = native.infer(EMULATED_MODEL, [inp])
                client_us = (time.perf_counter() - t0) * 1e6
                assert np.array_equal(answer.as_numpy(out), want)
                # the sidecar's own time rides along, as through its gRPC front end (loadtest reads the way outside)
                assert 0 < answer.get_response().parameters[SIDECAR_LATENCY_PARAMETER].int64_param < client_us
            hinp = httpclient.InferInput(meta.inputs[0].name, shape, "FP32")
            hinp.set_data_from_numpy(x, binary_data=True)
            got = httpclient.InferenceServerClient(f"127.0.0.1:{http_port}").infer(EMULATED_MODEL, [hinp])
            assert np.array_equal(got.as_numpy(out), want)
            assert got.get_response()["parameters"][SIDECAR_LATENCY_PARAMETER] > 0
            bad = grpcclient.InferInput(meta.inputs[0].name, [2, 3], "FP32")
            bad.set_data_from_numpy(np.zeros((2, 3), np.float32))
            with pytest.raises(InferenceServerException, match="unexpected shape|expected shape"):
                native.infer(EMULATED_MODEL, [bad])
            assert np.array_equal(native.infer(EMULATED_MODEL, [inp]).as_numpy(out), want)  # still serving
            # the client's timeout parameter reaches the sidecar: a deadline no path meets is shed at once
            with pytest.raises(InferenceServerException, match="request shed") as shed:
                native.infer(EMULATED_MODEL, [inp], timeout=1000)
            assert shed.value.status() == "StatusCode.UNAVAILABLE"
            _shm_round_trip(native, inp, x, out, want)  # Triton's own shared-memory API on the native port
            stats = own.get_inference_statistics(EMULATED_MODEL).model_stats[0]
            assert stats.inference_count == 2 * 7  # the sidecar scheduled the native front's requests too
        finally:
            sc.stop()
    assert not psutil.pid_exists(front.pid) and not port_in_use(port)
    assert not list(Path(tempfile.gettempdir()).glob(f"{DIR_PREFIX}{pid}-*"))


@pytest.mark.triton
@pytest.mark.skipif(native_front.library() is None, reason="no C compiler here")
def test_a_killed_sidecar_takes_its_native_front_down(tmp_path: Path) -> None:
    deploy = build_emulated_deployment(tmp_path, slo_us=3_000_000.0)
    port = free_port("127.0.0.1")
    sc = SidecarProcess(manifest=deploy, log_path=tmp_path / "sidecar.log",
                        extra_args=("--native-grpc-port", str(port)))
    front = None
    with Deployment(deploy, check_hardware=False, log_dir=tmp_path / "logs"):
        try:
            sc.start().wait_ready()
            front, pid = _front(sc), sc.proc.pid
            sc.proc.send_signal(signal.SIGKILL)
            sc.proc.wait()
            deadline = time.monotonic() + 30
            while front.is_running() and front.status() != psutil.STATUS_ZOMBIE:
                assert time.monotonic() < deadline, "the native front's tritonserver outlived its sidecar"
                time.sleep(0.2)
            assert not port_in_use(port)
        finally:
            sc.stop()
            if front is not None and front.is_running():
                front.kill()
    reclaim_dirs()
    assert not list(Path(tempfile.gettempdir()).glob(f"{DIR_PREFIX}{pid}-*"))


@pytest.mark.triton
@pytest.mark.skipif(native_front.library() is None, reason="no C compiler here")
def test_a_killed_native_front_is_started_again(tmp_path: Path) -> None:
    deploy = build_emulated_deployment(tmp_path, slo_us=3_000_000.0)
    port, log = free_port("127.0.0.1"), tmp_path / "sidecar.log"
    with Deployment(deploy, check_hardware=False, log_dir=tmp_path / "logs"), \
            SidecarProcess(manifest=deploy, log_path=log, extra_args=("--native-grpc-port", str(port))) as sc:
        meta = grpcclient.InferenceServerClient(sc.grpc_url).get_model_metadata(EMULATED_MODEL)
        shape = [1, *[int(d) for d in meta.inputs[0].shape[1:]]]
        inp = grpcclient.InferInput(meta.inputs[0].name, shape, "FP32")
        inp.set_data_from_numpy(np.zeros(shape, np.float32))
        first = _front(sc)
        first.kill()
        deadline = time.monotonic() + 60
        while "event=native_front_restarted" not in log.read_text():
            assert time.monotonic() < deadline, "the native front was not started again"
            time.sleep(0.2)
        assert _front(sc).pid != first.pid
        grpcclient.InferenceServerClient(f"127.0.0.1:{port}").infer(EMULATED_MODEL, [inp])  # serving again
    assert "event=native_front_exited status=-9" in log.read_text()


@pytest.mark.triton
@pytest.mark.skipif(native_front.library() is None, reason="no C compiler here")
def test_a_shed_request_gets_the_sidecars_error_through_the_native_front(tmp_path: Path) -> None:
    deploy = build_emulated_deployment(tmp_path, slo_us=2_000.0)  # the pipeline alone takes longer
    port = free_port("127.0.0.1")
    with Deployment(deploy, check_hardware=False, log_dir=tmp_path / "logs"), \
            SidecarProcess(manifest=deploy, log_path=tmp_path / "sidecar.log",
                           extra_args=("--native-grpc-port", str(port))) as sc:
        meta = grpcclient.InferenceServerClient(sc.grpc_url).get_model_metadata(EMULATED_MODEL)
        shape = [1, *[int(d) for d in meta.inputs[0].shape[1:]]]
        inp = grpcclient.InferInput(meta.inputs[0].name, shape, "FP32")
        inp.set_data_from_numpy(np.zeros(shape, np.float32))
        with pytest.raises(InferenceServerException) as e:
            grpcclient.InferenceServerClient(f"127.0.0.1:{port}").infer(EMULATED_MODEL, [inp])
        assert e.value.status() == "StatusCode.UNAVAILABLE" and "request shed" in e.value.message()


def test_a_request_triton_checked_is_taken_as_the_full_check_takes_it() -> None:
    """The one check takes a request Triton decoded as it takes the same request as protobuf; what does not match
    the model (a reload changed it) gets the full check's own Triton-worded error."""
    model = ModelInfo("m", 1e5, 4, (TensorSpec("x", "FP32", (3,)),),
                      (TensorSpec("y", "FP32", (3,)), TensorSpec("z", "INT64", (1,))), ())
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    registry = ClientShmRegistry()
    for outputs, timeout_us in (((), 0), (("z",), 1500), (("z", "y"), 0)):
        req = DecodedRequest("m", "r", (("x", "FP32", (2, 3), x.tobytes()),), outputs, timeout_us)
        fast = check(InferRequest.from_decoded(req, None), model, registry)
        full = check(InferRequest.from_message(req.to_proto(), None), model, registry)
        assert fast.raw and not full.raw  # the native front end's is answered with raw tensors
        assert (fast.batch, fast.timeout_us, fast.priority, fast.outputs) == \
            (full.batch, full.timeout_us, full.priority, full.outputs)
        assert fast.batch == 2 and np.array_equal(fast.inputs["x"], full.inputs["x"])
        assert fast.timeout_us == (timeout_us or None)
    wrong = {"unexpected shape for input 'x'": ("x", "FP32", (2, 4), bytes(32)),
             "data-type is 'FP16'": ("x", "FP16", (2, 3), bytes(12)),
             "unexpected inference input 'w'": ("w", "FP32", (2, 3), bytes(24)),
             "input byte size mismatch": ("x", "FP32", (2, 3), bytes(20)),
             "batch-size must be <= 4": ("x", "FP32", (5, 3), bytes(60))}
    for message, tensor in wrong.items():
        with pytest.raises(ServeError, match=message) as e:
            check(InferRequest.from_decoded(DecodedRequest("m", "r", (tensor,), ()), None), model, registry)
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(ServeError, match="unexpected inference output 'q'"):
        check(InferRequest.from_decoded(DecodedRequest("m", "r", (("x", "FP32", (2, 3), x.tobytes()),), ("q",)), None),
              model, registry)
