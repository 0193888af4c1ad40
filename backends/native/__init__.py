"""The native emulated-device backend ``poolpipe_emulated``: C sources here, compiled by the C compiler (``$CC``,
default ``cc``) into a Triton backend library that ``poolpipe generate`` copies beside each emulated partition.

The library is built once per source version (``make venv``/``make test`` run ``python -m backends.native``; a
missing one is built on first use) into ``build/<hash>/`` here, or the cache directory when this directory is
read-only. Only where no C compiler can be run does :func:`library` log one line and return None: emulated
partitions then run the Python partition backend (backends/partition/), which emulates the same device at a higher
cost per call. A compiler that rejects the sources is an error (BuildError), never a quiet fallback.
Imports nothing of the project (a backend package).
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import logging
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

BACKEND = "poolpipe_emulated"  # config.pbtxt ``backend:``; Triton loads libtriton_<backend>.so
LIBRARY = f"libtriton_{BACKEND}.so"
HERE = Path(__file__).resolve().parent
SOURCES = tuple(sorted(HERE.glob("*.c")))
HEADERS = tuple(sorted(HERE.glob("*.h")))
CFLAGS = ("-std=gnu11", "-O2", "-Wall", "-fPIC", "-shared", "-fvisibility=hidden")
_log = logging.getLogger("poolpipe.native")


class BuildError(RuntimeError):
    """The native backend could not be compiled here (the message says why)."""


class NoCompiler(BuildError):
    """No C compiler can be run here: the one case where the native parts may be missing."""


@dataclass(frozen=True)
class NativeLibrary:
    """One Triton backend library built from C sources of this project (the emulated device, the sidecar's
    native front end in backends/native_front/)."""

    backend: str  # config.pbtxt ``backend:``
    sources: tuple[Path, ...]
    headers: tuple[Path, ...]  # digested with the sources; their directories are on the include path
    home: Path  # where build/ goes when writable

    @property
    def library(self) -> str:
        return f"libtriton_{self.backend}.so"


EMULATED = NativeLibrary(BACKEND, SOURCES, HEADERS, HERE)


def source_hash(cc: str, lib: NativeLibrary = EMULATED) -> str:
    """A digest of the sources, headers, compiler and flags: a changed source builds a new library."""
    h = hashlib.sha256(" ".join((cc, *CFLAGS)).encode())
    for f in (*lib.sources, *lib.headers):
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def _build_root(lib: NativeLibrary) -> Path:
    """``build/`` beside the sources when writable, else the cache directory runtime/ uses ($POOLPIPE_CACHE)."""
    if os.access(lib.home, os.W_OK):
        return lib.home / "build"
    return (Path(os.environ.get("POOLPIPE_CACHE", Path(tempfile.gettempdir()) / "poolpipe-triton")) / "native"
            / lib.backend)


def build(root: Path | None = None, cc: str | None = None, lib: NativeLibrary = EMULATED) -> Path:
    """The library built from the current sources under ``root`` (compiled now unless already there);
    raises BuildError with the compiler's complaint when it cannot be built."""
    cc = cc or os.environ.get("CC", "cc")
    dest = (root or _build_root(lib)) / source_hash(cc, lib) / lib.library
    if dest.is_file():
        return dest
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BuildError(f"cannot create {dest.parent}: {e.strerror or e}") from None
    tmp = dest.with_name(f".{lib.library}.{os.getpid()}")  # built aside, then renamed: a concurrent build sees none
    includes = [f"-I{d}" for d in sorted({str(h.parent) for h in lib.headers})]
    cmd = [cc, *CFLAGS, *includes, *map(str, lib.sources), "-lm", "-lpthread", "-o", str(tmp)]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except OSError as e:
        _discard(tmp)
        raise NoCompiler(f"cannot run the C compiler {cc!r}: {e}") from None
    except subprocess.TimeoutExpired:
        _discard(tmp)
        raise BuildError(f"{cc} did not finish within 120 s") from None
    if r.returncode != 0:
        _discard(tmp)
        raise BuildError(f"the {lib.backend} backend does not build: {cc} failed (exit {r.returncode}): "
                         f"{complaint(r.stderr)}")
    os.replace(tmp, dest)
    return dest


def complaint(stderr: str, most: int = 3) -> str:
    """The compiler's complaint on one line: its first ``most`` error lines (a warning after them says less), or
    its last lines where none says error (a linker's, a crashed compiler's)."""
    lines = [ln.strip() for ln in stderr.strip().splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error" in ln.lower()]
    return " | ".join(errors[:most] or lines[-most:])


def _discard(tmp: Path) -> None:
    """Remove a failed build's output and its directory when nothing else is in it."""
    tmp.unlink(missing_ok=True)
    try:
        tmp.parent.rmdir()
    except OSError:
        pass  # another build's files are there


@functools.cache
def library() -> Path | None:
    """The built library, or None (after one log line saying why) where no C compiler can be run; raises
    BuildError where the sources do not compile."""
    try:
        return build()
    except NoCompiler as e:
        _log.warning("native emulated backend not built (%s); emulated partitions use the Python backend", e)
        return None


def build_main(what: str, library_fn: Callable[[], Path | None], argv: list[str]) -> int:
    """``python -m backends.native[_front] [--require]``: build now and say where. 1 when the sources do not
    compile; without a compiler 0 (the log line says so) unless ``--require`` (CI: the native parts are required)."""
    parser = argparse.ArgumentParser(prog=f"python -m {what}")
    parser.add_argument("--require", action="store_true", help="fail where no C compiler can be run too")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        path = library_fn()
    except BuildError as e:
        print(f"{what}: build failed: {e}", file=sys.stderr)
        return 1
    if path is None:
        if args.require:
            print(f"{what}: not built, and --require says it must be", file=sys.stderr)
        return 1 if args.require else 0
    print(f"{what}: {path}")
    return 0
