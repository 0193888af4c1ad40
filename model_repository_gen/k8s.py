"""Kubernetes manifests for a generated deployment (``poolpipe generate --k8s``), built as plain data.

Written to ``<out>/k8s/`` beside the launch files, one YAML document per file and a kustomization.yaml:

- ``namespace.yaml``; per vGPU a StatefulSet of one ``tritonserver`` pod and a headless Service (its
  stable DNS name), reading its repository from the user's volume; the sidecar's Deployment (a
  StatefulSet of N shards with ``--shards N``), Service and PodDisruptionBudget; ``manifest.json`` as a
  ConfigMap whose vGPU addresses are the in-cluster DNS names; ``admin-secret.yaml``, the key the sidecar's
  management APIs (shared memory, model repository, trace, logging, /v2/poolpipe) require (restricted APIs);
- ``device-plugin-config.yaml``: the NVIDIA device plugin's configurations, one per (GPU type, vGPU
  level), MPS sharing with ``replicas`` = the level, in the GPU Operator's namespace; and
  ``label-nodes.sh``, the ``nvidia.com/device-plugin.config`` label each cluster host's node needs;
- ``monitoring/``: ServiceMonitors and a Grafana dashboard (k8s_monitoring.py).

GPU vGPUs request ``nvidia.com/gpu: 1`` (one MPS replica, 1/V of a GPU) on nodes whose
``nvidia.com/gpu.product`` is one of the GPU type's product names and whose device-plugin config splits GPUs at
the vGPU's level; an unequal share or a MIG instance is refused (k8s_pods.py). Emulated and CPU hosts get CPU-only
pods, so the same manifests run on a CPU-only cluster. Every tritonserver pod mounts a /dev/shm sized for its
tensors, and its startup probe covers a first TensorRT build where its engine may build one.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from model_repository_gen.k8s_monitoring import write_monitoring
from model_repository_gen.k8s_pods import (
    MIB,
    STARTUP_S,
    check_device_plugin_share,
    shm_bytes,
    shm_volume,
    startup_probe,
    startup_s,
)
from model_repository_gen.k8s_sidecar import add_sidecar_options, add_stage_tls
from model_repository_gen.manifest import Manifest, VGpuInfo
from poolpipe_common.errors import InputError
from profiling.gpu_types import gpu_products

# The images containers/triton/Dockerfile and containers/sidecar/Dockerfile build (tagged with poolpipe's version)
DEFAULT_TRITON_IMAGE = "poolpipe-triton:0.1.0"
DEFAULT_SIDECAR_IMAGE = "poolpipe:0.1.0"
DEFAULT_NAMESPACE = "poolpipe"
DEFAULT_PVC = "poolpipe-repository"
DEFAULT_PLUGIN_NAMESPACE = "gpu-operator"
PLUGIN_CONFIGMAP = "poolpipe-device-plugin-config"
CONFIG_LABEL = "nvidia.com/device-plugin.config"
PRODUCT_LABEL = "nvidia.com/gpu.product"
PORTS = {"http": 8000, "grpc": 8001, "metrics": 8002}
MODELS_MOUNT = "/models"
CONFIGMAP_LIMIT = 1_000_000  # bytes; Kubernetes refuses larger ConfigMaps
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# The sidecar's management APIs, restricted to callers with the admin key (a Secret; generate writes one with a
# random key, kept when generating again)
RESTRICTED_APIS = ("shared-memory", "model-repository", "trace", "logging", "poolpipe-admin")
ADMIN_SECRET = "poolpipe-admin-key"
ADMIN_KEY = "admin-key"
ADMIN_ENV = "POOLPIPE_ADMIN_KEY"


@dataclass(frozen=True)
class K8sOptions:
    """What the cluster operator chooses; validated by ``check``."""

    namespace: str = DEFAULT_NAMESPACE
    triton_image: str = DEFAULT_TRITON_IMAGE
    sidecar_image: str = DEFAULT_SIDECAR_IMAGE
    repository_pvc: str = DEFAULT_PVC
    plugin_namespace: str = DEFAULT_PLUGIN_NAMESPACE
    gpu_products: dict[str, str] = field(default_factory=dict)  # GPU type -> nvidia.com/gpu.product
    shards: int = 1
    passthrough: str | None = None  # generate --passthrough HOST:PORT: an existing Triton Service the sidecar fronts
    tls_secret: str | None = None  # --k8s-tls-secret: a kubernetes.io/tls Secret, mounted for the sidecar's TLS
    tls_mutual: bool = False  # --k8s-tls-mutual: mutual TLS on the sidecar's gRPC port (the Secret's ca.crt)
    stage_tls_secret: str | None = None  # --k8s-stage-tls-secret: the tritonservers' gRPC over TLS, stage calls too

    def check(self) -> K8sOptions:
        for flag, name in (("--k8s-namespace", self.namespace), ("--k8s-repository-pvc", self.repository_pvc),
                           ("--k8s-device-plugin-namespace", self.plugin_namespace)):
            if not _DNS_LABEL.match(name) or len(name) > 63:
                raise InputError(f"{flag} {name!r}: a Kubernetes name is lowercase letters, digits and '-' "
                                 "(at most 63, starting and ending with a letter or digit)")
        if not 1 <= self.shards <= 64:
            raise InputError(f"--k8s-shards {self.shards}: expected 1..64 sidecar shards")
        for flag, secret in (("--k8s-tls-secret", self.tls_secret), ("--k8s-stage-tls-secret", self.stage_tls_secret)):
            if secret is not None and (not _DNS_LABEL.match(secret) or len(secret) > 63):
                raise InputError(f"{flag} {secret!r}: not a Kubernetes Secret name")
        if self.tls_mutual and self.tls_secret is None:
            raise InputError("--k8s-tls-mutual needs --k8s-tls-secret (its ca.crt signs the clients' certificates)")
        return self

    def products(self, gpu_type: str) -> tuple[str, ...]:
        """The ``nvidia.com/gpu.product`` values of a GPU type: --k8s-gpu-product's, else every product name of the
        type in the one table of GPU types (profiling.gpu_types)."""
        got = (self.gpu_products[gpu_type],) if gpu_type in self.gpu_products else gpu_products(gpu_type)
        if not got:
            raise InputError(f"GPU type {gpu_type!r} has no known nvidia.com/gpu.product label; pass "
                             f"--k8s-gpu-product {gpu_type}=LABEL (the value GPU Feature Discovery puts on its nodes, "
                             "see 'kubectl get nodes -L nvidia.com/gpu.product')")
        return got


def k8s_name(text: str, prefix: str = "") -> str:
    """A DNS-1123 label from a vGPU or host name: lowercase, '_' and '.' as '-', at most 63 characters."""
    name = re.sub(r"[^a-z0-9-]", "-", (prefix + text).lower()).strip("-")
    if not _DNS_LABEL.match(name) or len(name) > 63:
        raise InputError(f"{text!r}: cannot be made a Kubernetes name (at most 63 letters, digits, '-'); "
                         "shorten the host name in the cluster file")
    return name


def plugin_config_name(gpu_type: str, v: int) -> str:
    return k8s_name(f"{gpu_type}-mps{v}", "poolpipe-")


def host_levels(manifest: Manifest) -> dict[str, int]:
    """GPU host -> the vGPU level its GPUs are split at; the device plugin splits all GPUs of a node alike."""
    levels: dict[str, set[int]] = {}
    for g in manifest.vgpus:
        if g.kind == "KIND_GPU":
            levels.setdefault(g.host, set()).add(g.v)
    mixed = {h: sorted(vs) for h, vs in levels.items() if len(vs) > 1}
    if mixed:
        h, vs = next(iter(sorted(mixed.items())))
        raise InputError(f"host {h}: the plan splits its GPUs at vGPU levels {vs}, but the NVIDIA device plugin "
                         "shares every GPU of a node alike; list that machine's GPUs as one host per level in "
                         "the cluster file, or plan with one --vgpu-levels value for its GPU type")
    return {h: vs.pop() for h, vs in levels.items()}


def device_plugin_config(v: int) -> dict[str, Any]:
    """The device plugin's config file: MPS sharing with ``v`` replicas per GPU (none for whole GPUs)."""
    cfg: dict[str, Any] = {"version": "v1", "flags": {"migStrategy": "none"}}
    if v > 1:
        cfg["sharing"] = {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": v}]}}
    return cfg


def _meta(name: str, ns: str | None, component: str, extra: dict[str, str] | None = None) -> dict[str, Any]:
    labels = {"app.kubernetes.io/name": name, "app.kubernetes.io/part-of": "poolpipe",
              "app.kubernetes.io/component": component, **(extra or {})}
    meta: dict[str, Any] = {"name": name, "labels": labels}
    if ns:
        meta["namespace"] = ns
    return meta


def _container_ports() -> list[dict[str, Any]]:
    return [{"name": n, "containerPort": p, "protocol": "TCP"} for n, p in PORTS.items()]


def _probes(port: str = "http", startup: int = STARTUP_S) -> dict[str, Any]:
    def probe(path: str, period: int, failures: int) -> dict[str, Any]:
        return {"httpGet": {"path": path, "port": port}, "periodSeconds": period, "failureThreshold": failures}

    return {"readinessProbe": probe("/v2/health/ready", 5, 3), "livenessProbe": probe("/v2/health/live", 10, 6),
            "startupProbe": startup_probe(startup, port)}


def _affinity(products: tuple[str, ...], config: str) -> dict[str, Any]:
    terms = [{"key": PRODUCT_LABEL, "operator": "In", "values": list(products)},
             {"key": CONFIG_LABEL, "operator": "In", "values": [config]}]
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": terms}]}}}


def vgpu_workload(g: VGpuInfo, opts: K8sOptions, manifest: Manifest) -> list[dict[str, Any]]:
    """One vGPU: a StatefulSet of one tritonserver pod and the headless Service that names it (k8s_pods.py: its
    /dev/shm, its startup probe, the share the device plugin gives it)."""
    check_device_plugin_share(g)
    name = k8s_name(g.id, "triton-")
    meta = _meta(name, opts.namespace, "tritonserver", {"poolpipe.io/vgpu": name})
    selector = {"app.kubernetes.io/name": name}
    on_gpu = g.kind == "KIND_GPU"
    shm = shm_bytes(manifest, g.id)
    resources: dict[str, Any] = {"requests": {"cpu": "1", "memory": f"{2048 + shm // MIB}Mi"}}  # /dev/shm counts
    if on_gpu:
        resources = {"requests": {**resources["requests"], "nvidia.com/gpu": 1}, "limits": {"nvidia.com/gpu": 1}}
    args = [f"--model-repository={MODELS_MOUNT}/{g.repository}", f"--http-port={PORTS['http']}",
            f"--grpc-port={PORTS['grpc']}", f"--metrics-port={PORTS['metrics']}"]
    env = [{"name": k, "value": v} for k, v in sorted(g.env.items()) if k != "CUDA_VISIBLE_DEVICES"]
    container = {"name": "tritonserver", "image": opts.triton_image, "command": ["tritonserver"], "args": args,
                 "env": env, "ports": _container_ports(), "resources": resources,
                 **_probes(startup=startup_s(manifest, g.id))}
    volume, mount = shm_volume(shm)
    container["volumeMounts"] = [{"name": "repository", "mountPath": MODELS_MOUNT, "readOnly": True}, mount]
    pod: dict[str, Any] = {"containers": [container], "volumes": [
        {"name": "repository", "persistentVolumeClaim": {"claimName": opts.repository_pvc, "readOnly": True}},
        volume]}
    if on_gpu:
        pod["affinity"] = _affinity(opts.products(g.gpu_type), plugin_config_name(g.gpu_type, g.v))
    if opts.stage_tls_secret:
        add_stage_tls(container, pod, opts.stage_tls_secret)
    sts = {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": meta,
           "spec": {"serviceName": name, "replicas": 1, "selector": {"matchLabels": selector},
                    "template": {"metadata": {"labels": meta["labels"]}, "spec": pod}}}
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": meta,
           "spec": {"clusterIP": "None", "selector": selector, "publishNotReadyAddresses": True,
                    "ports": [{"name": n, "port": p, "targetPort": n} for n, p in PORTS.items()]}}
    return [sts, svc]


