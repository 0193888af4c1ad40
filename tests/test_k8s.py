"""``poolpipe generate --k8s``: every document valid against the Kubernetes schemas (offline), and the
workloads, MPS replicas, affinities and in-cluster addresses agree with the plan."""

from __future__ import annotations

import json
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from model_repository_gen.cluster_file import cluster_from_dict
from model_repository_gen.generate import generate
from model_repository_gen.k8s import K8sOptions, k8s_documents, write_k8s
from model_repository_gen.manifest import load_manifest, manifest_from_dict
from poolpipe_common.errors import InputError
from profiling.zoo import build_zoo_model
from tests.conftest import run_cli
from tests.deploy_helpers import make_plan, make_profile

K8S_VERSION = "1.30.0"
# pipeline 0: block 0 on a whole T4, blocks 1-2 on two L4 half-GPUs; pipeline 1: the whole model on an L4 half
PIPELINES = [[((0, 1), "T4", 1, 1), ((1, 3), "L4", 2, 2)], [((0, 3), "L4", 2, 1)]]


def gpu_hosts(device: str = "gpu") -> list[dict]:
    return [{"name": "l4box", "address": "10.0.0.5", "gpu_type": "L4", "gpus": 2, "bandwidth_gbps": 10,
             "device": device},
            {"name": "t4box", "address": "10.0.0.6", "gpu_type": "T4", "gpus": 1, "bandwidth_gbps": 10,
             "device": device}]


@pytest.fixture(scope="module")
def deployed(tmp_path_factory) -> tuple[Path, object]:
    d = tmp_path_factory.mktemp("k8s")
    onnx_path = build_zoo_model("resnet", d / "resnet.onnx")
    plan = make_plan(make_profile(onnx_path, "resnet", 3, {"L4": (1, 2), "T4": (1,)}), PIPELINES)
    manifest = generate(plan, {"resnet": onnx_path}, cluster_from_dict({"hosts": gpu_hosts()}), d / "deploy")
    return d / "deploy", manifest


def load_dir(k8s_dir: Path) -> list[dict]:
    kust = yaml.safe_load((k8s_dir / "kustomization.yaml").read_text())
    assert sorted(kust["resources"]) == sorted(p.name for p in k8s_dir.glob("*.yaml") if p.name != "kustomization.yaml")
    return [doc for f in kust["resources"] for doc in yaml.safe_load_all((k8s_dir / f).read_text())]


