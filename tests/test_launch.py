"""Launching a generated deployment: real tritonservers, pipelines through Triton, clean stop, bad inputs."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from model_repository_gen.cluster_file import cluster_from_dict
from model_repository_gen.generate import generate
from poolpipe_common.errors import InputError
from poolpipe_common.net import port_in_use
from profiling.zoo import build_zoo_model
from runtime.launch import Deployment
from runtime.supervise import exited
from runtime.tritonserver import SHM_PREFIX, pid_alive, remove_shm_regions
from tests.conftest import ROOT, run_cli
from tests.deploy_helpers import (
    make_plan,
    make_profile,
    reference_output,
    run_pipeline_through_triton,
)
from tests.test_generate import PIPELINES, cpu_hosts

pytestmark = pytest.mark.triton


@pytest.fixture(scope="module")
def deployment_dir(tmp_path_factory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("launch")
    onnx_path = build_zoo_model("resnet", d / "resnet.onnx")
    prof = make_profile(onnx_path, "resnet", 3, {"L4": (1, 2), "T4": (1,)})
    generate(make_plan(prof, PIPELINES), {"resnet": onnx_path}, cluster_from_dict({"hosts": cpu_hosts()}), d / "out")
    return d / "out", onnx_path


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _shm(prefix: str) -> list[str]:
    return [p.name for p in Path("/dev/shm").glob(prefix + "*")]


def test_deployment_serves_pipelines_that_equal_the_full_model_and_stops_cleanly(deployment_dir):
    import tritonclient.grpc as grpcclient

    out, onnx_path = deployment_dir
    ready = []
    x = np.random.default_rng(3).standard_normal((2, 3, 112, 112)).astype(np.float32)
    expected = reference_output(onnx_path, x)
    with Deployment(out, on_ready=lambda vid, n, total: ready.append((vid, n, total))) as dep:
        assert sorted(r[0] for r in ready) == sorted(g.id for g in dep.manifest.vgpus) and ready[-1][1:] == (4, 4)
        pgids = [srv.proc.pid for srv in dep.servers.values()]
        prefixes = [srv.shm_prefix for srv in dep.servers.values()]
        assert any(_shm(p) for p in prefixes)  # the Python backend's regions exist while serving
        for m in dep.manifest.models:
            for p in m.pipelines:
                for s in p.stages:
                    for vid in s.vgpus:
                        with grpcclient.InferenceServerClient(dep.manifest.vgpu(vid).grpc_url) as c:
                            assert c.is_model_ready(s.triton_model), (vid, s.triton_model)
        for pid in ("resnet/0", "resnet/1"):
            for choice in (0, 1):  # both vGPUs of the pooled L4 stage
                y, stamps = run_pipeline_through_triton(dep.manifest, pid, x, choice)
                np.testing.assert_allclose(y, expected, atol=1e-5, rtol=0)
                assert all(a <= b for a, b in stamps) and all(stamps[i][1] <= stamps[i + 1][0]
                                                              for i in range(len(stamps) - 1))
    assert not dep.servers
    assert not any(_group_alive(g) for g in pgids)
    assert not any(_shm(p) for p in prefixes)


def test_launch_cli_starts_prints_endpoints_and_stops_on_sigint(deployment_dir):
    out, _ = deployment_dir
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "poolpipe", "launch", str(out), "--host", "t4box"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    try:
        lines = []
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if line.startswith("ready:"):
                break
        assert lines and lines[-1].startswith("ready: 1 tritonserver(s)"), (lines, proc.poll())
        assert lines[0].startswith("t4box-gpu0-s0: grpc 127.0.0.1:") and "resnet_b0_1" in lines[0]
        grpc_port = int(lines[0].split("grpc 127.0.0.1:")[1].split()[0])
        with socket.create_connection(("127.0.0.1", grpc_port), timeout=2):
            pass
        prefix = f"{SHM_PREFIX}{proc.pid}_{grpc_port}_"
        assert _shm(prefix)
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(60)
        stderr = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert rc == 0, stderr
    assert "stopped 1 tritonserver(s)" in stderr and "Traceback" not in stderr
    assert not _shm(prefix)
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", grpc_port), timeout=2).close()


def test_launch_refuses_a_port_in_use_and_an_unknown_host(deployment_dir):
    out, _ = deployment_dir
    dep = Deployment(out, ["t4box"])
    s = dep.server_launches[0]
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", s.grpc_port))
        blocker.listen()
        with pytest.raises(InputError, match=f"vGPU t4box-gpu0-s0: port {s.grpc_port} on 127.0.0.1 is already in use"):
            dep.start()
        assert not dep.servers
        r = run_cli("launch", out, "--host", "t4box")
        assert r.returncode == 2 and "already in use" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = run_cli("launch", out, "--host", "nosuch")
    assert r.returncode == 2 and "--host nosuch: not a host with servers" in r.stderr
    r = run_cli("launch", out.parent / "missing")
    assert r.returncode == 2 and "cannot read manifest" in r.stderr


STOPPED_BY_KILL = """
import sys, time
from pathlib import Path
from ensembles.triton_baseline import start_baseline, write_whole_model
from runtime.sidecar_process import SidecarProcess
from runtime.testbed import write_trivial_onnx
work = Path(sys.argv[1])
write_whole_model(work / "repo", write_trivial_onnx(work / "t.onnx"), "trivial", 8)
with start_baseline(work / "repo", log_path=work / "triton.log") as triton, \\
        SidecarProcess(passthrough=triton.grpc_url, log_path=work / "sidecar.log") as sidecar:
    print(triton.proc.pid, sidecar.proc.pid, triton.shm_prefix, flush=True)
    time.sleep(600)