def vgpu_dns(g: VGpuInfo, namespace: str) -> str:
    return f"{k8s_name(g.id, 'triton-')}.{namespace}.svc.cluster.local"


def in_cluster_manifest(manifest: Manifest, namespace: str) -> dict[str, Any]:
    """manifest.json with every vGPU at its Service's DNS name; a host's address is its first vGPU's, so the
    sidecar never takes two pods for one machine (no shared-memory hops between pods)."""
    d = manifest.to_dict()
    first: dict[str, str] = {}
    for g, raw in zip(manifest.vgpus, d["vgpus"]):
        dns = vgpu_dns(g, namespace)
        first.setdefault(g.host, dns)
        raw.update(grpc_url=f"{dns}:{PORTS['grpc']}", http_url=f"{dns}:{PORTS['http']}",
                   metrics_url=f"{dns}:{PORTS['metrics']}")
    for h in d["hosts"]:
        h["address"] = first.get(h["name"], k8s_name(h["name"], "host-") + ".invalid")
    return d


def manifest_configmap(manifest: Manifest, namespace: str) -> dict[str, Any]:
    text = json.dumps(in_cluster_manifest(manifest, namespace), separators=(",", ":"))
    if len(text) > CONFIGMAP_LIMIT:
        raise InputError(f"manifest.json is {len(text):,} bytes in-cluster, over a ConfigMap's 1 MB; plan fewer "
                         "models per deployment (it embeds each model's profile)")
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta("poolpipe-manifest", namespace, "manifest"),
            "data": {"manifest.json": text}}


