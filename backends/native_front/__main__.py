"""``python -m backends.native_front``: build the native front end now (``make venv``/``make test`` run it).
Exits 0 either way: without a compiler, ``serve --native-grpc-port`` says it cannot be used (one line says why)."""

import logging
import sys

from backends.native_front import library

logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
path = library()
if path is not None:
    print(f"native front end: {path}")
