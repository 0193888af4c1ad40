"""The container recipes in containers/: the sidecar image's Python environment, built the way its Dockerfile
builds it, runs `poolpipe serve`; the Triton image installs everything the partition backend imports; the
`generate --k8s` defaults are the recipes' tags."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10 (requires-python allows it): pytest depends on tomli there
    import tomli as tomllib

from backends.partition import BACKEND_FILES  # what generate copies beside every partition
from model_repository_gen import k8s
from tests.conftest import ROOT

CONTAINERS = ROOT / "containers"
PROVIDED_BY_TRITON = {"triton_python_backend_utils"}
DISTRIBUTIONS = {"onnxruntime": "onnxruntime-gpu", "pynvml": "nvidia-ml-py"}  # module -> the requirement providing it


def test_sidecar_environment_builds_as_its_recipe_and_serves(tmp_path: Path) -> None:
    """containers/sidecar/build-env.sh, as the Dockerfile runs it: a virtualenv with poolpipe's wheel built from
    this checkout. Its dependencies come from this test environment (PYTHONPATH, --no-deps) rather than PyPI,
    so the test takes seconds; the wheel, its packages, data and entry point are the image's."""
    assert "sh containers/sidecar/build-env.sh /opt/poolpipe" in (CONTAINERS / "sidecar" / "Dockerfile").read_text()
    prefix = tmp_path / "env"
    deps = os.pathsep.join(dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib")))
    env = {**os.environ, "PYTHONPATH": deps, "PYTHON": sys.executable}
    r = subprocess.run(["sh", str(CONTAINERS / "sidecar" / "build-env.sh"), str(prefix), "--no-deps"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "environment ready" in r.stdout, r.stdout + r.stderr
    r = subprocess.run([str(prefix / "bin" / "poolpipe"), "serve", "--help"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "--http-restricted-api" in r.stdout and "--manifest" in r.stdout, r.stderr
    r = subprocess.run([str(prefix / "bin" / "python"), "-c", "import poolpipe, scheduler.server.app as a; "
                        "print(poolpipe.__file__); print(a.__file__)"], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and all(line.startswith(str(prefix)) for line in r.stdout.split()), r.stdout + r.stderr


def _third_party_imports(path: Path) -> set[str]:
    local = {p.stem for p in BACKEND_FILES}
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n not in local | PROVIDED_BY_TRITON
            and n != "__future__"}


def _requirements(name: str) -> set[str]:
    lines = (CONTAINERS / "triton" / name).read_text().splitlines()
    return {line.split(">")[0].split("=")[0].split("<")[0].strip() for line in lines
            if line.strip() and not line.startswith("#")}


def test_triton_image_installs_what_the_partition_backend_imports() -> None:
    base, engines = _requirements("requirements.txt"), _requirements("requirements-engines.txt")
    imported = set().union(*(_third_party_imports(p) for p in BACKEND_FILES))
    assert {"numpy", "onnxruntime", "onnx"} <= imported
    wanted = {DISTRIBUTIONS.get(m, m) for m in imported}
    assert wanted <= base | engines, f"not installed by containers/triton: {sorted(wanted - base - engines)}"
    assert {"numpy", "onnx", "onnxruntime-gpu"} <= base  # the ONNX Runtime engine and the emulated device
    dockerfile = (CONTAINERS / "triton" / "Dockerfile").read_text()
    assert "FROM ${TRITON_IMAGE}" in dockerfile and "nvcr.io/nvidia/tritonserver:" in dockerfile


def test_generate_k8s_defaults_are_the_recipes_tags() -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert k8s.DEFAULT_SIDECAR_IMAGE == f"poolpipe:{version}"
    assert k8s.DEFAULT_TRITON_IMAGE == f"poolpipe-triton:{version}"
    assert f"-t {k8s.DEFAULT_SIDECAR_IMAGE} ." in (CONTAINERS / "sidecar" / "Dockerfile").read_text()
    assert f"-t {k8s.DEFAULT_TRITON_IMAGE} ." in (CONTAINERS / "triton" / "Dockerfile").read_text()
