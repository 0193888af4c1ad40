"""Triton's logging extension for the sidecar's own log (``LogSettings``, ``GET/POST /v2/logging``): the settings
tritonserver has, applied to Python's logging of the process (the root logger's level and format)."""

from __future__ import annotations

import logging
from typing import Any

import grpc
from tritonclient.grpc import service_pb2

from scheduler.server.common.errors import ServeError, invalid

_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"  # poolpipe's (poolpipe/cli.py)
_DATEFMT = {"default": None, "ISO8601": "%Y-%m-%dT%H:%M:%S%z"}  # tritonserver's two log formats, by their dates
_KINDS = {"log_file": "string_param", "log_info": "bool_param", "log_warning": "bool_param",
          "log_error": "bool_param", "log_verbose_level": "uint32_param", "log_format": "string_param"}


class LogSettings:
    """The current settings, read back from (and applied to) the root logger."""

    def __init__(self, root: logging.Logger | None = None) -> None:
        self.root = root or logging.getLogger()
        self.format = "default"

    def current(self) -> dict[str, Any]:
        level = self.root.getEffectiveLevel()
        return {"log_file": "", "log_info": level <= logging.INFO, "log_warning": level <= logging.WARNING,
                "log_error": level <= logging.ERROR, "log_verbose_level": 1 if level <= logging.DEBUG else 0,
                "log_format": self.format}

    def update(self, changes: dict[str, Any]) -> None:
        """Apply Triton-named settings; an unknown name, a wrong type or a log file is refused and nothing changes."""
        for k, v in changes.items():
            if k not in _KINDS:
                raise invalid(f"unknown logging setting '{k}'; known: {', '.join(_KINDS)}")
            if k == "log_file" and v:
                raise invalid("log_file cannot be changed through the API (as in tritonserver): redirect the "
                              "sidecar's output instead")
            if k == "log_format" and v not in _DATEFMT:
                raise invalid(f"log_format must be one of {', '.join(_DATEFMT)}, got {v!r}")
        s = {**self.current(), **changes}
        level = (logging.DEBUG if s["log_verbose_level"] else logging.INFO if s["log_info"] else
                 logging.WARNING if s["log_warning"] else logging.ERROR if s["log_error"] else logging.CRITICAL)
        self.root.setLevel(level)
        self.format = s["log_format"]
        for h in self.root.handlers:
            h.setFormatter(logging.Formatter(_FORMAT, _DATEFMT[self.format]))

    def call(self, request: service_pb2.LogSettingsRequest) -> service_pb2.LogSettingsResponse:
        """The gRPC call: apply the request's settings (typed as Triton types them), answer with all of them."""
        changes: dict[str, Any] = {}
        for k, v in request.settings.items():
            kind = v.WhichOneof("parameter_choice")
            if k in _KINDS and kind != _KINDS[k]:
                raise ServeError(grpc.StatusCode.INVALID_ARGUMENT,
                                 f"logging setting '{k}' must be a {_KINDS[k].split('_')[0]}, got {kind}")
            changes[k] = getattr(v, kind) if kind else None
        self.update(changes)
        resp = service_pb2.LogSettingsResponse()
        for k, v in self.current().items():
            setattr(resp.settings[k], _KINDS[k], v)
        return resp
