"""The sidecar's native front end ``poolpipe_front``: a Triton backend (C sources here, built like
backends/native/) that hands each request tritonserver received to the sidecar's scheduler over a Unix socket
and answers it when the sidecar does (``serve --native-grpc-port``; scheduler/server/front/native_front.py), or, for
the pass-through Triton's models (``serve --passthrough-http``), forwards it there over HTTP itself.

Where no C compiler can be run, :func:`library` logs one line and returns None, and serve says the flag cannot be
used; sources that do not compile raise native.BuildError.
Imports nothing of the project but the native build (a backend package).
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path

from backends import native

HERE = Path(__file__).resolve().parent
# json_min: pass-through models (upstream_http.c) read their config and the pass-through Triton's answers
FRONT = native.NativeLibrary("poolpipe_front", (*sorted(HERE.glob("*.c")), native.HERE / "json_min.c"),
                             (*sorted(HERE.glob("*.h")), native.HERE / "triton_c.h", native.HERE / "json_min.h"), HERE)
BACKEND = FRONT.backend
LIBRARY = FRONT.library
SOCKET_ENV = "POOLPIPE_FRONT_SOCKET"  # frames.h: where the backend connects
UPSTREAM_PARAMETER = "poolpipe_upstream"  # upstream_http.h: a pass-through model's HOST:PORT (Triton's HTTP)
_log = logging.getLogger("poolpipe.native")


@functools.cache
def library() -> Path | None:
    """The built library, or None (after one log line saying why) where no C compiler can be run; raises
    native.BuildError where the sources do not compile."""
    try:
        return native.build(lib=FRONT)
    except native.NoCompiler as e:
        _log.warning("native front end not built (%s)", e)
        return None
