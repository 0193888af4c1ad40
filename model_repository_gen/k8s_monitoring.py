"""Monitoring for ``generate --k8s``: Prometheus Operator ServiceMonitors for the sidecar and the tritonservers, and
a Grafana dashboard (JSON, also as a ConfigMap Grafana's dashboard sidecar loads), written to ``k8s/monitoring/``.

They sit apart from ``k8s/kustomization.yaml`` because ServiceMonitor is a CRD of the Prometheus Operator (apply
``k8s/monitoring`` where it runs, e.g. kube-prometheus-stack). The dashboard reads Triton's ``nv_inference_*``
families, which the sidecar exports for planned models with Triton's names (so the panels read the same for a
plain Triton), and poolpipe's own ``poolpipe_sidecar_*`` for what Triton has no name for (SLO, sheds, vGPUs).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

SIDECAR = "poolpipe-sidecar"
DASHBOARD_UID = "poolpipe-sidecar"
DASHBOARD_FILE = "poolpipe-dashboard.json"
_SC = f'job="{SIDECAR}", namespace="$namespace"'
_TRITON = 'job=~"triton-.*", namespace="$namespace"'


def _labels(name: str, component: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": name, "app.kubernetes.io/part-of": "poolpipe",
            "app.kubernetes.io/component": component}


def service_monitors(namespace: str) -> list[dict[str, Any]]:
    """One ServiceMonitor for the sidecar's Service, one for every tritonserver's (each scraped on ``metrics``)."""
    def monitor(name: str, match: dict[str, str], interval: str) -> dict[str, Any]:
        return {"apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor",
                "metadata": {"name": name, "namespace": namespace, "labels": _labels(name, "monitoring")},
                "spec": {"selector": {"matchLabels": match}, "namespaceSelector": {"matchNames": [namespace]},
                         "endpoints": [{"port": "metrics", "path": "/metrics", "interval": interval}]}}
    return [monitor(SIDECAR, {"app.kubernetes.io/name": SIDECAR}, "10s"),
            monitor("poolpipe-tritonservers", {"app.kubernetes.io/part-of": "poolpipe",
                                               "app.kubernetes.io/component": "tritonserver"}, "15s")]


def _panel(pid: int, title: str, exprs: list[tuple[str, str]], unit: str, x: int, y: int,
           description: str = "") -> dict[str, Any]:
    return {"id": pid, "type": "timeseries", "title": title, "description": description,
            "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "gridPos": {"h": 8, "w": 12, "x": x, "y": y},
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
            "targets": [{"refId": chr(65 + i), "expr": e, "legendFormat": legend,
                         "datasource": {"type": "prometheus", "uid": "${datasource}"}}
                        for i, (e, legend) in enumerate(exprs)]}


def _per_request(family: str) -> str:
    """The average of a Triton duration counter per successful request (µs), by model."""
    return (f"sum by (model) (rate({family}{{{_SC}}}[1m])) / "
            f"sum by (model) (rate(nv_inference_request_success{{{_SC}}}[1m]))")


def _panels() -> list[dict[str, Any]]:
    rows = [
        ("Successful requests", [(f"sum by (model) (rate(nv_inference_request_success{{{_SC}}}[1m]))", "{{model}}")],
         "reqps", "Answered requests per second (Triton's nv_inference_request_success)"),
        ("Failed requests by reason", [(f"sum by (model, reason) (rate(nv_inference_request_failure{{{_SC}}}[1m]))",
                                        "{{model}} {{reason}}")], "reqps", "REJECTED: shed to protect the SLO"),
        ("SLO attainment (last 1000 requests)", [(f"poolpipe_sidecar_slo_attainment{{{_SC}}}", "{{model}}")],
         "percentunit", "Share of finished requests that met their deadline"),
        ("Queue time per request", [(_per_request("nv_inference_queue_duration_us"), "{{model}}")], "µs",
         "Arrival until the request's batch left the scheduler's queue (what Triton's autoscaling reads)"),
        ("Compute per request", [(_per_request(f"nv_inference_compute_{k}_duration_us"), f"{{{{model}}}} {k}")
                                 for k in ("input", "infer", "output")], "µs",
         "input: to the first stage's compute; infer: first stage start to last stage end; output: to the answer"),
        ("Pending requests", [(f"sum by (model) (nv_inference_pending_request_count{{{_SC}}})", "{{model}}")],
         "short", "Requests waiting in the scheduler"),
        ("Batches per second", [(f"sum by (model) (rate(nv_inference_exec_count{{{_SC}}}[1m]))", "{{model}}")],
         "ops", "Pipeline executions (one batch through every stage)"),
        ("Sheds", [(f"sum by (model, reason) (rate(poolpipe_sidecar_drops_total{{{_SC}}}[1m]))",
                    "{{model}}: {{reason}}")], "reqps", "Requests the scheduler dropped, by reason"),
        ("Triton servers: executions", [(f"sum by (pod) (rate(nv_inference_exec_count{{{_TRITON}}}[1m]))", "{{pod}}")],
         "ops", "Partition batches each vGPU's tritonserver ran"),
        ("Triton servers: busy", [(f"sum by (pod) (rate(nv_inference_compute_infer_duration_us{{{_TRITON}}}[1m]))"
                                   " / 1e6", "{{pod}}")], "percentunit", "Share of time computing"),
        ("vGPUs in service", [(f"poolpipe_sidecar_vgpu_up{{{_SC}}}", "{{vgpu}}")], "short",
         "1 while the sidecar dispatches to the vGPU's server"),
        ("GPU utilization", [(f"nv_gpu_utilization{{{_TRITON}}}", "{{pod}} {{gpu_uuid}}")], "percentunit",
         "Triton's GPU metric (GPU servers only)"),
    ]
    return [_panel(i + 1, title, exprs, unit, 12 * (i % 2), 8 * (i // 2), desc)
            for i, (title, exprs, unit, desc) in enumerate(rows)]


def dashboard() -> dict[str, Any]:
    """The Grafana dashboard (schema 39): a Prometheus data source and the namespace are variables."""
    return {"uid": DASHBOARD_UID, "title": "poolpipe: sidecar and Triton servers", "tags": ["poolpipe", "triton"],
            "schemaVersion": 39, "version": 1, "editable": True, "refresh": "10s",
            "time": {"from": "now-1h", "to": "now"},
            "templating": {"list": [
                {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus"},
                {"name": "namespace", "type": "query", "label": "Namespace", "refresh": 1,
                 "datasource": {"type": "prometheus", "uid": "${datasource}"},
                 "query": {"query": f'label_values(nv_inference_request_success{{job="{SIDECAR}"}}, namespace)',
                           "refId": "namespace"},
                 "definition": f'label_values(nv_inference_request_success{{job="{SIDECAR}"}}, namespace)'}]},
            "panels": _panels()}


def dashboard_configmap(namespace: str) -> dict[str, Any]:
    """The dashboard as a ConfigMap labelled for Grafana's dashboard sidecar (kube-prometheus-stack's default)."""
    meta = {"name": "poolpipe-dashboard", "namespace": namespace,
            "labels": {**_labels("poolpipe-dashboard", "monitoring"), "grafana_dashboard": "1"}}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta,
            "data": {DASHBOARD_FILE: json.dumps(dashboard(), indent=1)}}


def write_monitoring(k8s_dir: Path, namespace: str) -> Path:
    """Write ``k8s_dir/monitoring``: servicemonitors.yaml, the dashboard JSON and ConfigMap, a kustomization."""
    d = k8s_dir / "monitoring"
    d.mkdir(parents=True, exist_ok=True)
    (d / "servicemonitors.yaml").write_text(yaml.safe_dump_all(service_monitors(namespace), sort_keys=False))
    (d / "dashboard-configmap.yaml").write_text(yaml.safe_dump(dashboard_configmap(namespace), sort_keys=False))
    (d / DASHBOARD_FILE).write_text(json.dumps(dashboard(), indent=1) + "\n")
    kustomization = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                     "resources": ["servicemonitors.yaml", "dashboard-configmap.yaml"]}
    (d / "kustomization.yaml").write_text(yaml.safe_dump(kustomization, sort_keys=False))
    return d
