"""What ``generate --k8s`` adds to the pods on request: the pass-through Triton the sidecar fronts (an existing
Service, ``--passthrough HOST:PORT``), TLS on the sidecar's ports from a Secret (``--k8s-tls-secret``, a
``kubernetes.io/tls`` Secret: tls.crt, tls.key, and ca.crt for mutual TLS) with the probes on HTTPS then, and TLS on
the stage calls (``--k8s-stage-tls-secret``: every tritonserver serves gRPC with the Secret's certificate, the
sidecar checks it against its ca.crt and calls over gRPC)."""

from __future__ import annotations

from typing import Any

TLS_MOUNT = "/etc/poolpipe/tls"
STAGE_TLS_MOUNT = "/etc/poolpipe/stage-tls"
PROBES = ("readinessProbe", "livenessProbe", "startupProbe")


def tls_args(mutual: bool) -> list[str]:
    """``poolpipe serve``'s TLS flags over the Secret's files: both ports over TLS; mutual TLS on gRPC only, since
    the kubelet's HTTP probes present no client certificate."""
    crt, key, ca = f"{TLS_MOUNT}/tls.crt", f"{TLS_MOUNT}/tls.key", f"{TLS_MOUNT}/ca.crt"
    args = [a for port in ("grpc", "http") for a in (f"--{port}-use-ssl", f"--{port}-server-cert", crt,
                                                     f"--{port}-server-key", key)]
    return args + (["--grpc-use-ssl-mutual", "--grpc-root-cert", ca] if mutual else [])


def _mount(container: dict[str, Any], pod: dict[str, Any], name: str, secret: str, path: str) -> None:
    container.setdefault("volumeMounts", []).append({"name": name, "mountPath": path, "readOnly": True})
    pod["volumes"].append({"name": name, "secret": {"secretName": secret}})


def add_stage_tls(container: dict[str, Any], pod: dict[str, Any], secret: str) -> None:
    """A tritonserver's container and pod: its gRPC port over TLS (tritonserver's own flags); its HTTP port, which
    the probes use, has no TLS in Triton."""
    _mount(container, pod, "stage-tls", secret, STAGE_TLS_MOUNT)
    container["args"] += ["--grpc-use-ssl=true", f"--grpc-server-cert={STAGE_TLS_MOUNT}/tls.crt",
                          f"--grpc-server-key={STAGE_TLS_MOUNT}/tls.key"]


def add_sidecar_options(container: dict[str, Any], pod: dict[str, Any], passthrough: str | None,
                        tls_secret: str | None, tls_mutual: bool, stage_tls_secret: str | None = None) -> None:
    """Change the sidecar's container and pod in place."""
    if passthrough:
        container["args"] += ["--passthrough", passthrough]
    if stage_tls_secret:
        _mount(container, pod, "stage-tls", stage_tls_secret, STAGE_TLS_MOUNT)
        container["args"] += ["--stage-protocol", "grpc", "--stage-use-ssl", "--stage-root-cert",
                              f"{STAGE_TLS_MOUNT}/ca.crt"]
    if not tls_secret:
        return
    container["args"] += tls_args(tls_mutual)
    _mount(container, pod, "tls", tls_secret, TLS_MOUNT)
    for probe in PROBES:  # the kubelet does not verify the certificate of an HTTPS probe
        container[probe]["httpGet"]["scheme"] = "HTTPS"
