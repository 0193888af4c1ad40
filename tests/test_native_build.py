"""Build failures fail: a compile error in the native backends fails ``python -m backends.native[_front]`` and
``make native`` (so ``make`` and ``make test``), and ``poolpipe generate`` and ``serve`` with one line; only a missing
C compiler is passed over, in one line, and ``--require`` (CI) fails there too. Each case runs on a copy of backends/
in a temporary directory: the tree's own sources are never touched."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from model_repository_gen.generate import generate
from poolpipe_common.net import free_ports
from runtime.launch import Deployment
from scheduler.server.planned.shm_pool import PREFIX as SIDECAR_SHM_PREFIX
from tests.conftest import ROOT, run_cli
from tests.deploy_helpers import write_cluster
from tests.test_emulated import SCALE, emulated_hosts, ppipe_plan

BROKEN = "\nint poolpipe_broken_on_purpose(void) { return }\n"  # a syntax error


def _copy(tmp: Path, break_in: str | None) -> Path:
    """backends/ (and the Makefile) copied under ``tmp``, with a syntax error appended to ``break_in`` (a C source
    relative to the repository root) when given."""
    shutil.copytree(ROOT / "backends", tmp / "backends", ignore=shutil.ignore_patterns("build", "__pycache__"))
    shutil.copy(ROOT / "Makefile", tmp / "Makefile")
    if break_in:
        with open(tmp / break_in, "a") as f:
            f.write(BROKEN)
    return tmp


def _build(tree: Path, package: str, *args: str, cc: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CC")}
    if cc:
        env["CC"] = cc
    return subprocess.run([sys.executable, "-m", package, *args], cwd=tree, capture_output=True, text=True,
                          timeout=300, env=env)


@pytest.mark.parametrize(("package", "source"), [("backends.native", "backends/native/execute.c"),
                                                  ("backends.native_front", "backends/native_front/passthrough.c")])
def test_a_compile_error_fails_the_build(tmp_path: Path, package: str, source: str) -> None:
    tree = _copy(tmp_path, source)
    r = _build(tree, package)
    assert r.returncode == 1, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert lines[-1].startswith(f"{package}: build failed: ") and "error" in lines[-1], r.stderr
    assert not list((tree / Path(source).parent).glob("build/*/*.so"))  # nothing half-built is left to load


def test_make_native_fails_on_a_compile_error(tmp_path: Path) -> None:
    """The Makefile's ``native`` target (which ``make``, ``make demo`` and ``make test`` depend on) stops with an
    error; the environment is this one, marked up to date so that make installs nothing into it."""
    if shutil.which("make") is None:
        pytest.fail("make is missing: the README requires it")
    tree = _copy(tmp_path, "backends/native_front/passthrough.c")
    venv = Path(sys.prefix)
    r = subprocess.run(["make", "-C", str(tree), "native", f"VENV={venv}", "-o", str(venv / ".installed")],
                       capture_output=True, text=True, timeout=600,
                       env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert r.returncode != 0, r.stdout + r.stderr
    assert "backends.native_front: build failed" in r.stderr, r.stderr


def test_only_a_missing_compiler_is_passed_over_and_require_fails_there(tmp_path: Path) -> None:
    tree = _copy(tmp_path, None)
    missing = str(tmp_path / "no-such-cc")
    quiet = _build(tree, "backends.native", cc=missing)
    assert quiet.returncode == 0 and quiet.stdout == "", (quiet.stdout, quiet.stderr)
    assert quiet.stderr.count("\n") == 1 and "native emulated backend not built" in quiet.stderr, quiet.stderr
    required = _build(tree, "backends.native_front", "--require", cc=missing)
    assert required.returncode == 1 and "--require" in required.stderr, required.stderr
    built = _build(tree, "backends.native", "--require")
    assert built.returncode == 0 and built.stdout.startswith("backends.native: "), (built.stdout, built.stderr)


def _broken_tree(tmp: Path) -> Path:
    """backends/ with both native backends broken, to run the commands from: the current directory comes first on
    the path, so they import this backends/ and the rest of poolpipe from the checkout."""
    tree = _copy(tmp / "tree", "backends/native/execute.c")
    with open(tree / "backends/native_front/passthrough.c", "a") as f:
        f.write(BROKEN)
    return tree


def _one_line(stderr: str, command: str, backend: str) -> bool:
    """The last line is the command's error with the compiler's own words (not a warning after them); no
    traceback."""
    last = stderr.strip().splitlines()[-1]
    return "Traceback" not in stderr and "error: expected" in last and \
        last.startswith(f"poolpipe {command}: error: the {backend} backend does not build: ")


def test_generate_says_in_one_line_that_the_native_backend_does_not_build(tmp_path: Path) -> None:
    tree = _broken_tree(tmp_path)
    cluster = write_cluster(tmp_path / "cluster.json", emulated_hosts())
    ppipe_plan().save(tmp_path / "plan.json")
    gen = run_cli("generate", "--plan", tmp_path / "plan.json", "--cluster", cluster, "--out", tmp_path / "out",
                  cwd=tree)
    assert gen.returncode == 1 and gen.stderr.count("\n") == 1, gen.stderr
    assert _one_line(gen.stderr, "generate", "poolpipe_emulated"), gen.stderr


@pytest.mark.triton
def test_serve_says_in_one_line_that_the_native_front_does_not_build_and_leaves_nothing(tmp_path: Path) -> None:
    """``serve --manifest --native-grpc-port`` builds the front end before the plan's shm pool is made: the error
    leaves no region behind (it used to come after the pool, and the regions stayed)."""
    tree = _broken_tree(tmp_path)
    generate(ppipe_plan(), {}, write_cluster(tmp_path / "cluster.json", emulated_hosts()), tmp_path / "deploy",
             emulated_tensor_scale=SCALE)
    grpc, http, metrics, native_grpc = free_ports(4)
    with Deployment(tmp_path / "deploy", check_hardware=False, log_dir=tmp_path / "logs"):
        serve = subprocess.Popen([sys.executable, "-m", "poolpipe", "serve", "--manifest", str(tmp_path / "deploy"),
                                  "--native-grpc-port", str(native_grpc), "--grpc-port", str(grpc), "--http-port",
                                  str(http), "--metrics-port", str(metrics)], cwd=tree, stderr=subprocess.PIPE,
                                 text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        _, stderr = serve.communicate(timeout=300)
        left = sorted(p.name for p in Path("/dev/shm").glob(f"{SIDECAR_SHM_PREFIX}{serve.pid}_*"))
    for name in left:  # (so that a failure here leaves nothing either)
        (Path("/dev/shm") / name).unlink(missing_ok=True)
    assert serve.returncode == 1 and _one_line(stderr, "serve", "poolpipe_front"), stderr
    assert not left, left
