"""``python -m backends.native [--require]``: build the native emulated backend now (``make venv``/``make test`` run
it). Exits 1 when the sources do not compile; without a C compiler it exits 0 (one line says so: emulated partitions
run the Python backend), unless ``--require`` (CI)."""

import sys

from backends.native import build_main, library

sys.exit(build_main("backends.native", library, sys.argv[1:]))