"""


def test_a_program_stopped_with_sigterm_stops_the_servers_it_started(tmp_path):
    """A benchmark or script killed with ``kill`` (SIGTERM) leaves no tritonserver, sidecar or shm region behind:
    the servers lead sessions of their own, so only the program's own ``with`` blocks can stop them."""
    prog = subprocess.Popen([sys.executable, "-c", STOPPED_BY_KILL, str(tmp_path)], stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    triton_pid = sidecar_pid = 0
    prefix = None
    try:
        line = prog.stdout.readline().split()
        triton_pid, sidecar_pid, prefix = int(line[0]), int(line[1]), line[2]
        assert pid_alive(triton_pid) and pid_alive(sidecar_pid)
        prog.send_signal(signal.SIGTERM)
        assert prog.wait(timeout=90) == 128 + signal.SIGTERM
        left = [pid for pid in (triton_pid, sidecar_pid) if pid_alive(pid)]
        assert not left, f"still running after the program stopped: {left}"
        assert not list(Path("/dev/shm").glob(prefix + "*"))
    finally:  # what a failure left, stopped here
        if prog.poll() is None:
            prog.kill()
        for pid, stop in ((triton_pid, os.killpg), (sidecar_pid, os.kill)):
            if pid and pid_alive(pid):
                stop(pid, signal.SIGKILL)
        if prefix:
            remove_shm_regions(prefix)


def test_a_server_counts_as_stopped_once_it_has_exited_not_while_it_exits() -> None:
    """Reclaiming a dead launch's servers waits for ``exited`` (gone or a zombie, its sockets closed), not for its
    name to vanish from /proc (that happens while it still exits with its ports bound)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert not exited(proc.pid)
        os.kill(proc.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while not exited(proc.pid) and time.monotonic() < deadline:  # a zombie until reaped below
            time.sleep(0.01)
        assert exited(proc.pid) and pid_alive(proc.pid)
    finally:
        proc.kill()
        proc.wait()
    assert exited(proc.pid)


ZOMBIE_LEADER = """
import ctypes, socket, threading, time
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen()
print(s.getsockname()[1], flush=True)
threading.Thread(target=time.sleep, args=(60,)).start()
ctypes.CDLL(None).pthread_exit(None)  # the main thread ends; the process lives on in the other thread
"""


def test_a_server_whose_main_thread_is_a_zombie_has_not_exited_while_another_thread_holds_its_ports() -> None:
    """A multi-threaded server's main thread can be a zombie while its other threads still exit with the process's
    files open (the cause of a flaky 'port ... already in use' right after a reclaim): ``exited`` waits for every
    thread."""
    proc = subprocess.Popen([sys.executable, "-c", ZOMBIE_LEADER], stdout=subprocess.PIPE, text=True)
    try:
        port = int(proc.stdout.readline())
        deadline = time.monotonic() + 10
        while _leader_state(proc.pid) != "Z" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _leader_state(proc.pid) == "Z"
        assert port_in_use(port) and not exited(proc.pid)
    finally:
        proc.kill()
        proc.wait()
    assert exited(proc.pid) and not port_in_use(port)


def _leader_state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
