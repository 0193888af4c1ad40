"""What one load-test run measured: per-request outcomes folded into attainment and latency figures."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class RunSummary:
    model: str
    trace: str
    rate_rps: float
    duration_s: float
    slo_ms: float = 0.0
    in_flight: int = 0
    latencies_s: list[float] = field(default_factory=list)  # successful requests
    within_slo: int = 0
    errors: Counter = field(default_factory=Counter)
    send_lags_s: list[float] = field(default_factory=list)  # how late each request left after its scheduled time

    def started(self, lag_s: float = 0.0) -> None:
        """A request left ``lag_s`` after its arrival time in the schedule (open loop: the lag should stay ~0)."""
        self.in_flight += 1
        self.send_lags_s.append(max(lag_s, 0.0))

    def record(self, latency_s: float, error: str | None, slo_s: float) -> None:
        """One request's outcome (it was counted by ``started``)."""
        self.in_flight -= 1
        if error is not None:
            self.errors[error] += 1
            return
        self.latencies_s.append(latency_s)
        if slo_s and latency_s <= slo_s:
            self.within_slo += 1

    def to_dict(self) -> dict[str, Any]:
        ok = len(self.latencies_s)
        sent = ok + sum(self.errors.values())
        lat = np.array(self.latencies_s) * 1e3 if ok else np.array([np.nan])
        lag = np.array(self.send_lags_s) * 1e3 if self.send_lags_s else np.array([np.nan])
        return {
            "model": self.model, "trace": self.trace, "offered_rps": self.rate_rps, "duration_s": self.duration_s,
            "slo_ms": self.slo_ms, "sent": sent, "succeeded": ok, "failed": sent - ok,
            "unanswered": self.in_flight,
            "throughput_rps": ok / self.duration_s if self.duration_s else 0.0,
            "slo_attainment": (self.within_slo / sent) if (sent and self.slo_ms) else None,
            "p50_ms": float(np.percentile(lat, 50)), "p90_ms": float(np.percentile(lat, 90)),
            "p99_ms": float(np.percentile(lat, 99)),
            "send_lag_ms_p50": float(np.percentile(lag, 50)), "send_lag_ms_p99": float(np.percentile(lag, 99)),
            "send_lag_ms_max": float(lag.max()),
            "errors": dict(self.errors.most_common(10)),
        }
