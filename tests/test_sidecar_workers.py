"""``serve --workers 2`` over one emulated deployment (two GPUs per pool, one host, so hops use the sidecar's
shared-memory pool): both workers listen on the same ports and serve, a client shared-memory registration made
through one connection works on either worker, metrics and statistics are summed once, trace settings and a
reload reach every worker, a SIGKILLed worker is restarted and serves again, and after stop no process or shm
region is left."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.utils.shared_memory as shm

from backends import native_front
from poolpipe_common.net import free_port
from runtime import netbed
from runtime.launch import Deployment
from runtime.sidecar_process import SidecarProcess
from runtime.testbed import EMULATED_MODEL, build_emulated_deployment
from scheduler.server.front.native_front import DIR_PREFIX
from scheduler.server.planned.shm_pool import PREFIX, SHM_DIR
from tests.conftest import ROOT, run_cli

pytestmark = pytest.mark.triton
CLIENTS = 16  # separate connections (the kernel spreads connections, not requests, over the workers)


def _workers(sc: SidecarProcess) -> list[psutil.Process]:
    """The running workers, by shard (a child between fork and exec, or a zombie, is not one yet or any more)."""
    found = []
    for p in psutil.Process(sc.proc.pid).children():
        try:
            cmd = p.cmdline()
            if "--worker-of" in cmd and p.status() != psutil.STATUS_ZOMBIE:
                found.append((cmd[cmd.index("--shard") + 1], p))
        except psutil.Error:
            continue
    return [p for _, p in sorted(found, key=lambda x: x[0])]


def _private_port(p: psutil.Process) -> int:
    return int(p.cmdline()[p.cmdline().index("--metrics-port") + 1])


def _metric(text: str, name: str) -> float:
    m = re.search(rf'^{name}{{model="{EMULATED_MODEL}",route="planned"}} (\S+)$', text, re.M)
    return float(m.group(1)) if m else 0.0


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


def _requests(port: int) -> float:
    return _metric(_get(f"http://127.0.0.1:{port}/metrics"), "poolpipe_sidecar_requests_total")


class ShmClient:
    """Input and output regions registered once, through one connection, as a Triton user does."""

    def __init__(self, sc: SidecarProcess) -> None:
        c = grpcclient.InferenceServerClient(sc.grpc_url)
        meta = c.get_model_metadata(EMULATED_MODEL)
        self.inp, self.out = meta.inputs[0], meta.outputs[0]
        self.shape = [1, *[int(d) for d in self.inp.shape[1:]]]
        self.in_bytes = int(np.prod(self.shape)) * 4
        self.out_bytes = int(np.prod([int(d) for d in self.out.shape[1:]])) * 4
        tag = os.getpid()
        self.names = (f"wk_in_{tag}", f"wk_out_{tag}")
        self.handles = [shm.create_shared_memory_region(self.names[0], f"/{self.names[0]}", self.in_bytes),
                        shm.create_shared_memory_region(self.names[1], f"/{self.names[1]}", self.out_bytes)]
        shm.set_shared_memory_region(self.handles[0], [np.ones(self.shape, np.float32)])
        c.register_system_shared_memory(self.names[0], f"/{self.names[0]}", self.in_bytes)
        c.register_system_shared_memory(self.names[1], f"/{self.names[1]}", self.out_bytes)

    def infer(self, url: str, n: int) -> None:
        """``n`` requests on a new connection, input and output in the registered regions."""
        c = grpcclient.InferenceServerClient(url, channel_args=[("grpc.use_local_subchannel_pool", 1)])
        inp = grpcclient.InferInput(self.inp.name, self.shape, self.inp.datatype)
        inp.set_shared_memory(self.names[0], self.in_bytes)
        out = grpcclient.InferRequestedOutput(self.out.name)
        out.set_shared_memory(self.names[1], self.out_bytes)
        sentinel = np.full(self.out_bytes // 4, -7.0, np.float32)
        for _ in range(n):
            shm.set_shared_memory_region(self.handles[1], [sentinel])
            c.infer(EMULATED_MODEL, [inp], outputs=[out], client_timeout=30)
            got = shm.get_contents_as_numpy(self.handles[1], np.float32, [self.out_bytes // 4])
            assert not np.array_equal(got, sentinel)  # the worker wrote the answer into the client's region
        c.close()

    def close(self) -> None:
        for h in self.handles:
            shm.destroy_shared_memory_region(h)


def _wait(what: str, ok, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not ok():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def test_two_workers_serve_as_one_triton_and_survive_a_killed_worker(tmp_path: Path) -> None:
    deploy = build_emulated_deployment(tmp_path, slo_us=3_000_000.0, gpus=2, addresses=("127.0.0.1", "127.0.0.1"))
    log = tmp_path / "sidecar.log"
    sc = SidecarProcess(manifest=deploy, log_path=log, extra_args=("--workers", "2"))
    seen: set[int] = set()
    cleanup = []
    with Deployment(deploy, check_hardware=False, log_dir=tmp_path / "logs"):
        try:
            sc.start().wait_ready()
            workers = _workers(sc)
            seen |= {w.pid for w in workers}
            assert len(workers) == 2
            for w in workers:  # both listen on the one gRPC port and the one HTTP port
                listening = {c.laddr.port for c in w.net_connections("tcp") if c.status == psutil.CONN_LISTEN}
                assert {sc.grpc_port, sc.http_port} <= listening
            client = ShmClient(sc)
            cleanup.append(client.close)
            for _ in range(CLIENTS):
                client.infer(sc.grpc_url, 2)
            sent = 2 * CLIENTS
            per_worker = [_requests(_private_port(w)) for w in workers]
            assert all(n > 0 for n in per_worker) and sum(per_worker) == sent  # both served, shm on either
            merged = _get(f"http://127.0.0.1:{sc.metrics_port}/metrics")
            assert _metric(merged, "poolpipe_sidecar_requests_total") == sent  # summed once
            stats = grpcclient.InferenceServerClient(sc.grpc_url).get_inference_statistics(EMULATED_MODEL)
            assert stats.model_stats[0].inference_count == sent
            grpcclient.InferenceServerClient(sc.grpc_url).update_trace_settings(settings={"trace_rate": "7"})
            for _ in range(CLIENTS):  # the trace extension's update reached every worker
                c = grpcclient.InferenceServerClient(sc.grpc_url, channel_args=[("grpc.use_local_subchannel_pool", 1)])
                assert c.get_trace_settings(as_json=True)["settings"]["trace_rate"]["value"] == ["7"]
                c.close()

            req = urllib.request.Request(f"http://{sc.http_url}/v2/poolpipe/reload", data=b"", method="POST")
            with urllib.request.urlopen(req, timeout=120) as r:
                report = json.loads(r.read())
            assert [w["generation"] for w in report["workers"]] == [1, 1]
            sc.proc.send_signal(signal.SIGHUP)  # to the parent: every worker reloads
            _wait("SIGHUP did not reload every worker",
                  lambda: len(re.findall(r"event=reloaded manifest=\S+ generation=2 ", log.read_text())) == 2)

            victim = workers[0]
            victim.send_signal(signal.SIGKILL)
            _wait("the killed worker was not restarted",
                  lambda: len(_workers(sc)) == 2 and victim.pid not in {w.pid for w in _workers(sc)})
            sc.wait_ready()
            workers = _workers(sc)
            seen |= {w.pid for w in workers}
            for _ in range(CLIENTS):  # the new worker copied the registrations: shm infers work on it too
                client.infer(sc.grpc_url, 1)
            assert _requests(_private_port(workers[0])) > 0
            merged = _get(f"http://127.0.0.1:{sc.metrics_port}/metrics")
            assert _metric(merged, "poolpipe_sidecar_requests_total") == sent + CLIENTS  # the dead one's kept
        finally:
            code = sc.stop()
            for close in cleanup:
                close()
    assert code == 0
    text = log.read_text()
    assert len(re.findall(r"event=worker_exited worker=0 pid=\d+ status=-9", text)) == 1
    assert "event=worker_restarted worker=0" in text
    assert not [p for p in seen if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    left = [f.name for f in SHM_DIR.glob(PREFIX + "*") if int(f.name[len(PREFIX):].split("_")[0]) in seen]
    assert not left, left


def _fronts(workers: list[psutil.Process], port: int) -> list[psutil.Process]:
    """Each worker's native front end: its tritonserver listening on ``port``."""
    found = []
    for w in workers:
        for c in w.children():
            try:
                if "tritonserver" in c.name() and port in {x.laddr.port for x in c.net_connections("tcp")
                                                           if x.status == psutil.CONN_LISTEN}:
                    found.append(c)
            except psutil.Error:
                continue
    return found


