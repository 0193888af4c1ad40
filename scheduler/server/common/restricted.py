"""Restricted APIs as tritonserver has them: ``--grpc-restricted-protocol`` / ``--http-restricted-api``, each
``<api>[,<api>]:<key>=<value>`` (repeatable, one key per group): a call of a restricted API must carry the header
``<key>: <value>`` (over gRPC ``triton-grpc-protocol-<key>``, as tritonserver names it), else it is refused
naming the header. The APIs are tritonserver's categories, plus ``poolpipe-admin`` for the sidecar's own
endpoints (``/v2/poolpipe/reload``, ``/v2/poolpipe/plan``), which follow ``model-repository``'s restriction
when not restricted themselves (a reload changes the served models)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import grpc

from poolpipe_common.errors import InputError
from scheduler.server.common.errors import ServeError

CATEGORIES = ("health", "metadata", "inference", "shared-memory", "model-config", "model-repository", "statistics",
              "trace", "logging", "poolpipe-admin")
GRPC_PREFIX = "triton-grpc-protocol-"
GRPC_METHODS = {
    "ServerLive": "health", "ServerReady": "health", "ModelReady": "health",
    "ServerMetadata": "metadata", "ModelMetadata": "metadata",
    "ModelInfer": "inference", "ModelStreamInfer": "inference",
    "ModelConfig": "model-config", "ModelStatistics": "statistics",
    "RepositoryIndex": "model-repository", "RepositoryModelLoad": "model-repository",
    "RepositoryModelUnload": "model-repository",
    "SystemSharedMemoryStatus": "shared-memory", "SystemSharedMemoryRegister": "shared-memory",
    "SystemSharedMemoryUnregister": "shared-memory", "CudaSharedMemoryStatus": "shared-memory",
    "CudaSharedMemoryRegister": "shared-memory", "CudaSharedMemoryUnregister": "shared-memory",
    "TraceSetting": "trace", "LogSettings": "logging"}
_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class Restriction:
    header: str  # as the client sends it (gRPC: with tritonserver's prefix, lowercase)
    value: str


class RestrictedApis:
    """Category -> the header its calls need; empty when the flag was not given (nothing restricted)."""

    def __init__(self, rules: dict[str, Restriction] | None = None) -> None:
        self.rules = dict(rules or {})

    @classmethod
    def parse(cls, specs: Iterable[str], flag: str, grpc_prefix: bool) -> RestrictedApis:
        """Each SPEC ``<api>[,<api>]:<key>=<value>``; a wrong SPEC is an InputError naming the flag."""
        rules: dict[str, Restriction] = {}
        for spec in specs:
            apis, sep, kv = spec.partition(":")
            key, eq, value = kv.partition("=")
            if not sep or not eq or not apis or not _KEY.match(key) or not value:
                raise InputError(f"{flag} {spec!r}: expected <api>[,<api>]:<key>=<value>, e.g. "
                                 f"{flag} model-repository,shared-memory:admin-key=SECRET (APIs: "
                                 f"{', '.join(CATEGORIES)})")
            for api in apis.split(","):
                if api not in CATEGORIES:
                    raise InputError(f"{flag} {spec!r}: unknown API '{api}'; choose from {', '.join(CATEGORIES)}")
                if api in rules:
                    raise InputError(f"{flag}: restricted api '{api}' can not be specified in multiple config groups")
                header = (GRPC_PREFIX + key).lower() if grpc_prefix else key
                rules[api] = Restriction(header, value)
        return cls(rules)

    def rule(self, category: str) -> Restriction | None:
        got = self.rules.get(category)
        if got is None and category == "poolpipe-admin":
            return self.rules.get("model-repository")
        return got

    def check(self, category: str, header: Callable[[str], str | None], grpc_call: bool) -> None:
        """Raise the refusal when ``category`` is restricted and ``header(name)`` is not its value."""
        r = self.rule(category)
        if r is None or header(r.header) == r.value:
            return
        what = "protocol" if grpc_call else "API"
        raise ServeError(grpc.StatusCode.PERMISSION_DENIED, f"This {what} is restricted, expecting header '{r.header}'")


def http_category(path: str) -> str | None:
    """The category of an HTTP route (its aiohttp path pattern); None: not a KServe/poolpipe route."""
    if path.startswith("/v2/health/") or path.endswith("/ready"):
        return "health"
    if path.startswith("/v2/poolpipe/"):
        return "poolpipe-admin"
    if path.startswith(("/v2/systemsharedmemory", "/v2/cudasharedmemory")):
        return "shared-memory"
    if path.startswith("/v2/repository"):
        return "model-repository"
    if path.endswith("/trace/setting"):
        return "trace"
    suffixes = {"/infer": "inference", "/config": "model-config", "/stats": "statistics", "/logging": "logging"}
    for suffix, category in suffixes.items():
        if path.endswith(suffix):
            return category
    if path in ("/v2", "/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
        return "metadata"
    return None
