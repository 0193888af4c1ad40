"""What ``generate --k8s`` adds to the sidecar's pod on request: the pass-through Triton it fronts (an existing
Service, ``--passthrough HOST:PORT``) and TLS from a Secret (``--k8s-tls-secret``, a ``kubernetes.io/tls`` Secret:
tls.crt, tls.key, and ca.crt for mutual TLS), with the probes on HTTPS then."""

from __future__ import annotations

from typing import Any

TLS_MOUNT = "/etc/poolpipe/tls"
PROBES = ("readinessProbe", "livenessProbe", "startupProbe")


def tls_args(mutual: bool) -> list[str]:
    """``poolpipe serve``'s TLS flags over the Secret's files: both ports over TLS; mutual TLS on gRPC only, since
    the kubelet's HTTP probes present no client certificate."""
    crt, key, ca = f"{TLS_MOUNT}/tls.crt", f"{TLS_MOUNT}/tls.key", f"{TLS_MOUNT}/ca.crt"
    args = [a for port in ("grpc", "http") for a in (f"--{port}-use-ssl", f"--{port}-server-cert", crt,
                                                     f"--{port}-server-key", key)]
    return args + (["--grpc-use-ssl-mutual", "--grpc-root-cert", ca] if mutual else [])


def add_sidecar_options(container: dict[str, Any], pod: dict[str, Any], passthrough: str | None,
                        tls_secret: str | None, tls_mutual: bool) -> None:
    """Change the sidecar's container and pod in place."""
    if passthrough:
        container["args"] += ["--passthrough", passthrough]
    if not tls_secret:
        return
    container["args"] += tls_args(tls_mutual)
    container["volumeMounts"].append({"name": "tls", "mountPath": TLS_MOUNT, "readOnly": True})
    pod["volumes"].append({"name": "tls", "secret": {"secretName": tls_secret}})
    for probe in PROBES:  # the kubelet does not verify the certificate of an HTTPS probe
        container[probe]["httpGet"]["scheme"] = "HTTPS"
