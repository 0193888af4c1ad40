"""``launch --sidecar`` against a sidecar whose admin endpoints are restricted (``serve --http-restricted-api``,
tritonserver's syntax): with ``--sidecar-restricted-key KEY=VALUE`` launch sends the key on its calls and sees which
deployment the sidecar serves; without it, or with another key, the refusal is said once and the old servers keep
running (before, launch sent no key, was refused without a word, and a migration never finished)."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console

from poolpipe.cli import build_parser
from runtime.launch_cli import Migrator
from runtime.sidecar_process import SidecarProcess
from runtime.sidecar_watch import SidecarRefused, SidecarWatch, sidecar_watch
from runtime.testbed import build_emulated_deployment
from tests.conftest import run_cli
from tests.test_launch_migration import _repoint, _wait_out

RESTRICTION = ("--http-restricted-api", "poolpipe-admin:admin-key=SECRET")


def _watch(*flags: str) -> SidecarWatch | None:
    """What ``poolpipe launch DIR FLAGS`` watches the sidecar with."""
    a = build_parser().parse_args(["launch", "deploy", *flags])
    return sidecar_watch(a.sidecar, a.sidecar_use_ssl, a.sidecar_root_cert, a.sidecar_client_cert,
                         a.sidecar_client_key, a.sidecar_restricted_key)


@pytest.fixture(scope="module")
def restricted(tmp_path_factory: pytest.TempPathFactory):
    """A sidecar (its servers need not run: only its admin endpoint is asked) restricting poolpipe-admin."""
    work = tmp_path_factory.mktemp("restricted")
    deploy = build_emulated_deployment(work)
    with SidecarProcess(manifest=deploy, log_path=work / "sidecar.log", extra_args=RESTRICTION) as sc:
        yield sc


@pytest.mark.triton
def test_launch_sends_its_key_to_a_restricted_sidecar(restricted: SidecarProcess) -> None:
    directory = Path(restricted.manifest).resolve()
    watch = _watch("--sidecar", restricted.http_url, "--sidecar-restricted-key", "admin-key=SECRET")
    assert watch is not None and watch.serves(directory)
    assert not watch.serves(directory / "other")
    for flags in ((), ("--sidecar-restricted-key", "admin-key=WRONG"), ("--sidecar-restricted-key", "other=SECRET")):
        with pytest.raises(SidecarRefused, match="HTTP 403 This API is restricted, expecting header 'admin-key'"):
            _watch("--sidecar", restricted.http_url, *flags).serves(directory)


@pytest.mark.triton
def test_a_refused_migration_says_so_once_and_keeps_the_old_servers(restricted: SidecarProcess,
                                                                     capsys: pytest.CaptureFixture) -> None:
    """The refusal is one line, said once however often launch asks; the migration is not finished (its old
    servers keep serving) until the sidecar answers."""
    finished: list[bool] = []
    migration = SimpleNamespace(directory=Path(restricted.manifest).resolve(), finish=lambda: finished.append(True))
    m = Migrator(None, None, Console(stderr=True), _watch("--sidecar", restricted.http_url))  # type: ignore[arg-type]
    m.migration = migration  # type: ignore[assignment]
    for _ in range(3):
        m.poll()
    said = capsys.readouterr().err.strip().splitlines()
    assert len(said) == 1 and "expecting header 'admin-key'" in said[0] and "--sidecar-restricted-key" in said[0]
    assert not finished and m.migration is migration


@pytest.mark.parametrize(("flags", "expected"), [
    (("--sidecar-restricted-key", "admin-key=SECRET"), "need --sidecar HOST:PORT"),
    (("--sidecar", "127.0.0.1:1", "--sidecar-restricted-key", "admin-key"), "expected KEY=VALUE"),
    (("--sidecar", "127.0.0.1:1", "--sidecar-restricted-key", "admin key=x"), "expected KEY=VALUE"),
    (("--sidecar", "127.0.0.1:1", "--sidecar-restricted-key", "admin-key="), "expected KEY=VALUE")])
def test_launch_refuses_a_key_it_cannot_send(tmp_path: Path, flags: tuple[str, ...], expected: str) -> None:
    r = run_cli("launch", str(tmp_path), *flags)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert re.search(expected, r.stderr), r.stderr


@pytest.mark.triton
def test_launch_finishes_a_migration_behind_a_restricted_sidecar(tmp_path: Path) -> None:
    """The whole way: launch --sidecar --sidecar-restricted-key migrates a running deployment to a larger one and
    stops waiting once the restricted sidecar serves it (the old code refused the flag; without the key it waited
    for ever)."""
    dir_a = build_emulated_deployment(tmp_path / "a", gpus=1)
    current = tmp_path / "current"
    current.symlink_to(dir_a, target_is_directory=True)
    sc = SidecarProcess(manifest=current, log_path=tmp_path / "sidecar.log", extra_args=RESTRICTION)
    out = tmp_path / "launch.out"
    with open(out, "wb") as f:
        launch = subprocess.Popen([sys.executable, "-m", "poolpipe", "launch", str(current), "--no-hardware-check",
                                   "--sidecar", sc.http_url, "--sidecar-restricted-key", "admin-key=SECRET"],
                                  stdout=f, stderr=subprocess.STDOUT)
    try:
        _wait_out(out, "ready:")
        sc.start()
        _repoint(current, build_emulated_deployment(tmp_path / "b", gpus=2, previous=dir_a))
        launch.send_signal(signal.SIGHUP)
        _wait_out(out, "migrating to")
        sc.proc.send_signal(signal.SIGHUP)  # the sidecar reloads what current names now
        assert "started 2, kept 2 (loaded 2 model(s), unloaded 2), stopped 0" in _wait_out(out, "migrated to")
        assert "refuses" not in out.read_text()
    finally:
        sc.stop()
        launch.send_signal(signal.SIGTERM)
        assert launch.wait(60) == 0, out.read_text()[-2000:]