def sidecar_documents(opts: K8sOptions) -> list[dict[str, Any]]:
    """The sidecar: a Deployment (or a StatefulSet of shards, each serving ``--shard I/N``), Service, PDB."""
    name = "poolpipe-sidecar"
    meta = _meta(name, opts.namespace, "sidecar")
    selector = {"app.kubernetes.io/name": name}
    args = ["serve", "--manifest", "/etc/poolpipe/manifest.json", "--bind", "0.0.0.0",
            *[a for n, p in PORTS.items() for a in (f"--{n}-port", str(p))]]
    # bound beyond loopback: the management APIs need the admin key from the Secret (tritonserver's flags)
    restricted = f"{','.join(RESTRICTED_APIS)}:{ADMIN_KEY}=$({ADMIN_ENV})"
    args += ["--grpc-restricted-protocol", restricted, "--http-restricted-api", restricted]
    env: list[dict[str, Any]] = [{"name": ADMIN_ENV, "valueFrom": {"secretKeyRef": {"name": ADMIN_SECRET,
                                                                                     "key": ADMIN_KEY}}}]
    if opts.shards > 1:  # the StatefulSet's pod index label (Kubernetes >= 1.28) picks the shard
        env.append({"name": "SHARD_INDEX", "valueFrom": {"fieldRef": {
            "fieldPath": "metadata.labels['apps.kubernetes.io/pod-index']"}}})
        args += ["--shard", f"$(SHARD_INDEX)/{opts.shards}"]
    container = {"name": "sidecar", "image": opts.sidecar_image, "command": ["poolpipe"], "args": args, "env": env,
                 "ports": _container_ports(), "resources": {"requests": {"cpu": "2", "memory": "1Gi"}}, **_probes(),
                 "volumeMounts": [{"name": "manifest", "mountPath": "/etc/poolpipe", "readOnly": True}]}
    pod = {"terminationGracePeriodSeconds": 40, "containers": [container],
           "volumes": [{"name": "manifest", "configMap": {"name": "poolpipe-manifest"}}]}
    add_sidecar_options(container, pod, opts.passthrough, opts.tls_secret, opts.tls_mutual, opts.stage_tls_secret)
    spec: dict[str, Any] = {"replicas": opts.shards, "selector": {"matchLabels": selector},
                            "template": {"metadata": {"labels": meta["labels"]}, "spec": pod}}
    if opts.shards > 1:
        workload = {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": meta,
                    "spec": {**spec, "serviceName": name, "podManagementPolicy": "Parallel"}}
    else:
        workload = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta, "spec": spec}
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": meta,
           "spec": {"selector": selector, "ports": [{"name": n, "port": p, "targetPort": n} for n, p in PORTS.items()]}}
    pdb = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": meta,
           "spec": {"minAvailable": max(1, opts.shards - 1), "selector": {"matchLabels": selector}}}
    return [workload, svc, pdb]


