"""``generate --k8s --passthrough`` and ``--k8s-tls-secret``: the sidecar fronts an existing Triton Service, serves
TLS from a mounted Secret (mutual on gRPC with --k8s-tls-mutual), its probes use HTTPS, the documents stay valid, and
the arguments written are ones ``poolpipe serve`` accepts with a real certificate in the Secret's place."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import pytest

from model_repository_gen.k8s import K8sOptions, write_k8s
from model_repository_gen.k8s_sidecar import STAGE_TLS_MOUNT, TLS_MOUNT
from poolpipe_common.errors import InputError
from scheduler.server import serve_cli
from scheduler.server.serve_front_cli import settings_from_args
from tests.test_k8s import by_kind, deployed, load_dir, validate_all  # noqa: F401 - deployed is a fixture
from tests.tls_certs import make_certs


def _sidecar(docs: list[dict]) -> dict:
    return by_kind(docs, "Deployment")["poolpipe-sidecar"]["spec"]["template"]["spec"]


def test_passthrough_and_tls_from_a_secret(deployed, tmp_path: Path) -> None:  # noqa: F811
    deploy, manifest = deployed
    opts = K8sOptions(namespace="vision", passthrough="triton.inference.svc:8001", tls_secret="sidecar-tls",
                      tls_mutual=True)
    docs = load_dir(write_k8s(manifest, deploy, opts))
    validate_all(docs)
    pod = _sidecar(docs)
    c = pod["containers"][0]
    args = c["args"]
    assert args[args.index("--passthrough") + 1] == "triton.inference.svc:8001"
    assert {"name": "tls", "secret": {"secretName": "sidecar-tls"}} in pod["volumes"]
    assert {"name": "tls", "mountPath": TLS_MOUNT, "readOnly": True} in c["volumeMounts"]
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert c[probe]["httpGet"]["scheme"] == "HTTPS"
    # what the pod runs is a valid serve command: with a real certificate where the Secret is mounted
    certs = make_certs(tmp_path / "certs")
    secret = tmp_path / "secret"
    secret.mkdir()
    for src, name in ((certs.server_cert, "tls.crt"), (certs.server_key, "tls.key"), (certs.ca, "ca.crt")):
        shutil.copy(src, secret / name)
    parser = argparse.ArgumentParser()
    serve_cli.register(parser.add_subparsers())
    parsed = parser.parse_args([a.replace(TLS_MOUNT, str(secret)) for a in args])
    tls = settings_from_args(parsed)
    assert tls.grpc is not None and tls.grpc.mutual and tls.http is not None and not tls.http.mutual
    plain = _sidecar(load_dir(write_k8s(manifest, deploy, K8sOptions(namespace="vision"))))["containers"][0]
    assert "--passthrough" not in plain["args"] and "scheme" not in plain["readinessProbe"]["httpGet"]


def test_stage_calls_over_tls_from_a_secret(deployed, tmp_path: Path) -> None:  # noqa: F811
    """--k8s-stage-tls-secret: every tritonserver serves gRPC over TLS with the Secret (tritonserver's flags), and
    the sidecar calls them over gRPC checking its ca.crt; the probes stay on Triton's plaintext HTTP port."""
    deploy, manifest = deployed
    docs = load_dir(write_k8s(manifest, deploy, K8sOptions(namespace="vision", stage_tls_secret="stage-tls")))
    validate_all(docs)
    servers = by_kind(docs, "StatefulSet")
    assert servers
    for sts in servers.values():
        pod = sts["spec"]["template"]["spec"]
        c = pod["containers"][0]
        assert f"--grpc-server-cert={STAGE_TLS_MOUNT}/tls.crt" in c["args"] and "--grpc-use-ssl=true" in c["args"]
        assert {"name": "stage-tls", "secret": {"secretName": "stage-tls"}} in pod["volumes"]
        assert "scheme" not in c["readinessProbe"]["httpGet"]
    args = _sidecar(docs)["containers"][0]["args"]
    certs = make_certs(tmp_path / "certs")
    secret = tmp_path / "secret"
    secret.mkdir()
    shutil.copy(certs.ca, secret / "ca.crt")
    parser = argparse.ArgumentParser()
    serve_cli.register(parser.add_subparsers())
    parsed = parser.parse_args([a.replace(STAGE_TLS_MOUNT, str(secret)) for a in args])
    assert parsed.stage_protocol == "grpc" and settings_from_args(parsed).stage is not None


def test_bad_k8s_tls_options_are_one_clear_error() -> None:
    with pytest.raises(InputError, match="--k8s-tls-mutual needs --k8s-tls-secret"):
        K8sOptions(tls_mutual=True).check()
    with pytest.raises(InputError, match="not a Kubernetes Secret name"):
        K8sOptions(tls_secret="Bad_Name").check()
    with pytest.raises(InputError, match="--k8s-stage-tls-secret 'x_y': not a Kubernetes Secret name"):
        K8sOptions(stage_tls_secret="x_y").check()