def validate_all(docs: list[dict]) -> None:
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def by_kind(docs: list[dict], kind: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def test_gpu_plan_manifests_are_valid_and_match_the_plan(deployed):
    deploy, manifest = deployed
    d = write_k8s(manifest, deploy, K8sOptions(namespace="vision"))
    docs = load_dir(d)
    validate_all(docs)
    stss, svcs = by_kind(docs, "StatefulSet"), by_kind(docs, "Service")
    assert len(stss) == len(manifest.vgpus) == 4
    # the device plugin's configs: L4 split in two by MPS, T4 whole; each host labelled with its config
    plugin = by_kind(docs, "ConfigMap")["poolpipe-device-plugin-config"]
    assert plugin["metadata"]["namespace"] == "gpu-operator"
    l4 = yaml.safe_load(plugin["data"]["poolpipe-l4-mps2"])
    assert l4["sharing"]["mps"]["resources"] == [{"name": "nvidia.com/gpu", "replicas": 2}]
    assert "sharing" not in yaml.safe_load(plugin["data"]["poolpipe-t4-mps1"])
    labels = (d / "label-nodes.sh").read_text()
    assert "nvidia.com/device-plugin.config=poolpipe-l4-mps2" in labels and "t4box" in labels
    products = {"L4": ["NVIDIA-L4"], "T4": ["Tesla-T4", "NVIDIA-T4"]}  # every name NVML gives the type
    for g in manifest.vgpus:
        name = "triton-" + g.id
        pod = stss[name]["spec"]["template"]["spec"]
        c = pod["containers"][0]
        assert c["resources"]["limits"] == {"nvidia.com/gpu": 1}
        assert f"--model-repository=/models/{g.repository}" in c["args"]
        assert c["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
        assert c["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
        assert "metrics" in {p["name"] for p in c["ports"]}
        terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"][0]["matchExpressions"]
        assert {t["key"]: t["values"] for t in terms} == {
            "nvidia.com/gpu.product": products[g.gpu_type],
            "nvidia.com/device-plugin.config": [f"poolpipe-{g.gpu_type.lower()}-mps{g.v}"]}
        assert svcs[name]["spec"]["clusterIP"] == "None" and stss[name]["spec"]["serviceName"] == name
        check_shm_and_startup(pod, manifest, g.id, first_build=True)
    # the in-cluster manifest: the sidecar reaches every vGPU at its Service's DNS name
    text = by_kind(docs, "ConfigMap")["poolpipe-manifest"]["data"]["manifest.json"]
    inside = manifest_from_dict(json.loads(text))
    assert [g.grpc_url for g in inside.vgpus] == [f"triton-{g.id}.vision.svc.cluster.local:8001"
                                                    for g in manifest.vgpus]
    assert [p.stages for m in inside.models for p in m.pipelines] == \
        [p.stages for m in manifest.models for p in m.pipelines]
    assert {"Deployment", "PodDisruptionBudget", "Namespace"} <= {doc["kind"] for doc in docs}
    sidecar = by_kind(docs, "Deployment")["poolpipe-sidecar"]["spec"]["template"]["spec"]
    assert sidecar["volumes"][0]["configMap"]["name"] == "poolpipe-manifest"


def test_emulated_hosts_give_cpu_only_pods_and_shards_a_statefulset(tmp_path):
    """A real MILP plan of PPipe's measured googlenet profile on emulated hosts: no GPU requests, no
    affinity, so the same manifests run on a CPU-only cluster; --k8s-shards 2 runs two sidecar shards."""
    for args in (["profile", "import-ppipe", "--dir", "data/ppipe", "--model", "googlenet-v3-pytorch",
                  "--out", tmp_path / "g.json"],
                 ["plan", "--profile", tmp_path / "g.json", "--gpus", "T4=3,L4=2", "--slo-multiplier", "5",
                  "--out", tmp_path / "plan.json"]):
        assert run_cli(*args).returncode == 0
    hosts = [{**h, "device": "emulated", "gpus": {"l4box": 2, "t4box": 3}[h["name"]]} for h in gpu_hosts()]
    (tmp_path / "cluster.json").write_text(json.dumps({"hosts": hosts}))
    r = run_cli("generate", "--plan", tmp_path / "plan.json", "--cluster", tmp_path / "cluster.json",
                "--out", tmp_path / "deploy", "--emulated-tensor-scale", "0.01", "--k8s", "--k8s-shards", "2")
    assert r.returncode == 0 and "kubectl apply -k" in r.stdout, r.stderr
    docs = load_dir(tmp_path / "deploy" / "k8s")
    validate_all(docs)
    manifest = load_manifest(tmp_path / "deploy")
    pods = [s["spec"]["template"]["spec"] for n, s in by_kind(docs, "StatefulSet").items() if n.startswith("triton")]
    assert len(pods) == len(manifest.vgpus) >= 2
    for name, sts in by_kind(docs, "StatefulSet").items():
        if name.startswith("triton"):
            pod = sts["spec"]["template"]["spec"]
            assert "affinity" not in pod and "nvidia.com/gpu" not in json.dumps(pod["containers"][0]["resources"])
            check_shm_and_startup(pod, manifest, name.removeprefix("triton-"), first_build=False)
    assert "device-plugin-config.yaml" not in [p.name for p in (tmp_path / "deploy" / "k8s").iterdir()]
    sidecar = by_kind(docs, "StatefulSet")["poolpipe-sidecar"]
    assert sidecar["spec"]["replicas"] == 2
    assert sidecar["spec"]["template"]["spec"]["containers"][0]["args"][-2:] == ["--shard", "$(SHARD_INDEX)/2"]
    # generating again without --k8s leaves no stale manifests behind; a bad flag fails before writing anything
    r = run_cli("generate", "--plan", tmp_path / "plan.json", "--cluster", tmp_path / "cluster.json",
                "--out", tmp_path / "deploy", "--emulated-tensor-scale", "0.01")
    assert r.returncode == 0 and not (tmp_path / "deploy" / "k8s").exists()
    r = run_cli("generate", "--plan", tmp_path / "plan.json", "--cluster", tmp_path / "cluster.json",
                "--out", tmp_path / "deploy2", "--k8s", "--k8s-gpu-product", "T4")
    assert r.returncode == 2 and "TYPE=LABEL" in r.stderr and not (tmp_path / "deploy2").exists()


def check_shm_and_startup(pod: dict, manifest, vgpu: str, first_build: bool) -> None:
    """/dev/shm: a memory-backed emptyDir holding two batches of every stage's inputs and outputs besides the
    Python backend's own 64 MiB (the runtime's default is 64 MiB in all), counted in the pod's memory request; the
    startup probe outlasts a first TensorRT build where the engine may build one (auto, trt, ort-trt)."""
    c = pod["containers"][0]
    vgpu = next(g.id for g in manifest.vgpus if g.id.lower().replace("_", "-") == vgpu or g.id == vgpu)
    need = sum(2 * p.batch * sum(t.bytes_per_request() for t in (*s.inputs, *s.outputs))
               for m in manifest.models for p in m.pipelines for s in p.stages if vgpu in s.vgpus)
    assert need > 0
    dshm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    size = int(dshm["emptyDir"]["sizeLimit"].removesuffix("Mi")) << 20
    assert dshm["emptyDir"]["medium"] == "Memory" and need + (64 << 20) <= size < need + (66 << 20)
    assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]
    assert int(c["resources"]["requests"]["memory"].removesuffix("Mi")) << 20 >= (2 << 30) + size
    probe = c["startupProbe"]
    assert probe["periodSeconds"] * probe["failureThreshold"] >= (1800 if first_build else 300)
    assert first_build or probe["periodSeconds"] * probe["failureThreshold"] <= 300


def test_bad_k8s_input_is_one_clear_error(deployed):
    _, manifest = deployed
    raw = manifest.to_dict()
    unknown = json.loads(json.dumps(raw).replace('"T4"', '"Z9"'))  # a GPU type with no known product label
    with pytest.raises(InputError, match="--k8s-gpu-product Z9=LABEL"):
        k8s_documents(manifest_from_dict(unknown), K8sOptions())
    assert k8s_documents(manifest_from_dict(unknown), K8sOptions(gpu_products={"Z9": "Acme-Z9"}))
    with pytest.raises(InputError, match="--k8s-namespace"):
        k8s_documents(manifest, K8sOptions(namespace="Vision_Prod"))
    mixed = json.loads(json.dumps(raw))
    t4 = next(g for g in mixed["vgpus"] if g["gpu_type"] == "T4")
    t4.update(host="l4box", gpu_type="L4")  # l4box now holds a whole GPU beside its half GPUs
    with pytest.raises(InputError, match="vGPU levels"):
        k8s_documents(manifest_from_dict(mixed), K8sOptions())


def test_monitoring_scrapes_the_sidecar_and_servers_and_the_dashboard_reads_triton_names(deployed):
    """k8s/monitoring: ServiceMonitors whose selectors and ports match the Services (a ServiceMonitor is a CRD: its
    fields are checked here, the ConfigMap against the schemas); a Grafana dashboard on nv_inference_* families."""
    from model_repository_gen.k8s_monitoring import DASHBOARD_FILE
    from scheduler.server.common.triton_metrics import NAMES

    deploy, manifest = deployed
    d = write_k8s(manifest, deploy, K8sOptions(namespace="vision"))
    services = by_kind(load_dir(d), "Service")
    mon = load_dir(d / "monitoring")
    validate_all([doc for doc in mon if doc["kind"] == "ConfigMap"])
    monitors = by_kind(mon, "ServiceMonitor")
    assert set(monitors) == {"poolpipe-sidecar", "poolpipe-tritonservers"}
    for m in monitors.values():
        assert m["apiVersion"] == "monitoring.coreos.com/v1" and m["metadata"]["namespace"] == "vision"
        want = m["spec"]["selector"]["matchLabels"]
        scraped = [s for s in services.values() if want.items() <= s["metadata"]["labels"].items()]
        assert scraped and all("metrics" in {p["name"] for p in s["spec"]["ports"]} for s in scraped)
        assert m["spec"]["endpoints"][0]["port"] == "metrics"
    assert len([s for s in services.values() if s["metadata"]["labels"]["app.kubernetes.io/component"]
                == "tritonserver"]) == len(manifest.vgpus)
    board = json.loads((d / "monitoring" / DASHBOARD_FILE).read_text())
    cm = by_kind(mon, "ConfigMap")["poolpipe-dashboard"]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1" and json.loads(cm["data"][DASHBOARD_FILE]) == board
    exprs = " ".join(t["expr"] for p in board["panels"] for t in p["targets"])
    used = {n for n in NAMES if n in exprs}
    assert {"nv_inference_request_success", "nv_inference_queue_duration_us",
            "nv_inference_compute_infer_duration_us", "nv_inference_request_failure"} <= used
    assert len({p["id"] for p in board["panels"]}) == len(board["panels"]) and board["schemaVersion"] >= 36


def test_sidecar_management_apis_need_the_admin_key_from_a_secret(deployed):
    """The sidecar binds 0.0.0.0 in-cluster: its management APIs are restricted (tritonserver's flags) to the key of
    a generated Secret, which generating again keeps."""
    from scheduler.server.common.restricted import RestrictedApis

    deploy, manifest = deployed
    d = write_k8s(manifest, deploy, K8sOptions(namespace="vision"))
    docs = load_dir(d)
    validate_all(docs)
    secret = by_kind(docs, "Secret")["poolpipe-admin-key"]
    key = secret["stringData"]["admin-key"]
    assert len(key) == 32 and (d / "admin-secret.yaml").stat().st_mode & 0o077 == 0
    c = by_kind(docs, "Deployment")["poolpipe-sidecar"]["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in c["env"]}
    assert env["POOLPIPE_ADMIN_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "poolpipe-admin-key", "key": "admin-key"}
    for flag in ("--grpc-restricted-protocol", "--http-restricted-api"):
        spec = c["args"][c["args"].index(flag) + 1].replace("$(POOLPIPE_ADMIN_KEY)", key)
        rules = RestrictedApis.parse([spec], flag, grpc_prefix=flag.startswith("--grpc")).rules
        assert {"shared-memory", "model-repository", "poolpipe-admin", "logging", "trace"} <= set(rules)
        assert "inference" not in rules and "health" not in rules  # clients and probes need no key
    again = load_dir(write_k8s(manifest, deploy, K8sOptions(namespace="vision")))
    assert by_kind(again, "Secret")["poolpipe-admin-key"]["stringData"]["admin-key"] == key
