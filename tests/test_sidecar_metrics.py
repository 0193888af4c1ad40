"""The sidecar's Prometheus metrics: attainment over a sliding window that operators can alert on."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from scheduler.server.common.metrics import ATTAINMENT_WINDOW, SidecarMetrics


def _gauge(m: SidecarMetrics, name: str, model: str) -> float:
    for fam in text_string_to_metric_families(m.exposition().decode()):
        for s in fam.samples:
            if s.name == name and s.labels.get("model") == model:
                return s.value
    raise KeyError(name)


def test_attainment_is_a_sliding_window_and_lifetime_counters_stay():
    m = SidecarMetrics()
    m.finished("a", False)  # one shed at start-up ...
    assert _gauge(m, "poolpipe_sidecar_slo_attainment", "a") == 0.0
    for _ in range(ATTAINMENT_WINDOW - 1):
        m.finished("a", True)
    assert _gauge(m, "poolpipe_sidecar_slo_attainment", "a") == (ATTAINMENT_WINDOW - 1) / ATTAINMENT_WINDOW
    m.finished("a", True)  # ... leaves the window once ATTAINMENT_WINDOW more have finished
    assert _gauge(m, "poolpipe_sidecar_slo_attainment", "a") == 1.0
    for _ in range(ATTAINMENT_WINDOW // 2):
        m.finished("a", False)
    assert _gauge(m, "poolpipe_sidecar_slo_attainment", "a") == 0.5
    assert _gauge(m, "poolpipe_sidecar_slo_met_total", "a") == ATTAINMENT_WINDOW
