"""Triton's latency summaries (``nv_inference_*_summary_us``) for the planned models, turned on as in tritonserver
with ``--metrics-config summary_latencies=true`` (quantiles: ``summary_quantiles=0.5:0.05,0.9:0.01,...``).

prometheus_client's Summary keeps only a count and a sum, so the quantiles are computed here: exactly, over the
successful requests of the last MAX_AGE_S seconds (Triton's prometheus-cpp summaries slide a window of the same
length, estimating within each quantile's error, which an exact quantile meets), at most MAX_SAMPLES of them.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from prometheus_client.utils import floatToGoString

from poolpipe_common.errors import InputError

MAX_AGE_S = 60.0  # Triton's (prometheus-cpp's default max_age)
MAX_SAMPLES = 100_000  # per model and duration: a bound on memory at high rates (the newest are kept)
DEFAULT_QUANTILES = ((0.5, 0.05), (0.9, 0.01), (0.95, 0.001), (0.99, 0.001))  # Triton's default
# (family, Triton's help text); the order of LatencySummaries.observe's arguments
FAMILIES = (
    ("nv_inference_request_summary_us", "Summary of inference request duration in microseconds (includes cached "
                                        "requests)"),
    ("nv_inference_queue_summary_us", "Summary of inference queuing duration in microseconds (includes cached "
                                      "requests)"),
    ("nv_inference_compute_input_summary_us", "Summary of compute input duration in microseconds (does not include "
                                              "cached requests)"),
    ("nv_inference_compute_infer_summary_us", "Summary of compute infer duration in microseconds (does not include "
                                              "cached requests)"),
    ("nv_inference_compute_output_summary_us", "Summary of compute output duration in microseconds (does not "
                                               "include cached requests)"),
)


@dataclass(frozen=True)
class SummarySettings:
    enabled: bool = False
    quantiles: tuple[tuple[float, float], ...] = DEFAULT_QUANTILES  # (quantile, Triton's allowed error)


SETTINGS = [SummarySettings()]  # the process's, set once at start (configure); a list so that tests can swap it


def configure(settings: SummarySettings) -> None:
    SETTINGS[0] = settings


def parse_metrics_config(specs: list[str]) -> SummarySettings:
    """tritonserver's ``--metrics-config`` SETTING=VALUE (repeatable): summary_latencies, summary_quantiles."""
    enabled, quantiles = False, DEFAULT_QUANTILES
    for spec in specs:
        key, sep, value = spec.partition("=")
        if not sep:
            raise InputError(f"--metrics-config {spec!r}: expected SETTING=VALUE (e.g. summary_latencies=true)")
        if key == "summary_latencies":
            if value.lower() not in ("true", "false", "1", "0", "on", "off"):
                raise InputError(f"--metrics-config summary_latencies={value}: expected true or false")
            enabled = value.lower() in ("true", "1", "on")
        elif key == "summary_quantiles":
            quantiles = _quantiles(value)
        else:
            raise InputError(f"--metrics-config {key}: not a setting the sidecar has (summary_latencies, "
                             "summary_quantiles)")
    return SummarySettings(enabled, quantiles)


def _quantiles(value: str) -> tuple[tuple[float, float], ...]:
    out = []
    for item in value.split(","):
        q, _, err = item.partition(":")
        try:
            pair = (float(q), float(err))
        except ValueError:
            raise InputError(f"--metrics-config summary_quantiles={value}: expected QUANTILE:ERROR pairs like "
                             "0.5:0.05,0.99:0.001") from None
        if not (0 <= pair[0] <= 1 and 0 <= pair[1] <= 1):
            raise InputError(f"--metrics-config summary_quantiles: {item} is not within 0..1")
        out.append(pair)
    return tuple(out)


@dataclass
class _Window:
    samples: deque = field(default_factory=lambda: deque(maxlen=MAX_SAMPLES))  # (monotonic s, µs)
    count: int = 0
    sum_us: float = 0.0

    def observe(self, value_us: float, now_s: float) -> None:
        self.samples.append((now_s, value_us))
        self.count += 1
        self.sum_us += value_us

    def quantiles(self, qs: list[float], now_s: float) -> list[float]:
        while self.samples and self.samples[0][0] < now_s - MAX_AGE_S:
            self.samples.popleft()
        if not self.samples:
            return [float("nan")] * len(qs)  # as prometheus-cpp reports a quantile of no observation
        return [float(v) for v in np.quantile(np.fromiter((v for _, v in self.samples), float), qs)]


@dataclass
class LatencySummaries:
    """One model's five summaries (FAMILIES' order)."""

    windows: tuple[_Window, ...] = field(default_factory=lambda: tuple(_Window() for _ in FAMILIES))

    def observe(self, *durations_us: float) -> None:
        now = time.monotonic()
        for w, d in zip(self.windows, durations_us):
            w.observe(d, now)


def _labels(model: str, extra: str = "") -> str:
    name = model.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    return f'{{model="{name}",version="1"{extra}}}'


def summary_exposition(summaries: Mapping[str, Any]) -> str:
    """The five summary families for every model (``summaries``: model -> LatencySummaries), or "" when off."""
    settings = SETTINGS[0]
    if not settings.enabled:
        return ""
    qs = [q for q, _ in settings.quantiles]
    now, out = time.monotonic(), []
    for k, (name, doc) in enumerate(FAMILIES):
        out.append(f"# HELP {name} {doc}\n# TYPE {name} summary\n")
        for model, s in summaries.items():
            w = s.windows[k]
            for q, v in zip(qs, w.quantiles(qs, now)):
                quantile = f',quantile="{floatToGoString(q)}"'
                out.append(f"{name}{_labels(model, quantile)} {floatToGoString(v)}\n")
            out.append(f"{name}_sum{_labels(model)} {floatToGoString(w.sum_us)}\n"
                       f"{name}_count{_labels(model)} {w.count}\n")
    return "".join(out)
