"""Triton's per-model metric families (``nv_inference_*``) for the planned models, in Prometheus text format.

The names, help texts, labels (model, version; reason for failures) and units are Triton's, so its dashboards,
alerts and autoscaling rules (e.g. on ``nv_inference_queue_duration_us``) read the sidecar unchanged. They are
written here rather than with prometheus_client, which would rename every counter to ``<name>_total``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from scheduler.server.common.latency_summary import summary_exposition
from scheduler.server.common.model_stats import FAILURE_REASONS, ModelStats

VERSION = "1"

# name, type, Triton's help text, value (counters in Triton's units: counts, microseconds)
_PER_MODEL: tuple[tuple[str, str, str, Callable[[ModelStats], float]], ...] = (
    ("nv_inference_request_success", "counter", "Number of successful inference requests, all batch sizes",
     lambda s: s.success.count),
    ("nv_inference_count", "counter", "Number of inferences performed (does not include cached requests)",
     lambda s: s.inferences),
    ("nv_inference_exec_count", "counter", "Number of model executions performed (does not include cached requests)",
     lambda s: s.executions),
    ("nv_inference_request_duration_us", "counter",
     "Cumulative inference request duration in microseconds (includes cached requests)",
     lambda s: s.success.ns // 1000),
    ("nv_inference_queue_duration_us", "counter",
     "Cumulative inference queuing duration in microseconds (includes cached requests)", lambda s: s.queue.ns // 1000),
    ("nv_inference_compute_input_duration_us", "counter",
     "Cumulative compute input duration in microseconds (does not include cached requests)",
     lambda s: s.compute_input.ns // 1000),
    ("nv_inference_compute_infer_duration_us", "counter",
     "Cumulative compute inference duration in microseconds (does not include cached requests)",
     lambda s: s.compute_infer.ns // 1000),
    ("nv_inference_compute_output_duration_us", "counter",
     "Cumulative inference compute output duration in microseconds (does not include cached requests)",
     lambda s: s.compute_output.ns // 1000),
)
NAMES = ("nv_inference_request_success", "nv_inference_request_failure", "nv_inference_count",
         "nv_inference_exec_count", "nv_inference_request_duration_us", "nv_inference_queue_duration_us",
         "nv_inference_compute_input_duration_us", "nv_inference_compute_infer_duration_us",
         "nv_inference_compute_output_duration_us", "nv_inference_pending_request_count")


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _line(name: str, labels: Mapping[str, str], value: float) -> str:
    inner = ",".join(f'{k}="{_label(v)}"' for k, v in labels.items())
    return f"{name}{{{inner}}} {int(value)}\n"


def triton_exposition(stats: Mapping[str, ModelStats], pending: Mapping[str, int]) -> bytes:
    """Every family for every model in ``stats``; ``pending``: requests waiting in the scheduler, by model."""
    out: list[str] = []

    def family(name: str, kind: str, doc: str) -> None:
        out.append(f"# HELP {name} {doc}\n# TYPE {name} {kind}\n")

    family(*_PER_MODEL[0][:3])
    for model, s in stats.items():
        out.append(_line(_PER_MODEL[0][0], {"model": model, "version": VERSION}, _PER_MODEL[0][3](s)))
    family("nv_inference_request_failure", "counter", "Number of failed inference requests, all batch sizes")
    for model, s in stats.items():
        for reason in FAILURE_REASONS:
            out.append(_line("nv_inference_request_failure", {"model": model, "reason": reason, "version": VERSION},
                             s.failures[reason]))
    for name, kind, doc, value in _PER_MODEL[1:]:
        family(name, kind, doc)
        for model, s in stats.items():
            out.append(_line(name, {"model": model, "version": VERSION}, value(s)))
    family("nv_inference_pending_request_count", "gauge",
           "Instantaneous number of pending requests awaiting execution per-model.")
    for model in stats:
        out.append(_line("nv_inference_pending_request_count", {"model": model, "version": VERSION},
                         pending.get(model, 0)))
    out.append(summary_exposition({model: s.summaries for model, s in stats.items()}))  # "" unless turned on
    return "".join(out).encode()
