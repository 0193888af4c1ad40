"""``python -m backends.native``: build the native emulated backend now (``make venv``/``make test`` run it).
Exits 0 either way: without a compiler, emulated partitions run the Python backend (one line says so)."""

import logging
import sys

from backends.native import library

logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
path = library()
if path is not None:
    print(f"native emulated backend: {path}")
