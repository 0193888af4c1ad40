"""What a client's request carries besides the message: its gRPC metadata or HTTP headers, kept for the request's
task (a context variable the front end sets, read where the request is forwarded or traced) so that the
pass-through Triton receives them (hop-by-hop ones dropped), a W3C ``traceparent`` continues in the sidecar's spans,
and headers matching Triton's ``--grpc-header-forward-pattern`` / ``--http-header-forward-pattern`` become request
parameters of a planned model. The headers are read only when one of these asks (a getter is kept, not a copy)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from contextvars import ContextVar
from dataclasses import dataclass

Pairs = Iterable[tuple[str, "str | bytes"]]

# connection-level headers (RFC 9110 7.6.1) and what the sidecar's own transport sets again on its call upstream
NOT_FORWARDED = frozenset({
    "connection", "keep-alive", "proxy-connection", "proxy-authenticate", "proxy-authorization", "te", "trailer",
    "transfer-encoding", "upgrade", "host", "content-length", "content-type", "content-encoding", "accept-encoding",
    "expect", "user-agent", "inference-header-content-length"})


@dataclass(frozen=True)
class Incoming:
    """One request's headers (a getter: gRPC's ``context.invocation_metadata``, aiohttp's ``headers.items``) and
    the forward pattern of the port it came to (None: none)."""

    headers: Callable[[], Pairs]
    pattern: re.Pattern | None = None


_incoming: ContextVar[Incoming | None] = ContextVar("poolpipe_incoming", default=None)


def set_incoming(headers: Callable[[], Pairs], pattern: re.Pattern | None = None) -> None:
    """The front end, in the request's own task: what the request came with."""
    _incoming.set(Incoming(headers, pattern))


def _pairs() -> list[tuple[str, str | bytes]]:
    incoming = _incoming.get()
    return [] if incoming is None else [(k.lower(), v) for k, v in (incoming.headers() or ())]


def forwardable(key: str, value: str | bytes) -> bool:
    """A header the next hop may receive as gRPC metadata: not hop-by-hop or transport-set, not gRPC's own, and a
    value gRPC can carry (printable ASCII, or bytes under a ``-bin`` key)."""
    if key in NOT_FORWARDED or key.startswith((":", "grpc-")) or not re.fullmatch(r"[0-9a-z_.-]+", key):
        return False
    if key.endswith("-bin"):
        return True
    return isinstance(value, str) and value.isascii() and value.isprintable()


def forwarded_metadata() -> tuple[tuple[str, str | bytes], ...] | None:
    """The current request's headers for its call to the pass-through Triton (None: none to send)."""
    kept = tuple((k, v) for k, v in _pairs() if forwardable(k, v))
    return kept or None


def traceparent() -> str | None:
    """The current request's W3C ``traceparent`` (None: none)."""
    return next((v for k, v in _pairs() if k == "traceparent" and isinstance(v, str)), None)


def header_parameters() -> dict[str, str]:
    """The current request's headers that match its port's forward pattern (Triton's
    ``--grpc-header-forward-pattern``, matched anywhere in the lower-cased name as RE2::PartialMatch does): each
    becomes a string request parameter of the same name."""
    incoming = _incoming.get()
    if incoming is None or incoming.pattern is None:
        return {}
    return {k: v for k, v in _pairs() if isinstance(v, str) and incoming.pattern.search(k)}
