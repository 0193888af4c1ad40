"""``serve --trace-config`` (tritonserver's syntax) and the trace extension's settings (global and per model):
which requests are traced, sampled as Triton samples them.

Global settings: ``level=TIMESTAMPS|OFF`` (default OFF: nothing is traced), ``rate=N`` (one request in N; default
1000), ``count=N`` (traces left; -1, the default: no limit), ``mode=opentelemetry`` (the only mode: spans go out
over OTLP/HTTP). OpenTelemetry settings, ``opentelemetry,<setting>=<value>``: ``url`` (default
http://localhost:4318/v1/traces), ``resource=KEY=VALUE`` (repeatable), ``bsp_max_queue_size``,
``bsp_schedule_delay`` (ms), ``bsp_max_export_batch_size``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from poolpipe_common.errors import InputError

LEVELS = ("OFF", "TIMESTAMPS")
DEFAULT_URL = "http://localhost:4318/v1/traces"
BSP = {"bsp_max_queue_size": 2048, "bsp_schedule_delay": 5000, "bsp_max_export_batch_size": 512}
SETTING_NAMES = ("trace_level", "trace_rate", "trace_count", "trace_mode")


@dataclass(frozen=True)
class Sampling:
    """What the trace extension sets: level, rate (one in N) and count (traces left, -1: no limit)."""

    level: str = "OFF"
    rate: int = 1000
    count: int = -1

    def settings(self) -> dict[str, list[str]]:
        """In the trace extension's form: every value a list of strings."""
        return {"trace_level": [self.level], "trace_rate": [str(self.rate)], "trace_count": [str(self.count)],
                "trace_mode": ["opentelemetry"]}


@dataclass(frozen=True)
class TraceConfig:
    """Everything ``--trace-config`` says."""

    sampling: Sampling = Sampling()
    url: str = DEFAULT_URL
    resource: dict[str, str] = field(default_factory=lambda: {"service.name": "poolpipe-sidecar"})
    bsp: dict[str, int] = field(default_factory=lambda: dict(BSP))


def _level(value: str, where: str) -> str:
    v = value.upper()
    if v == "TENSORS":
        raise InputError(f"{where}: the TENSORS level is not supported in opentelemetry mode (as in tritonserver): "
                         "use TIMESTAMPS")
    if v not in LEVELS:
        raise InputError(f"{where}: level {value!r} is not one of {', '.join(LEVELS)}")
    return v


def _int(value: str, where: str, lo: int) -> int:
    try:
        n = int(value)
    except ValueError:
        raise InputError(f"{where}: expected an integer, got {value!r}") from None
    if n < lo:
        raise InputError(f"{where}: must be >= {lo}, got {n}")
    return n


def parse_trace_config(specs: list[str]) -> TraceConfig:
    """``--trace-config`` values, as tritonserver takes them: ``SETTING=VALUE`` or ``MODE,SETTING=VALUE``."""
    cfg = TraceConfig()
    s = cfg.sampling
    for spec in specs:
        where = f"--trace-config {spec}"
        mode, sep, rest = spec.partition(",")
        if not sep:
            mode, rest = "", spec
        key, eq, value = rest.partition("=")
        if not eq or not key:
            raise InputError(f"{where}: expected SETTING=VALUE or MODE,SETTING=VALUE (e.g. rate=100, "
                             "opentelemetry,url=http://collector:4318/v1/traces)")
        if mode == "triton" or (not mode and key == "mode" and value == "triton"):
            raise InputError(f"{where}: the sidecar exports traces over OpenTelemetry only (Triton's JSON trace "
                             "file is not written): use --trace-config mode=opentelemetry")
        if mode == "":
            s = _global(s, key, value, where)
        elif mode == "opentelemetry":
            cfg = _otel(cfg, key, value, where)
        else:
            raise InputError(f"{where}: unknown trace mode {mode!r} (opentelemetry)")
    return replace(cfg, sampling=s)


