"""``python -m backends.native_front [--require]``: build the native front end now (``make venv``/``make test`` run
it). Exits 1 when the sources do not compile; without a C compiler it exits 0 (one line says so: ``serve
--native-grpc-port`` cannot be used), unless ``--require`` (CI)."""

import sys

from backends.native import build_main
from backends.native_front import library

sys.exit(build_main("backends.native_front", library, sys.argv[1:]))
