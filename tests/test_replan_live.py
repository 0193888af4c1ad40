"""Live plan swap under load: a sidecar in front of two emulated deployments (A: two machines, the hop over gRPC;
B: one machine, the hop through the sidecar's shared-memory pool) swaps A -> B on SIGHUP (the manifest path it
was started with now points at B) and B -> A on POST /v2/poolpipe/reload, while client threads keep sending.
Every request is answered or gets an explicit error (none hangs), both plans serve, the pause is measured and
printed, B's shared-memory regions are gone after the swap back, a reload onto the same servers flushes their
batches first, and B's servers can stop with nothing lost. Each plan serves with the deadlines' reserve it was made
with (B's plan records its own)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from plans.plan_costs import with_assumed_costs
from poolpipe_common.overheads import DEFAULT_FRONT_US, DEFAULT_OVERHEADS
from runtime.launch import Deployment
from runtime.sidecar_process import SidecarProcess
from runtime.testbed import EMULATED_MODEL, build_emulated_deployment
from scheduler.server.planned.shm_pool import PREFIX, SHM_DIR

pytestmark = pytest.mark.triton
CLIENT_TIMEOUT_S = 20.0  # far beyond the 1 s SLO: a request still unanswered then counts as hung
THREADS = 3
B_RESERVE_US = 1234.0  # plan B's costs' front_us (A's plan records none: the default's)


class Load:
    """Client threads sending single-row requests back to back; every outcome is recorded with its time."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.stop = threading.Event()
        self.outcomes: list[tuple[float, str, str]] = []  # (finished at, ok | error | hung, detail)
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(THREADS)]

    def __enter__(self) -> "Load":
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(CLIENT_TIMEOUT_S + 5)

    def _run(self) -> None:
        c = grpcclient.InferenceServerClient(self.url)
        meta = c.get_model_metadata(EMULATED_MODEL)
        shape = [1, *[int(d) for d in meta.inputs[0].shape[1:]]]
        inp = grpcclient.InferInput(meta.inputs[0].name, shape, meta.inputs[0].datatype)
        inp.set_data_from_numpy(np.zeros(shape, np.float32))
        while not self.stop.is_set():
            t0 = time.monotonic()
            try:
                c.infer(EMULATED_MODEL, [inp], client_timeout=CLIENT_TIMEOUT_S)
                out = ("ok", "")
            except InferenceServerException as e:
                hung = time.monotonic() - t0 >= 0.95 * CLIENT_TIMEOUT_S
                out = ("hung" if hung else "error", e.message() or "")
            with self.lock:
                self.outcomes.append((time.monotonic(), *out))
        c.close()

    def ok_since(self, t: float) -> int:
        with self.lock:
            return sum(1 for at, kind, _ in self.outcomes if at > t and kind == "ok")

    def wait_ok_since(self, t: float, n: int = 5, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self.ok_since(t) < n:
            assert time.monotonic() < deadline, f"fewer than {n} answers in {timeout_s:.0f} s since the swap"
            time.sleep(0.05)


def _regions(pid: int, tag: str = "") -> list[str]:
    return sorted(p.name for p in SHM_DIR.glob(f"{PREFIX}{pid}_*") if tag in p.name)


def _post_reload(sc: SidecarProcess, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(f"http://{sc.http_url}/v2/poolpipe/reload", data=json.dumps(body).encode(),
                                 method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=90) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _wait_log(path: Path, needle: str, timeout_s: float = 90.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in path.read_text().splitlines():
            if needle in line:
                return line
        time.sleep(0.1)
    raise AssertionError(f"no {needle!r} in the sidecar log:\n{path.read_text()[-3000:]}")


def _with_reserve(deploy: Path, front_us: float) -> None:
    """The deployment's plan, as if calibrated: its assumed costs keep ``front_us`` before each deadline."""
    path = deploy / "manifest.json"
    doc = json.loads(path.read_text())
    costs = replace(DEFAULT_OVERHEADS, front_us=front_us)
    doc["plan"]["sustained"] = with_assumed_costs(doc["plan"].get("sustained") or {}, costs)
    path.write_text(json.dumps(doc))


def test_plan_swaps_under_load_by_sighup_and_endpoint_lose_nothing(tmp_path: Path) -> None:
    dir_a = build_emulated_deployment(tmp_path / "a")
    current = tmp_path / "current"
    current.symlink_to(dir_a, target_is_directory=True)
    with Deployment(dir_a, check_hardware=False, log_dir=tmp_path / "logs-a"):
        # generated while A runs, so its free ports are not A's; one machine: the hop uses shared memory
        dir_b = build_emulated_deployment(tmp_path / "b", addresses=("127.0.0.1", "127.0.0.1"))
        _with_reserve(dir_b, B_RESERVE_US)
        dep_b = Deployment(dir_b, check_hardware=False, log_dir=tmp_path / "logs-b").start()
        log = tmp_path / "sidecar.log"
        sc = SidecarProcess(manifest=current, log_path=log).start()
        try:
            assert sc.proc is not None
            pid = sc.proc.pid
            c = grpcclient.InferenceServerClient(sc.grpc_url)
            deadline = time.monotonic() + 60
            while not c.is_model_ready(EMULATED_MODEL):
                assert time.monotonic() < deadline, "the sidecar did not turn ready"
                time.sleep(0.05)
            assert _regions(pid) == [], "plan A has no same-machine hop, so no pool"
            with Load(sc.grpc_url) as load:
                load.wait_ok_since(0.0)
                # 1. SIGHUP: the path the sidecar was started with now names plan B
                current.unlink()
                current.symlink_to(dir_b, target_is_directory=True)
                t_hup = time.monotonic()
                sc.proc.send_signal(signal.SIGHUP)
                line = _wait_log(log, "event=reloaded")
                print("SIGHUP reload (emulated):", line.split("poolpipe.sidecar.reload: ")[-1])
                assert "generation=1" in line and f"front_us={B_RESERVE_US:g}" in line, "B's own reserve"
                load.wait_ok_since(t_hup)
                pool_b = _regions(pid, "_g1_")
                assert pool_b, "plan B's hop goes through a shared-memory pool of its own"

                # 2. the endpoint: bad input is refused and changes nothing; then back to plan A
                status, err = _post_reload(sc, {"manifest": str(tmp_path / "missing")})
                assert status == 400 and "cannot reload" in err["error"], err
                status, err = _post_reload(sc, {"manifest": 5})
                assert status == 400 and "manifest" in err["error"], err
                t_post = time.monotonic()
                status, report = _post_reload(sc, {"manifest": str(dir_a)})
                assert status == 200, report
                print("endpoint reload (emulated):", json.dumps(report))
                assert report["generation"] == 2 and report["pause_ms"] >= 0
                assert report["front_us"] == DEFAULT_FRONT_US, "back to A's reserve"
                b_urls = {f"{s.address}:{s.grpc_port}" for s in dep_b.server_launches}
                assert set(report["servers_removed"]) == b_urls
                assert report["shm_regions_removed"] == len(pool_b)
                assert [r for r in pool_b if (SHM_DIR / r).exists()] == [], "plan B's regions are gone"
                load.wait_ok_since(t_post)
                # 3. the same plan again (no body: the last manifest): every server is shared, so the switch waits
                #    for the old plan's batches on them (the flush is inside the pause)
                t_same = time.monotonic()
                status, report = _post_reload(sc, {})
                assert status == 200, report
                print("endpoint reload, same servers (emulated):", json.dumps(report))
                assert report["generation"] == 3 and report["servers_added"] == report["servers_removed"] == []
                assert report["pause_ms"] >= 0 and report["manifest"] == str(dir_a)
                load.wait_ok_since(t_same)
                # 4. the old plan's servers can go: nothing depends on them any more
                dep_b.stop()
                t_stop = time.monotonic()
                load.wait_ok_since(t_stop)
            outcomes = load.outcomes
            hung = [d for _, kind, d in outcomes if kind == "hung"]
            errors = [d for _, kind, d in outcomes if kind == "error"]
            print(f"requests: {len(outcomes)}, answered {len(outcomes) - len(errors) - len(hung)}, "
                  f"explicit errors {len(errors)}, hung {len(hung)}")
            assert not hung, f"{len(hung)} request(s) got no answer: {hung[:3]}"
            assert all(e.strip() for e in errors), "every error says what happened"
            assert "event=reload_failed" in log.read_text()  # the bad requests above, logged
            assert sc.proc.poll() is None, "the sidecar kept running"
        finally:
            dep_b.stop()
            code = sc.stop()
        assert code == 0
        assert _regions(pid) == [], "no shared-memory region of the sidecar is left"
        assert not os.path.exists(f"/proc/{pid}"), "the sidecar process is gone"