def _native_infers(url: str, clients: int, n: int, meta: Any) -> None:
    """``n`` requests on each of ``clients`` new connections, each answered with the model's output."""
    shape = [1, *[int(d) for d in meta.inputs[0].shape[1:]]]
    for _ in range(clients):
        c = grpcclient.InferenceServerClient(url, channel_args=[("grpc.use_local_subchannel_pool", 1)])
        inp = grpcclient.InferInput(meta.inputs[0].name, shape, "FP32")
        inp.set_data_from_numpy(np.ones(shape, np.float32))
        for _ in range(n):
            assert c.infer(EMULATED_MODEL, [inp], client_timeout=30).as_numpy(meta.outputs[0].name) is not None
        c.close()


@pytest.mark.skipif(native_front.library() is None, reason="no C compiler here")
def test_two_workers_each_serve_through_their_own_native_front_end_on_one_port(tmp_path: Path) -> None:
    """serve --workers 2 --native-grpc-port: each worker runs a front-end tritonserver on the same gRPC port
    (Triton's --reuse-grpc-port), both serve, a SIGKILLed worker's front end goes with it and the restarted
    worker's comes back, and after stop no front end, work directory or shm region is left."""
    deploy = build_emulated_deployment(tmp_path, slo_us=3_000_000.0, gpus=2, addresses=("127.0.0.1", "127.0.0.1"))
    log = tmp_path / "sidecar.log"
    port = free_port()
    sc = SidecarProcess(manifest=deploy, log_path=log, extra_args=("--workers", "2", "--native-grpc-port", str(port)))
    url = f"127.0.0.1:{port}"
    seen: set[int] = set()
    with Deployment(deploy, check_hardware=False, log_dir=tmp_path / "logs"):
        try:
            sc.start().wait_ready()
            workers = _workers(sc)
            _wait("two front ends did not listen on the native port", lambda: len(_fronts(_workers(sc), port)) == 2)
            fronts = _fronts(workers, port)
            seen |= {p.pid for p in workers + fronts}
            meta = grpcclient.InferenceServerClient(url).get_model_metadata(EMULATED_MODEL)
            _native_infers(url, CLIENTS, 2, meta)
            per_worker = [_requests(_private_port(w)) for w in workers]
            assert all(n > 0 for n in per_worker) and sum(per_worker) == 2 * CLIENTS, per_worker

            victim, its_front = workers[0], fronts[0]
            victim.send_signal(signal.SIGKILL)
            _wait("the killed worker's front end outlived it", lambda: not its_front.is_running()
                  or its_front.status() == psutil.STATUS_ZOMBIE)
            _wait("the restarted worker's front end did not come back", lambda: len(_workers(sc)) == 2
                  and victim.pid not in {w.pid for w in _workers(sc)} and len(_fronts(_workers(sc), port)) == 2)
            sc.wait_ready()
            workers = _workers(sc)
            seen |= {p.pid for p in workers + _fronts(workers, port)}
            _native_infers(url, CLIENTS, 1, meta)
            assert _requests(_private_port(workers[0])) > 0  # the new worker serves through its front end
        finally:
            code = sc.stop()
    assert code == 0
    assert not [p for p in seen if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not [d for d in Path("/tmp").glob(DIR_PREFIX + "*") if int(d.name[len(DIR_PREFIX):].split("-")[0]) in seen]
    left = [f.name for f in SHM_DIR.glob(PREFIX + "*") if int(f.name[len(PREFIX):].split("_")[0]) in seen]
    assert not left, left


def test_combinations_that_cannot_work_are_refused(tmp_path: Path) -> None:
    deploy = build_emulated_deployment(tmp_path)  # one GPU per pool: one worker's share at most
    ports = ("--grpc-port", "1", "--http-port", "2", "--metrics-port", "3")
    r = run_cli("serve", "--manifest", deploy, "--workers", "2", *ports)
    assert r.returncode == 2 and "supports at most 1 worker" in r.stderr and r.stderr.count("\n") == 1
    r = run_cli("serve", "--manifest", deploy, "--workers", "2", "--shard", "0/2", *ports)
    assert r.returncode == 2 and "--workers and --shard do not combine" in r.stderr
    r = run_cli("serve", "--manifest", deploy, "--workers", "2", "--replan", tmp_path / "x.yaml", *ports)
    assert r.returncode == 2 and "--workers and --replan do not combine" in r.stderr
    r = run_cli("serve", "--passthrough", "127.0.0.1:1", "--workers", "2", *ports)
    assert r.returncode == 2 and "--workers needs --manifest" in r.stderr
    r = run_cli("serve", "--manifest", deploy, "--workers", "0")
    assert r.returncode == 2 and "expected a number of worker processes >= 1" in r.stderr


def test_a_worker_that_fails_its_first_start_stops_serve_with_one_line(tmp_path: Path) -> None:
    deploy = build_emulated_deployment(tmp_path, gpus=2)
    free = SidecarProcess()  # three distinct free ports
    r = run_cli("serve", "--manifest", deploy, "--workers", "2", "--batch-log", tmp_path / "missing" / "b.jsonl",
                "--grpc-port", free.grpc_port, "--http-port", free.http_port, "--metrics-port", free.metrics_port,
                timeout=120)
    assert r.returncode == 2
    assert re.search(r"poolpipe serve: error: sidecar worker \d exited with status 2 before it was ready",
                     r.stderr.splitlines()[-1])


@pytest.mark.skipif(netbed.unavailable() is not None or shutil.which("unshare") is None,
                    reason=f"no private network namespace here: {netbed.unavailable() or 'unshare is missing'}")
def test_off_loopback_the_plaintext_warning_is_said_once(tmp_path: Path) -> None:
    """serve --workers 2 bound off loopback without TLS: one event=plaintext_off_loopback line, the parent's (before,
    one per worker). Served in a network namespace of its own, whose only interface is its loopback, so 0.0.0.0
    opens nothing on this machine's network (the servers are out of its reach: the workers start unready)."""
    deploy = build_emulated_deployment(tmp_path, gpus=2)
    log = tmp_path / "serve.log"
    serve = (f"ip link set lo up && exec {sys.executable} -m poolpipe serve --manifest {deploy} --workers 2 "
             "--bind 0.0.0.0 --grpc-port 8001 --http-port 8000 --metrics-port 8002")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with open(log, "wb") as out:
        p = subprocess.Popen(["unshare", "--net", "--", "sh", "-c", serve], stdout=out, stderr=subprocess.STDOUT,
                             env=env)
    try:
        _wait("both workers listen", lambda: log.read_text().count("event=listening") == 2)
    finally:
        p.send_signal(signal.SIGTERM)
        assert p.wait(60) == 0
    lines = [x for x in log.read_text().splitlines() if "event=plaintext_off_loopback" in x]
    assert len(lines) == 1 and "[worker" not in lines[0] and "ports=grpc,http" in lines[0], lines  # the parent's
