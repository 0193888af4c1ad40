"""``poolpipe generate --k8s``: the flags that choose images, volume, namespaces and GPU labels."""

from __future__ import annotations

import argparse
from pathlib import Path

from model_repository_gen import k8s
from poolpipe_common.errors import InputError
from profiling.gpu_types import GPU_TYPES


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("Kubernetes (--k8s)")
    g.add_argument("--k8s", action="store_true",
                   help="also write OUT/k8s/: kustomize-ready manifests for the plan (tritonserver per vGPU, the "
                        "sidecar, manifest ConfigMap, NVIDIA device-plugin MPS configs) and label-nodes.sh")
    g.add_argument("--k8s-namespace", default=k8s.DEFAULT_NAMESPACE, metavar="NAME",
                   help="namespace of poolpipe's workloads (default: %(default)s)")
    g.add_argument("--k8s-triton-image", default=k8s.DEFAULT_TRITON_IMAGE, metavar="IMAGE",
                   help="image with tritonserver, its Python backend and what the partition backend imports "
                        "(default: %(default)s, built by containers/triton/Dockerfile: NGC's tritonserver plus "
                        "numpy, onnx, onnxruntime-gpu)")
    g.add_argument("--k8s-sidecar-image", default=k8s.DEFAULT_SIDECAR_IMAGE, metavar="IMAGE",
                   help="image with poolpipe installed, 'poolpipe' on its PATH (default: %(default)s, built by "
                        "containers/sidecar/Dockerfile)")
    g.add_argument("--k8s-repository-pvc", default=k8s.DEFAULT_PVC, metavar="CLAIM",
                   help="PersistentVolumeClaim holding a copy of OUT (mounted read-only at /models in every "
                        "tritonserver pod; default: %(default)s)")
    g.add_argument("--k8s-device-plugin-namespace", default=k8s.DEFAULT_PLUGIN_NAMESPACE, metavar="NAME",
                   help="namespace of the NVIDIA device plugin / GPU Operator (default: %(default)s)")
    g.add_argument("--k8s-gpu-product", action="append", default=[], metavar="TYPE=LABEL",
                   help="the nvidia.com/gpu.product node label of GPU type TYPE (repeat per type; default: the "
                        "product names NVML reports for the type, e.g. "
                        + ", ".join(f"{t.label}={'|'.join(t.products)}" for t in GPU_TYPES[-3:]) + ")")
    g.add_argument("--k8s-shards", type=int, default=1, metavar="N",
                   help="run N sidecar shards (a StatefulSet, each serving 'poolpipe serve --shard I/N') behind "
                        "one Service (default: 1, a Deployment)")
    g.add_argument("--passthrough", type=_hostport, metavar="HOST:PORT",
                   help="the gRPC address of an existing Triton (its Service, e.g. triton.inference.svc:8001) that "
                        "the sidecar passes every model not in the plan through to (serve --passthrough)")
    g.add_argument("--k8s-tls-secret", metavar="NAME",
                   help="a kubernetes.io/tls Secret (tls.crt, tls.key; ca.crt for --k8s-tls-mutual) mounted in the "
                        "sidecar's pod: its gRPC and HTTP ports serve TLS with it, and the probes use HTTPS")
    g.add_argument("--k8s-stage-tls-secret", metavar="NAME",
                   help="a kubernetes.io/tls Secret whose certificate names every tritonserver's Service "
                        "(e.g. *.NAMESPACE.svc.cluster.local): each tritonserver serves gRPC over TLS with it, and the "
                        "sidecar calls them over gRPC checking the Secret's ca.crt (serve --stage-use-ssl)")
    g.add_argument("--k8s-tls-mutual", action="store_true",
                   help="mutual TLS on the sidecar's gRPC port: clients present a certificate signed by the "
                        "Secret's ca.crt (HTTP stays server-authenticated: the kubelet's probes have no client "
                        "certificate)")


def _hostport(value: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT (e.g. triton.inference.svc:8001), got {value!r}")
    return value


def options_from_args(args: argparse.Namespace) -> k8s.K8sOptions:
    products: dict[str, str] = {}
    for v in args.k8s_gpu_product:
        t, sep, label = v.partition("=")
        if not sep or not t or not label:
            raise InputError(f"--k8s-gpu-product {v!r}: expected TYPE=LABEL, e.g. T4=Tesla-T4")
        products[t] = label
    return k8s.K8sOptions(args.k8s_namespace, args.k8s_triton_image, args.k8s_sidecar_image, args.k8s_repository_pvc,
                          args.k8s_device_plugin_namespace, products, args.k8s_shards, args.passthrough,
                          args.k8s_tls_secret, args.k8s_tls_mutual, args.k8s_stage_tls_secret).check()


def write_from_args(manifest, out: Path, args: argparse.Namespace) -> str:
    """Write OUT/k8s when --k8s was given; returns the line to print (empty without --k8s)."""
    if not args.k8s:
        return ""
    d = k8s.write_k8s(manifest, out, options_from_args(args))
    return (f"wrote {d}: {len(manifest.vgpus)} tritonserver workload(s) and the sidecar; label GPU nodes with "
            f"{d}/label-nodes.sh, then: kubectl apply -k {d} (and, where the Prometheus Operator runs, "
            f"kubectl apply -k {d}/monitoring: ServiceMonitors and a Grafana dashboard)")
