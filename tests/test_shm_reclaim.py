"""Any successor cleans up: a tritonserver started on the ports of a SIGKILLed one whose starter died too removes the
Python backend's shared-memory regions its predecessor left (``poolpipe_pb_<pid>_<port>_...``), in one log line,
whether the dead starter was reaped or is still a zombie (which ``kill(pid, 0)`` finds); a ``launch`` counts a
SIGKILLed, unreaped predecessor as dead and reclaims it."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from poolpipe_common.net import free_port
from runtime.supervise import exited, reclaim_predecessors
from runtime.tritonserver import SHM_PREFIX, TritonProcess
from tests.conftest import ROOT

pytestmark = pytest.mark.triton

STARTER = """
import sys, time
from pathlib import Path
from runtime.tritonserver import TritonProcess
srv = TritonProcess(Path(sys.argv[1]), *map(int, sys.argv[2:5])).start(120)
print(srv.proc.pid, flush=True)
time.sleep(3600)
"""


def _wait(cond, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"not within {timeout_s} s: {what}"
        time.sleep(0.05)


def _sigkill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@pytest.mark.parametrize("reaped", [True, False], ids=["starter-reaped", "starter-zombie"])
def test_a_server_on_a_killed_servers_port_removes_its_regions(tmp_path: Path, reaped: bool,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "tests" / "models" / "simple", repo / "simple")
    ports = [free_port() for _ in range(3)]
    starter = subprocess.Popen([sys.executable, "-c", STARTER, str(repo), *map(str, ports)], stdout=subprocess.PIPE,
                               text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    server = 0
    try:
        assert starter.stdout is not None
        server = int(starter.stdout.readline())
        left = sorted(p.name for p in Path("/dev/shm").glob(f"{SHM_PREFIX}{starter.pid}_{ports[1]}_*"))
        assert left, "the server made no region: the test proves nothing"
        _sigkill_group(server)  # the server and its Python backend stubs
        starter.kill()
        if reaped:
            starter.wait(30)
        _wait(lambda: exited(server) and exited(starter.pid), 30, "the killed server and its starter exited")
        assert all((Path("/dev/shm") / n).exists() for n in left)  # nobody cleaned up so far
        with caplog.at_level(logging.INFO, logger="poolpipe.runtime"), TritonProcess(repo, *ports).start(120):
            assert not [n for n in left if (Path("/dev/shm") / n).exists()]
        lines = [r.getMessage() for r in caplog.records if "event=reclaimed" in r.getMessage()]
        assert lines == [f"event=reclaimed shm_regions={len(left)} port={ports[1]} predecessors={starter.pid}"], lines
    finally:
        if server:
            _sigkill_group(server)
        starter.kill()
        starter.wait(30)
        for p in Path("/dev/shm").glob(f"{SHM_PREFIX}{starter.pid}_*"):
            p.unlink(missing_ok=True)


def test_launch_reclaims_a_killed_predecessor_nobody_reaped(tmp_path: Path) -> None:
    """A SIGKILLed ``launch`` whose parent has not waited for it is a zombie: its state file and regions are a dead
    predecessor's (the old check, ``kill(pid, 0)``, took it for alive and left both)."""
    dead = subprocess.Popen(["sleep", "600"])
    region = Path("/dev/shm") / f"{SHM_PREFIX}{dead.pid}_1_leftover"
    try:
        (tmp_path / f"{dead.pid}.json").write_text(json.dumps({"pid": dead.pid, "kind": "launch", "servers": {}}))
        region.write_bytes(b"x")
        dead.kill()
        _wait(lambda: exited(dead.pid), 30, "the killed launch exited")
        got = reclaim_predecessors(state_dir=tmp_path)
        assert got.launches == (dead.pid,) and region.name in got.shm_regions, got
        assert not region.exists() and not (tmp_path / f"{dead.pid}.json").exists()
    finally:
        dead.wait(30)
        region.unlink(missing_ok=True)
