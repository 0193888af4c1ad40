"""The sidecar's Prometheus metrics: attainment over a sliding window that operators can alert on."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from scheduler.server.common.metrics import ATTAINMENT_WINDOW, SidecarMetrics
from scheduler.server.common.model_stats import ModelStats, RequestMarks
from scheduler.server.common.triton_metrics import NAMES, triton_exposition


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


_times = st.one_of(st.none(), st.floats(-1e6, 1e7))


@settings(max_examples=200, deadline=None)
@given(arrival=st.floats(0, 1e6), took=st.floats(0, 1e6), ready=_times, start=_times, end=_times)
def test_triton_statistics_split_each_request_into_its_parts(arrival, took, ready, start, end):
    """Whatever was measured (or not), queue + compute input/infer/output make up the request's time, every part
    counted once per request (perf_analyzer refuses compute counts that differ)."""
    s = ModelStats()
    s.succeeded(arrival, RequestMarks(ready, start, end), arrival + took, 1)
    parts = (s.queue, s.compute_input, s.compute_infer, s.compute_output)
    assert all(p.count == 1 and p.ns >= 0 for p in parts)
    assert s.success.ns - 4 <= sum(p.ns for p in parts) <= s.success.ns


def test_triton_families_have_tritons_names_labels_and_types():
    s = ModelStats()
    s.succeeded(0.0, RequestMarks(10.0, 20.0, 120.0), 130.0, 3)
    s.failed(0.0, 5.0, "REJECTED")
    text = triton_exposition({'m"x': s}, {'m"x': 4}).decode()
    assert "# TYPE nv_inference_request_success counter\n" in text
    assert 'nv_inference_request_success{model="m\\"x",version="1"} 1\n' in text
    assert 'nv_inference_request_failure{model="m\\"x",reason="REJECTED",version="1"} 1\n' in text
    assert 'nv_inference_count{model="m\\"x",version="1"} 3\n' in text
    assert 'nv_inference_compute_infer_duration_us{model="m\\"x",version="1"} 100\n' in text
    assert 'nv_inference_pending_request_count{model="m\\"x",version="1"} 4\n' in text
    assert {f.name for f in text_string_to_metric_families(text)} == set(NAMES)
