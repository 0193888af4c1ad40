"""Errors the sidecar answers with: one gRPC status code and its HTTP equivalent, as Triton maps them."""

from __future__ import annotations

import grpc

# Triton answers most client errors with HTTP 400; shed requests get 503 so load balancers can retry.
_HTTP_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.NOT_FOUND: 400,
    grpc.StatusCode.ALREADY_EXISTS: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.PERMISSION_DENIED: 403,  # a restricted API without its header (tritonserver: 403)
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.INTERNAL: 500,
    grpc.StatusCode.CANCELLED: 499,
}


class ServeError(Exception):
    """A request-level failure with the status code the client sees."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def http_status(self) -> int:
        return _HTTP_STATUS.get(self.code, 400)


def invalid(message: str) -> ServeError:
    return ServeError(grpc.StatusCode.INVALID_ARGUMENT, message)


def shed(model: str, reason: str) -> ServeError:
    """The explicit answer to a request the scheduler dropped (never left to time out)."""
    return ServeError(grpc.StatusCode.UNAVAILABLE,
                      f"request shed to protect the SLO of model '{model}': {reason}")


def from_rpc_error(e: grpc.aio.AioRpcError) -> ServeError:
    return ServeError(e.code(), e.details() or str(e.code()))
