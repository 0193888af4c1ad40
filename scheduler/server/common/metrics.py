"""The sidecar's Prometheus metrics (own registry, served at /metrics on the metrics port)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

_P = "poolpipe_sidecar_"
ATTAINMENT_WINDOW = 1000


@dataclass
class SidecarMetrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.requests = Counter(_P + "requests", "Inference requests received", ["model", "route"], registry=r)
        self.successes = Counter(_P + "successes", "Inference requests answered with outputs", ["model"], registry=r)
        self.failures = Counter(_P + "failures", "Inference requests answered with an error", ["model", "code"],
                                registry=r)
        self.drops = Counter(_P + "drops", "Requests shed by the scheduler", ["model", "reason"], registry=r)
        self.slo_met = Counter(_P + "slo_met", "Planned-model requests answered within their deadline", ["model"],
                               registry=r)
        self.slo_attainment = Gauge(_P + "slo_attainment", f"Fraction of the last {ATTAINMENT_WINDOW} finished "
                                    "planned requests (answered or shed) that met the SLO; lifetime: slo_met / "
                                    "successes + failures", ["model"], registry=r)
        self.queue_length = Gauge(_P + "queue_length", "Requests waiting in the scheduler", ["model"], registry=r)
        self.loop_busy = Gauge(_P + "event_loop_busy", "Fraction of the last 0.1 s the sidecar's event loop was busy "
                               "(not waiting for I/O)", registry=r)
        self.loop_stalls = Counter(_P + "event_loop_stalls", "Passes of the sidecar's event loop that ran 10 ms or "
                                   "longer without waiting for I/O (requests that came in meanwhile waited)",
                                   registry=r)
        self.executor_saturated = Gauge(_P + "executor_saturated", "1 while the sidecar's event loop is saturated "
                                        "(smoothed busy >= 0.9 until <= 0.5): the scheduler holds fuller batches",
                                        registry=r)
        self.batch_size = Histogram(_P + "batch_size", "Dispatched batch sizes", ["model"], registry=r,
                                    buckets=(1, 2, 4, 8, 16, 32, 64))
        self.latency = Histogram(_P + "request_latency_seconds", "End-to-end latency of answered requests",
                                 ["model", "route"], registry=r,
                                 buckets=(.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5))
        self.vgpu_busy = Counter(_P + "vgpu_busy_seconds", "Measured compute time per vGPU", ["vgpu"], registry=r)
        self.vgpu_up = Gauge(_P + "vgpu_up", "1 while the vGPU's Triton server is in service", ["vgpu"], registry=r)
        self.decision = Histogram(_P + "decision_seconds", "Time of one scheduler step", registry=r,
                                  buckets=(1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2))
        self.retries = Counter(_P + "retries", "Batches retried on another path after a server fault", ["model"],
                               registry=r)
        self.policy_failures = Counter(_P + "policy_failures", "Scheduler policy steps that raised (the requests "
                                       "they held were answered with an error)", registry=r)
        self.hops = Counter(_P + "hops", "Boundary tensors handed between stages, by how", ["kind"], registry=r)
        self.reloads = Counter(_P + "reloads", "Plan reloads (SIGHUP, the endpoint, --replan)", ["outcome"],
                               registry=r)
        self.reload_pause = Histogram(_P + "reload_pause_seconds", "Time no batch could be dispatched in a reload",
                                      registry=r, buckets=(1e-4, 1e-3, 1e-2, .1, .25, .5, 1, 2.5))
        self.replans = Counter(_P + "replans", "Automatic re-plans (serve --replan)", ["outcome"], registry=r)
        self.promised = Gauge(_P + "promised_rps", "The serving plan's promise: the req/s it sustains at >= 99 % SLO "
                              "attainment (plan.json sustainable_rps; the closed form's where it records none)",
                              ["model"], registry=r)
        self.sustainable = Gauge(_P + "sustainable_rps", "The req/s the serving plan sustains at >= 99 % SLO "
                                 "attainment at the per-stage costs measured now (the promise moved by the closed "
                                 "form from the costs it assumed; NaN until enough stage calls are measured)",
                                 ["model"], registry=r)
        self.promise_at_risk = Gauge(_P + "promise_at_risk", "1 while the costs measured now imply a sustainable "
                                     "rate below the promise and the served rate approaches it", ["model"],
                                     registry=r)
        for outcome in ("ok", "failed"):
            self.reloads.labels(outcome)
        for outcome in ("replanned", "failed"):
            self.replans.labels(outcome)
        self._window: dict[str, deque[bool]] = {}
        self._met_in_window: dict[str, int] = {}
        self._series: dict[tuple[str, str], RequestSeries] = {}
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}

    def child(self, metric: Any, *labels: str) -> Any:
        """``metric.labels(*labels)``, looked up once: the request path counts per batch and per shed request
        without labels()'s validation, hashing and lock on every call."""
        key = (id(metric), labels)
        got = self._children.get(key)
        if got is None:
            got = self._children[key] = metric.labels(*labels)
        return got

    def series(self, model: str, route: str) -> RequestSeries:
        """The per-request series of (model, route), looked up once (``labels()`` hashes and locks per call)."""
        got = self._series.get((model, route))
        if got is None:
            got = self._series[(model, route)] = RequestSeries(
                self.requests.labels(model, route), self.successes.labels(model), self.latency.labels(model, route),
                self.slo_met.labels(model))
        return got

    def declare(self, models: list[str], vgpus: list[str]) -> None:
        """Create every series whose labels are known at start (at zero; attainment NaN until a request finishes),
        so that each declared metric is exported from the start and alerts on rates and ratios have a series."""
        for m in models:
            self.requests.labels(m, "planned")
            self.latency.labels(m, "planned")
            for metric in (self.successes, self.slo_met, self.retries, self.batch_size, self.queue_length):
                metric.labels(m)
            self.failures.labels(m, "UNAVAILABLE")
            self.drops.labels(m, "deadline cannot be met")
            if m not in self._window:
                self.slo_attainment.labels(m).set(float("nan"))
        for v in vgpus:
            self.vgpu_busy.labels(v)
            self.vgpu_up.labels(v)
        for kind in ("shm", "http", "grpc"):
            self.hops.labels(kind)

    def finished(self, model: str, met_slo: bool) -> None:
        """Record one finished planned request (answered or shed): the attainment gauge covers a sliding window
        of the last ATTAINMENT_WINDOW, so one shed at start-up does not pin it for the sidecar's life."""
        window = self._window.setdefault(model, deque(maxlen=ATTAINMENT_WINDOW))
        met = self._met_in_window.get(model, 0)
        if len(window) == window.maxlen and window[0]:
            met -= 1
        window.append(met_slo)
        met += int(met_slo)
        self._met_in_window[model] = met
        if met_slo:
            self.series(model, "planned").slo_met.inc()

    def exposition(self) -> bytes:
        for model, window in self._window.items():  # the attainment gauge is set when scraped, not per request
            if window:
                self.slo_attainment.labels(model).set(self._met_in_window[model] / len(window))
        return generate_latest(self.registry)


@dataclass(frozen=True)
class RequestSeries:
    requests: Any
    successes: Any
    latency: Any
    slo_met: Any
