"""``poolpipe launch`` migrates a running deployment under load: generated with ``--previous``, the next plan keeps
the servers both plans have (same ports; its partitions loaded into them through Triton's model control), starts
the servers only it has, and once the sidecar has reloaded, unloads the old partitions and stops the servers only the
old plan had. A 1-GPU-per-class plan grows to 2 GPUs per class (SIGHUP to launch and to the sidecar) and shrinks
back (SIGHUP to launch, POST to the sidecar), while client threads send: nothing is lost or hung, and no process,
port or shared-memory region of a removed server is left."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import tritonclient.http as httpclient

from model_repository_gen.manifest import Manifest, load_manifest
from poolpipe_common.errors import InputError
from poolpipe_common.net import port_in_use
from runtime.launch_files import ServerLaunch
from runtime.migration import migration_steps
from runtime.sidecar_process import SidecarProcess
from runtime.testbed import EMULATED_MODEL, build_emulated_deployment
from tests.test_replan_live import Load, _post_reload, _wait_log

pytestmark = pytest.mark.triton


def _stages(m: Manifest) -> dict[str, list[str]]:
    """vGPU id -> partition models on it."""
    out: dict[str, list[str]] = {}
    for p in m.model(EMULATED_MODEL).pipelines:
        for s in p.stages:
            for v in s.vgpus:
                out.setdefault(v, []).append(s.triton_model)
    return out


def _ready(http_url: str, model: str) -> bool:
    c = httpclient.InferenceServerClient(http_url)
    try:
        return bool(c.is_model_ready(model))
    finally:
        c.close()


def _repoint(link: Path, target: Path) -> None:
    tmp = link.with_name(link.name + ".new")
    tmp.symlink_to(target, target_is_directory=True)
    os.replace(tmp, link)


def test_generate_previous_keeps_shared_vgpus_ports_and_renames_partitions(tmp_path: Path) -> None:
    a = load_manifest(build_emulated_deployment(tmp_path / "a", gpus=1, addresses=("127.0.0.1", "127.0.0.1")))
    b = load_manifest(build_emulated_deployment(tmp_path / "b", gpus=2, addresses=("127.0.0.1", "127.0.0.1"),
                                                previous=tmp_path / "a" / "deploy"))
    assert (a.generation, b.generation) == (0, 1)
    old = {g.id: g for g in a.vgpus}
    kept = [g for g in b.vgpus if g.id in old]
    assert len(kept) == 2 and all(g.grpc_url == old[g.id].grpc_url and g.http_url == old[g.id].http_url
                                  for g in kept), "vGPUs both plans have keep their ports"
    a_ports = {port for g in a.vgpus for port in g.ports}
    added = [g for g in b.vgpus if g.id not in old]
    assert len(added) == 2 and not a_ports & {port for g in added for port in g.ports}
    assert all(name.endswith("_g1") for names in _stages(b).values() for name in names)
    assert not any(name.endswith("_g1") for names in _stages(a).values() for name in names)


def _launch(directory: Path) -> list[ServerLaunch]:
    from runtime.launch_files import load_host_launch

    m = load_manifest(directory)
    return [s for h in m.hosts for s in load_host_launch(m.root, h.name).servers]


def test_migration_steps_refuse_what_cannot_run_side_by_side(tmp_path: Path) -> None:
    a = build_emulated_deployment(tmp_path / "a", gpus=1, addresses=("127.0.0.1", "127.0.0.1"))
    b = build_emulated_deployment(tmp_path / "b", gpus=2, addresses=("127.0.0.1", "127.0.0.1"), previous=a)
    steps = migration_steps(_launch(a), _launch(b))
    assert (len(steps.keep), len(steps.add), len(steps.remove)) == (2, 2, 0)
    assert len(steps.load) == 2 and len(steps.unload) == 2
    c = build_emulated_deployment(tmp_path / "c", gpus=1, addresses=("127.0.0.1", "127.0.0.1"), previous=b)
    steps = migration_steps(_launch(b), _launch(c))
    assert (len(steps.keep), len(steps.add), len(steps.remove)) == (2, 0, 2)
    # a deployment generated without --previous whose servers land on the running ones' ports but on another
    # device: they cannot start beside the old ones
    again = build_emulated_deployment(tmp_path / "again", gpus=1, addresses=("127.0.0.1", "127.0.0.1"))
    same_ports = [ServerLaunch(s.vgpu, s.host, s.address, s.repository, o.http_port, o.grpc_port, o.metrics_port,
                               {"CUDA_VISIBLE_DEVICES": "1"}, s.models)
                  for s, o in zip(_launch(again), _launch(a), strict=True)]
    with pytest.raises(InputError, match="--previous"):
        migration_steps(_launch(a), same_ports)  # same ports, another device: cannot start beside the old


def _wait_out(path: Path, needle: str, timeout_s: float = 120.0, after: int = 0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = path.read_text()
        hit = text.find(needle, after)
        if hit >= 0:
            return text[hit:].splitlines()[0]
        time.sleep(0.1)
    raise AssertionError(f"no {needle!r} in the launch output:\n{path.read_text()[-3000:]}")


def test_a_sidecar_named_to_launch_before_its_servers_run_picks_none_of_their_ports(tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The test below names the sidecar's URL to launch before launch starts the servers: had the sidecar picked a
    server's port (free until launch binds it), it would start on other ports and launch would wait on the old URL
    (it did once in CI: the T4 server's HTTP port 23029 was the sidecar's metrics port)."""
    deploy = build_emulated_deployment(tmp_path / "a", gpus=1)
    m = load_manifest(deploy)
    server_ports = {port for g in m.vgpus for port in g.ports}
    seen: list[set[int]] = []

    def free_ports(n: int, taken: set[int], host: str = "127.0.0.1") -> list[int]:
        seen.append(set(taken))
        return [40_001 + i for i in range(n)]

    monkeypatch.setattr("poolpipe_common.net.free_ports", free_ports)
    sc = SidecarProcess(manifest=deploy)
    # each server's three ports are its own on its address; two hosts at two addresses may share a number
    assert seen and server_ports <= seen[0] and len({(g.host, p) for g in m.vgpus for p in g.ports}) == 3 * len(m.vgpus)
    assert {sc.grpc_port, sc.http_port, sc.metrics_port}.isdisjoint(server_ports)