def plugin_documents(manifest: Manifest, opts: K8sOptions) -> tuple[dict[str, Any] | None, dict[str, str]]:
    """The device plugin's ConfigMap (one config per GPU type and level) and host -> config name to label."""
    hosts = {h.name: h for h in manifest.hosts}
    labels = {h: plugin_config_name(hosts[h].gpu_type, v) for h, v in sorted(host_levels(manifest).items())}
    configs = {plugin_config_name(hosts[h].gpu_type, v): yaml.safe_dump(device_plugin_config(v), sort_keys=False)
               for h, v in host_levels(manifest).items()}
    if not configs:
        return None, {}
    return ({"apiVersion": "v1", "kind": "ConfigMap",
             "metadata": _meta(PLUGIN_CONFIGMAP, opts.plugin_namespace, "device-plugin-config"),
             "data": dict(sorted(configs.items()))}, labels)


def k8s_documents(manifest: Manifest, opts: K8sOptions) -> dict[str, list[dict[str, Any]]]:
    """File name -> its documents, for every resource of the deployment."""
    opts.check()
    if any(h.name == "k8s" for h in manifest.hosts):
        raise InputError("a host named 'k8s' would share OUT/k8s with the Kubernetes manifests; rename it")
    files: dict[str, list[dict[str, Any]]] = {
        "namespace.yaml": [{"apiVersion": "v1", "kind": "Namespace", "metadata": _meta(opts.namespace, None,
                                                                                        "namespace")}]}
    plugin, _ = plugin_documents(manifest, opts)
    if plugin is not None:
        files["device-plugin-config.yaml"] = [plugin]
    for g in manifest.vgpus:
        fname = f"{k8s_name(g.id, 'triton-')}.yaml"
        if fname in files:
            raise InputError(f"vGPU {g.id}: its Kubernetes name {fname[:-5]} is another vGPU's too; rename the "
                             "hosts in the cluster file so that their lowercase names differ")
        files[fname] = vgpu_workload(g, opts, manifest)
    files["manifest-configmap.yaml"] = [manifest_configmap(manifest, opts.namespace)]
    files["sidecar.yaml"] = sidecar_documents(opts)
    return files