def _global(s: Sampling, key: str, value: str, where: str) -> Sampling:
    if key == "level":
        return replace(s, level=_level(value, where))
    if key == "rate":
        return replace(s, rate=_int(value, where, 0))
    if key == "count":
        return replace(s, count=_int(value, where, -1))
    if key == "mode":
        if value != "opentelemetry":
            raise InputError(f"{where}: unknown trace mode {value!r} (opentelemetry)")
        return s
    raise InputError(f"{where}: unknown setting {key!r} (level, rate, count, mode, or opentelemetry,<setting>)")


def _otel(cfg: TraceConfig, key: str, value: str, where: str) -> TraceConfig:
    if key == "url":
        url = value if "://" in value else f"http://{value}"
        return replace(cfg, url=url)
    if key == "resource":
        k, eq, v = value.partition("=")
        if not eq or not k:
            raise InputError(f"{where}: expected resource=KEY=VALUE (e.g. resource=service.name=sidecar-a)")
        return replace(cfg, resource={**cfg.resource, k: v})
    if key in BSP:
        return replace(cfg, bsp={**cfg.bsp, key: _int(value, where, 1)})
    raise InputError(f"{where}: unknown opentelemetry setting {key!r} (url, resource, {', '.join(BSP)})")


class TraceSettings:
    """The settings in force, globally and per model, updated through the trace extension; ``sample`` decides
    whether a request is traced (every ``rate``-th request of its settings while ``count`` lasts)."""

    def __init__(self, sampling: Sampling) -> None:
        self.default = sampling  # what --trace-config set: a cleared global setting returns to it
        self.global_ = sampling
        self.models: dict[str, Sampling] = {}
        self._seen: dict[str, int] = {}  # requests counted towards the rate, per settings owner ("" = global)
        self.on = sampling.level != "OFF"  # any tracing at all: the request path checks only this

    def of(self, model: str) -> Sampling:
        return self.models.get(model, self.global_)

    def sample(self, model: str) -> bool:
        owner = model if model in self.models else ""
        s = self.of(model)
        if s.level == "OFF" or s.rate == 0 or s.count == 0:
            return False
        n = self._seen.get(owner, 0) + 1
        self._seen[owner] = n
        if n % s.rate:
            return False
        if s.count > 0:
            self._set(owner, replace(s, count=s.count - 1))
        return True

    def update(self, model: str, body: dict[str, list[str] | None]) -> dict[str, list[str]]:
        """Apply a trace-extension update (a setting given as None is cleared); returns the settings in force.
        A model named with no settings drops its own and follows the global ones again, as in Triton."""
        if model and not body:
            self.models.pop(model, None)
        base = self.of(model) if model else self.global_
        fallback = self.global_ if model else self.default
        new = base
        for key, values in body.items():
            if key not in SETTING_NAMES:
                raise InputError(f"unknown trace setting '{key}' (settable: trace_level, trace_rate, trace_count)")
            if key == "trace_mode":
                if values and values != ["opentelemetry"]:
                    raise InputError("trace_mode cannot be changed while serving (the sidecar's mode is "
                                     "opentelemetry)")
                continue
            new = _apply(new, fallback, key, values)
        if body:
            self._set(model, new)
        self.on = any(s.level != "OFF" for s in (self.global_, *self.models.values()))
        return self.of(model).settings()

    def _set(self, owner: str, s: Sampling) -> None:
        if owner:
            self.models[owner] = s
        else:
            self.global_ = s


def _apply(s: Sampling, fallback: Sampling, key: str, values: list[str] | None) -> Sampling:
    name = key.removeprefix("trace_")
    if not values:
        return replace(s, **{name: getattr(fallback, name)})
    if key == "trace_level":
        levels = [_level(v, "trace_level") for v in values]
        return replace(s, level="OFF" if levels == ["OFF"] or not levels else "TIMESTAMPS")
    if len(values) != 1:
        raise InputError(f"{key} takes one value, got {values}")
    return replace(s, **{name: _int(values[0], key, 0 if key == "trace_rate" else -1)})


def settings_from_request(settings: Any) -> dict[str, list[str] | None]:
    """A TraceSettingRequest's settings map: a setting with no values is cleared (None)."""
    return {k: (list(v.value) or None) for k, v in settings.items()}