def test_launch_grows_and_shrinks_a_running_deployment_under_load(tmp_path: Path) -> None:
    dir_a = build_emulated_deployment(tmp_path / "a", gpus=1)
    current = tmp_path / "current"
    current.symlink_to(dir_a, target_is_directory=True)
    sc = SidecarProcess(manifest=current, log_path=tmp_path / "sidecar.log")
    out = tmp_path / "launch.out"
    with open(out, "wb") as f:
        launch = subprocess.Popen([sys.executable, "-m", "poolpipe", "launch", str(current), "--no-hardware-check",
                                   "--sidecar", sc.http_url], stdout=f, stderr=subprocess.STDOUT)
    try:
        _wait_out(out, "ready:")
        sc.start()
        a = load_manifest(dir_a)
        with Load(sc.grpc_url) as load:
            load.wait_ok_since(0.0)
            # grow: 1 -> 2 GPUs per class; the GPU-0 servers are kept
            dir_b = build_emulated_deployment(tmp_path / "b", gpus=2, previous=dir_a)
            b = load_manifest(dir_b)
            _repoint(current, dir_b)
            launch.send_signal(signal.SIGHUP)
            line = _wait_out(out, "migrating to")
            print("launch (emulated):", line)
            assert "2 server(s) kept (2 model(s) to load, 2 to unload), 2 to start, 0 to stop" in line
            kept = [g for g in b.vgpus if g.id in {x.id for x in a.vgpus}]
            for g in kept:  # old and new partitions side by side on the kept servers
                assert all(_ready(g.http_url, m) for m in _stages(a)[g.id] + _stages(b)[g.id])
            t_grow = time.monotonic()
            sc.proc.send_signal(signal.SIGHUP)
            line = _wait_out(out, "migrated to")
            print("launch (emulated):", line)
            assert "started 2, kept 2 (loaded 2 model(s), unloaded 2), stopped 0" in line
            assert "generation=1" in _wait_log(tmp_path / "sidecar.log", "event=reloaded")
            for g in kept:
                assert not any(_ready(g.http_url, m) for m in _stages(a)[g.id]), "old partitions unloaded"
                assert all(_ready(g.http_url, m) for m in _stages(b)[g.id])
            load.wait_ok_since(t_grow)
            # shrink: back to 1 GPU per class; the GPU-1 servers go
            dir_c = build_emulated_deployment(tmp_path / "c", gpus=1, previous=dir_b)
            _repoint(current, dir_c)
            start = len(out.read_text())
            launch.send_signal(signal.SIGHUP)
            print("launch (emulated):", _wait_out(out, "migrating to", after=start))
            status, report = _post_reload(sc, {})
            assert status == 200, report
            print("sidecar reload (emulated):", json.dumps(report))
            line = _wait_out(out, "migrated to", after=start)
            print("launch (emulated):", line)
            assert "started 0, kept 2 (loaded 2 model(s), unloaded 2), stopped 2" in line
            removed = [g for g in b.vgpus if g.id not in {x.id for x in a.vgpus}]
            assert not any(port_in_use(g.ports[1], "127.0.0.1") for g in removed), "removed servers gone"
            with urllib.request.urlopen(f"http://{sc.http_url}/v2/poolpipe/plan", timeout=5) as r:
                assert json.loads(r.read())["directory"] == str(dir_c.resolve())
            load.wait_ok_since(time.monotonic())
        outcomes = load.outcomes
        hung = [d for _, kind, d in outcomes if kind == "hung"]
        errors = [d for _, kind, d in outcomes if kind == "error"]
        print(f"requests: {len(outcomes)}, answered {len(outcomes) - len(errors) - len(hung)}, "
              f"explicit errors {len(errors)}, hung {len(hung)}")
        assert not hung and not errors, (hung + errors)[:3]
    finally:
        sc.stop()
        launch.send_signal(signal.SIGTERM)
        assert launch.wait(60) == 0, out.read_text()[-2000:]
    assert "stopped 2 tritonserver(s)" in out.read_text()
    assert list(Path("/dev/shm").glob(f"poolpipe_pb_{launch.pid}_*")) == [], "no shm region of launch's servers left"