def admin_secret(namespace: str, key: str | None = None) -> dict[str, Any]:
    """The Secret holding the admin key of the sidecar's restricted APIs (a new random key unless given)."""
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": _meta(ADMIN_SECRET, namespace, "admin-key"),
            "stringData": {ADMIN_KEY: key or secrets.token_hex(16)}}


def _kept_admin_key(path: Path) -> str | None:
    """The key of a Secret written before (generating again must not lock out its holders)."""
    try:
        doc = yaml.safe_load(path.read_text())
        return str(doc["stringData"][ADMIN_KEY]) or None
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        return None


def write_k8s(manifest: Manifest, out_dir: str | Path, opts: K8sOptions) -> Path:
    """Write ``out_dir/k8s``: every resource, kustomization.yaml and label-nodes.sh; returns the directory."""
    files = k8s_documents(manifest, opts)
    d = Path(out_dir) / "k8s"
    d.mkdir(parents=True, exist_ok=True)
    files["admin-secret.yaml"] = [admin_secret(opts.namespace, _kept_admin_key(d / "admin-secret.yaml"))]
    for old in d.glob("*.yaml"):
        old.unlink()
    for fname, docs in files.items():
        (d / fname).write_text(yaml.safe_dump_all(docs, sort_keys=False))
    (d / "admin-secret.yaml").chmod(0o600)
    kustomization = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                     "resources": list(files)}
    (d / "kustomization.yaml").write_text(yaml.safe_dump(kustomization, sort_keys=False))
    _, labels = plugin_documents(manifest, opts)
    lines = ["#!/bin/sh", "# Label each GPU node with the NVIDIA device-plugin config its GPUs are split by",
             "# (node names: the cluster file's host names; NODE_<HOST>=name overrides one, e.g. NODE_GPU_A=node-7).",
             "set -eu"]
    for host, config in labels.items():
        node = host.lower()
        lines.append(f'kubectl label node "${{{_env_name(host)}:-{node}}}" {CONFIG_LABEL}={config} --overwrite')
    (d / "label-nodes.sh").write_text("\n".join(lines) + "\n")
    (d / "label-nodes.sh").chmod(0o755)
    write_monitoring(d, opts.namespace)
    return d


def _env_name(host: str) -> str:
    return "NODE_" + re.sub(r"[^A-Za-z0-9]", "_", host).upper()
