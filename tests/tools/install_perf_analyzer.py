"""Install NVIDIA's perf_analyzer into a virtualenv from package registries (``make test`` runs this).

The newest ``perf-analyzer`` wheel needs glibc 2.38; the ``tritonclient`` 2.41.1 manylinux wheel ships a binary
that runs on older systems (Debian 12). It links ``libb64.so.0d`` (Debian's libb64-0d; built here from
tests/tools/libb64.c with gcc when the system has none) and ``libcudart.so.12`` (the nvidia-cuda-runtime-cu12
wheel, in the ``test`` extra). Writes ``PREFIX/bin/perf_analyzer``, a wrapper that sets the library path.

    python tests/tools/install_perf_analyzer.py [--prefix .venv]
"""

from __future__ import annotations

import argparse
import ctypes.util
import platform
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

WHEEL = "tritonclient==2.41.1"
MEMBER = "tritonclient-2.41.1.data/data/bin/perf_analyzer"
HERE = Path(__file__).resolve().parent


def cudart_dir() -> Path:
    """The directory of libcudart.so.12 from the nvidia-cuda-runtime-cu12 wheel."""
    try:
        import nvidia.cuda_runtime as cr  # noqa: PLC0415
    except ImportError:
        sys.exit("install_perf_analyzer: the nvidia-cuda-runtime-cu12 wheel is missing: pip install "
                 "nvidia-cuda-runtime-cu12 (it is in poolpipe's [test] extra)")
    lib = Path(next(iter(cr.__path__))) / "lib"
    if not (lib / "libcudart.so.12").exists():
        sys.exit(f"install_perf_analyzer: no libcudart.so.12 in {lib}")
    return lib


def fetch_binary(dest: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                        WHEEL, "-d", tmp], check=True)
        wheel = next(Path(tmp).glob("tritonclient-*.whl"))
        with zipfile.ZipFile(wheel) as z:
            dest.write_bytes(z.read(MEMBER))
    dest.chmod(0o755)


def build_libb64(dest_dir: Path) -> None:
    """libb64.so.0d from this project's source, unless the system has Debian's."""
    if ctypes.util.find_library("b64"):
        return
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-Wall", "-Wl,-soname,libb64.so.0d", "-o",
                    str(dest_dir / "libb64.so.0d"), str(HERE / "libb64.c")], check=True)


def install(prefix: Path) -> Path:
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        sys.exit(f"install_perf_analyzer: the {WHEEL} binary is for Linux x86_64, not "
                 f"{platform.system()} {platform.machine()}")
    home = prefix / "lib" / "perf_analyzer"
    home.mkdir(parents=True, exist_ok=True)
    fetch_binary(home / "perf_analyzer")
    build_libb64(home)
    wrapper = prefix / "bin" / "perf_analyzer"
    wrapper.write_text(f'#!/bin/sh\n# perf_analyzer of {WHEEL} (tests/tools/install_perf_analyzer.py)\n'
                       f'LD_LIBRARY_PATH="{home}:{cudart_dir()}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}" '
                       f'exec "{home}/perf_analyzer" "$@"\n')
    wrapper.chmod(0o755)
    out = subprocess.run([str(wrapper), "--version"], capture_output=True, text=True)
    if "Perf Analyzer Version" not in out.stdout + out.stderr:  # --version exits non-zero
        sys.exit(f"install_perf_analyzer: {wrapper} does not run: {out.stdout}{out.stderr}")
    return wrapper


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prefix", type=Path, default=Path(sys.prefix), help="the virtualenv (default: this one)")
    print(f"perf_analyzer installed: {install(ap.parse_args().prefix.resolve())}")


if __name__ == "__main__":
    main()
