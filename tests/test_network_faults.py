"""Network faults between hosts, live: an emulated three-stage pipeline (T4 -> L4 -> L4) with each host's
tritonservers in a network namespace of its own (runtime.netbed) and the sidecar with its client in a third. While
the T4 host's link is cut every request is answered with an explicit error within its deadline plus a bound, none
hangs; the sidecar takes the host's vGPU out of service (a vgpu_down line, poolpipe_sidecar_vgpu_up 0) and, once
the link heals, back (vgpu_up) and serves again within a bound; 100 ms of delay each way only slows requests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from model_repository_gen.generate import generate
from runtime.netbed import LinkState, NetBed, unavailable
from tests.conftest import ROOT
from tests.deploy_helpers import write_cluster
from tests.test_emulated import SCALE, emulated_hosts, ppipe_plan

WHY = unavailable()
pytestmark = [pytest.mark.triton, pytest.mark.skipif(WHY is not None, reason=f"no network test bed: {WHY}")]
SLO_S = 0.4  # ppipe_plan's SLO
ANSWER_BOUND_S = 2.0  # beyond the deadline: a stage call's timeout is the deadline plus a second
REJOIN_BOUND_S = 30.0  # health checks find the healed host, calibrate it and plan on it again

# Runs in the sidecar's namespace: the sidecar, then one line per command on stdin ("N": N requests one after
# another, answered with their outcomes and seconds; "metrics": the sidecar's vgpu_up samples).
CLIENT = """
import json, re, sys, time, urllib.request
import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException
from runtime.sidecar_process import SidecarProcess
from tests.test_emulated import MODEL
sc = SidecarProcess(manifest=sys.argv[1], log_path=sys.argv[2]).start()
try:
    sc.wait_ready()
    c = grpcclient.InferenceServerClient(sc.grpc_url)
    meta = c.get_model_metadata(MODEL)
    shape = [1, *[int(d) for d in meta.inputs[0].shape[1:]]]
    x = grpcclient.InferInput(meta.inputs[0].name, shape, meta.inputs[0].datatype)
    x.set_data_from_numpy(np.zeros(shape, np.float32))
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        if line.strip() == "metrics":
            text = urllib.request.urlopen(f"http://127.0.0.1:{sc.metrics_port}/metrics", timeout=5).read().decode()
            up = dict(re.findall(r'^poolpipe_sidecar_vgpu_up\\{vgpu="([^"]+)"\\} (\\S+)$', text, re.M))
            print(json.dumps({k: float(v) for k, v in up.items()}), flush=True)
            continue
        out = []
        for _ in range(int(line)):
            t = time.monotonic()
            try:
                c.infer(MODEL, [x], client_timeout=30)
                out.append(["ok", time.monotonic() - t])
            except InferenceServerException as e:
                out.append([(e.message() or str(e))[:200], time.monotonic() - t])
        print(json.dumps(out), flush=True)
finally:
    sc.stop()
"""


class Client:
    """The CLIENT script in the sidecar's namespace, spoken to over its stdin and stdout."""

    def __init__(self, bed: NetBed, deploy: Path, log: Path) -> None:
        self.proc = subprocess.Popen([*bed.exec_args("sc"), sys.executable, "-c", CLIENT, str(deploy), str(log)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT,
                                     env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert json.loads(self.ask(None)) == {"ready": True}

    def ask(self, command: str | None) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        if command is not None:
            self.proc.stdin.write(command + "\n")
            self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, f"the client exited ({self.proc.wait(30)})"
        return line

    def requests(self, n: int) -> list[tuple[str, float]]:
        return [tuple(r) for r in json.loads(self.ask(str(n)))]

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _launch(bed: NetBed, deploy: Path, host: str, log: Path) -> subprocess.Popen:
    p = subprocess.Popen([*bed.exec_args(host), sys.executable, "-m", "poolpipe", "launch", str(deploy), "--host",
                          host, "--no-hardware-check"], stdout=open(log, "wb"), stderr=subprocess.STDOUT, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    deadline = time.monotonic() + 120
    while "ready:" not in log.read_text(errors="replace"):
        assert p.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
        time.sleep(0.2)
    return p


def test_a_cut_link_is_answered_and_healed_a_delayed_one_only_slows(tmp_path: Path) -> None:
    bed = NetBed(("sc", "t4box", "l4box"))
    launches: list[subprocess.Popen] = []
    client = None
    try:
        bed.start()
        hosts = [{**h, "address": bed.addresses[h["name"]], "base_port": 21000} for h in emulated_hosts()]
        generate(ppipe_plan(), {}, write_cluster(tmp_path / "cluster.json", hosts), tmp_path / "deploy",
                 emulated_tensor_scale=SCALE)
        launches = [_launch(bed, tmp_path / "deploy", h, tmp_path / f"launch-{h}.log") for h in ("t4box", "l4box")]
        client = Client(bed, tmp_path / "deploy", tmp_path / "sidecar.log")
        assert all(r == "ok" for r, _ in client.requests(5))

        bed.set_link("t4box", LinkState(delay_ms=100.0))
        slow = client.requests(3)  # every request crosses the T4 host's link twice: >= 200 ms more
        assert all(r == "ok" and s >= 0.2 for r, s in slow), slow
        bed.set_link("t4box")

        bed.set_link("t4box", LinkState(cut=True))
        cut = client.requests(10)
        assert all(s <= SLO_S + ANSWER_BOUND_S for _, s in cut), cut  # none hangs
        assert all(r != "ok" for r, _ in cut[2:]), cut  # explicit errors once the calls in flight have failed
        up = json.loads(client.ask("metrics"))
        assert [v for k, v in up.items() if k.startswith("t4box")] == [0.0], up

        bed.set_link("t4box")
        healed, served = time.monotonic(), False
        while not served:
            assert time.monotonic() - healed < REJOIN_BOUND_S, "not served again after the link healed"
            served = client.requests(1)[0][0] == "ok"
        print(f"served again {time.monotonic() - healed:.1f} s after the link healed")
        assert all(v == 1.0 for v in json.loads(client.ask("metrics")).values())
        log = (tmp_path / "sidecar.log").read_text()
        assert "event=vgpu_down vgpu=t4box" in log and "event=vgpu_up vgpu=t4box" in log
    finally:
        if client is not None:
            client.close()
        for p in launches:
            p.send_signal(signal.SIGTERM)
        for p in launches:
            assert p.wait(60) == 0
        left = bed.close()
    assert left == []
