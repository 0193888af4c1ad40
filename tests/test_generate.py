"""``poolpipe generate``: vGPU assignment, repositories, config.pbtxt, launch files, manifest, and bad inputs."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from tritonclient.grpc import model_config_pb2 as mc

from model_repository_gen.cluster_file import cluster_from_dict, load_cluster
from model_repository_gen.generate import assign_vgpus, generate, gpus_needed
from model_repository_gen.manifest import load_manifest
from model_repository_gen.triton_config import TIMING_OUTPUTS, parse_config
from plans.plan_json import plan_from_dict
from poolpipe_common.errors import InputError
from profiling.profile import Profile
from profiling.zoo import build_zoo_model
from runtime.launch import GpuInfo, check_host_hardware, gpu_matches, load_host_launch
from tests.conftest import run_cli
from tests.deploy_helpers import make_plan, make_profile, write_cluster

# pipeline 0: block 0 on a whole T4, blocks 1-2 on two L4 half-GPUs; pipeline 1: the whole model on an L4 half
PIPELINES = [[((0, 1), "T4", 1, 1), ((1, 3), "L4", 2, 2)], [((0, 3), "L4", 2, 1)]]


@pytest.fixture(scope="module")
def resnet(tmp_path_factory) -> tuple[Path, Profile]:
    d = tmp_path_factory.mktemp("resnet")
    path = build_zoo_model("resnet", d / "resnet.onnx")
    return path, make_profile(path, "resnet", 3, {"L4": (1, 2), "T4": (1,)})


def cpu_hosts(l4: int = 2, t4: int = 1) -> list[dict]:
    return [{"name": "l4box", "address": "127.0.0.1", "gpu_type": "L4", "gpus": l4, "bandwidth_gbps": 10,
             "device": "cpu", "cpu_cores": 2, "base_port": 0},
            {"name": "t4box", "address": "127.0.0.1", "gpu_type": "T4", "gpus": t4, "bandwidth_gbps": 10,
             "device": "cpu", "cpu_cores": 2, "base_port": 0}]


def test_generate_writes_repositories_configs_launch_files_and_manifest(resnet, tmp_path):
    onnx_path, prof = resnet
    plan = make_plan(prof, PIPELINES)
    assert gpus_needed(plan) == {"T4": 1, "L4": 2}
    out = tmp_path / "deploy"
    manifest = generate(plan, {"resnet": onnx_path}, cluster_from_dict({"hosts": cpu_hosts()}), out)

    loaded = load_manifest(out)
    assert loaded.to_dict() == manifest.to_dict()
    assert sorted(g.id for g in loaded.vgpus) == ["l4box-gpu0-s0", "l4box-gpu0-s1", "l4box-gpu1-s0", "t4box-gpu0-s0"]
    model = loaded.model("resnet")
    assert model.max_batch_size == 2 and [t.name for t in model.inputs] == ["input"]
    p0, p1 = model.pipelines
    assert [s.blocks for s in p0.stages] == [(0, 1), (1, 3)] and [s.blocks for s in p1.stages] == [(0, 3)]
    assert p0.stages[0].vgpus == ("t4box-gpu0-s0",) and len(p0.stages[1].vgpus) == 2
    assert p0.stages[0].outputs == p0.stages[1].inputs  # the boundary tensor, same name, shape, dtype
    assert p0.stages[0].outputs[0].name == prof.blocks[0].output_tensors[0]
    assert p0.stages[0].latency_us == {b: prof.latency_us("T4", 1, b, 0, 1) for b in (1, 2, 4)}
    all_ports = [g.grpc_url for g in loaded.vgpus] + [g.http_url for g in loaded.vgpus]
    assert len(set(all_ports)) == len(all_ports)

    configs = sorted(out.glob("*/*/model_repository/*/config.pbtxt"))
    assert len(configs) == 4
    for path in configs:
        cfg = parse_config(path)
        assert cfg.backend == "python" and cfg.max_batch_size == 2
        assert not cfg.HasField("dynamic_batching")
        (group,) = cfg.instance_group
        assert group.count == 1 and group.kind == mc.ModelInstanceGroup.KIND_CPU
        assert [o.name for o in cfg.output][-2:] == list(TIMING_OUTPUTS)
        assert sorted(w.batch_size for w in cfg.model_warmup) == [1, 2]  # Triton warms batch 1 and the max up
        assert set(cfg.model_warmup[0].inputs) == {i.name for i in cfg.input}
        assert (path.parent / "1" / "model.py").is_file() and (path.parent / "1" / "model.onnx").is_file()
        # 3 vGPUs share l4box's 2 cores: one engine thread each; t4box's only vGPU gets both
        threads = cfg.parameters["intra_op_threads"].string_value
        assert threads == ("2" if "t4box" in str(path) else "1")

    launch = load_host_launch(out, "l4box")
    assert launch.device == "cpu" and not launch.needs_mps and len(launch.servers) == 3
    assert all(s.env["CUDA_VISIBLE_DEVICES"] == "" for s in launch.servers)
    assert (out / "l4box" / "launch.sh").read_text().count("--model-repository=") == 3

    # generating again into the same directory replaces the earlier output
    generate(plan, {"resnet": onnx_path}, cluster_from_dict({"hosts": cpu_hosts()}), out)
    assert len(list(out.glob("*/*/model_repository/*/config.pbtxt"))) == 4


def test_gpu_hosts_get_kind_gpu_visible_devices_and_mps_percentage(resnet, tmp_path):
    onnx_path, prof = resnet
    hosts = [{"name": "g", "address": "10.0.0.1", "gpu_type": "L4", "gpus": 2, "bandwidth_gbps": 10},
             {"name": "h", "address": "10.0.0.2", "gpu_type": "T4", "gpus": 1, "bandwidth_gbps": 10}]
    manifest = generate(make_plan(prof, PIPELINES), {"resnet": onnx_path}, cluster_from_dict({"hosts": hosts}),
                        tmp_path / "d", fp16_boundaries=True)
    g = manifest.vgpu("g-gpu1-s0")
    # CUDA numbers devices as NVML does (launch checks NVML's index 1): PCI bus order, not fastest first
    assert g.kind == "KIND_GPU" and g.env == {"CUDA_VISIBLE_DEVICES": "1", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50",
                                              "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=1 " in (tmp_path / "d" / "g" / "launch.sh").read_text()
    assert g.grpc_url == "10.0.0.1:8007" and g.http_url == "10.0.0.1:8006"  # base 8000, the host's 3rd vGPU
    cfg = parse_config(tmp_path / "d" / "g" / "g-gpu1-s0" / "model_repository" / g_model(manifest, g.id) /
                       "config.pbtxt")
    assert cfg.instance_group[0].kind == mc.ModelInstanceGroup.KIND_GPU and list(cfg.instance_group[0].gpus) == [0]
    assert cfg.parameters["mps_thread_percentage"].string_value == "50"
    assert load_host_launch(tmp_path / "d", "g").needs_mps and not load_host_launch(tmp_path / "d", "h").needs_mps
    stage0 = manifest.model("resnet").pipelines[0].stages[0]
    assert stage0.outputs[0].datatype == "FP16" and stage0.inputs[0].datatype == "FP32"

    launch = load_host_launch(tmp_path / "d", "g")
    l4 = [GpuInfo(0, "NVIDIA L4", 24 << 30), GpuInfo(1, "NVIDIA L4", 24 << 30)]
    check_host_hardware(launch, l4, mps=True)
    with pytest.raises(InputError, match="needs the MPS daemon"):
        check_host_hardware(launch, l4, mps=False)
    with pytest.raises(InputError, match="2 x L4.*1 matching"):
        check_host_hardware(launch, l4[:1], mps=True)
    with pytest.raises(InputError, match=r"GPU 0 is Tesla T4 \(type T4\), not L4"):
        check_host_hardware(launch, [GpuInfo(0, "Tesla T4", 1), *l4], mps=True)
    assert gpu_matches("V100", "Tesla V100-SXM2-16GB") and not gpu_matches("T4", "NVIDIA RTX A4000")

    # launching the GPU host where its GPUs are not (no pynvml, no driver, or other GPUs): refused, one line, and
    # what a dead launch left stays for a launch that runs (the refused one reclaims nothing)
    dead = subprocess.Popen(["true"])
    dead.wait()
    state = tmp_path / "cache" / "launch" / f"{dead.pid}.json"
    state.parent.mkdir(parents=True)
    state.write_text(json.dumps({"pid": dead.pid, "kind": "launch", "directory": str(tmp_path), "servers": {}}))
    r = run_cli("launch", tmp_path / "d", "--host", "g", env={"POOLPIPE_CACHE": str(tmp_path / "cache")})
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert any(s in r.stderr for s in ("pynvml is not installed", "no NVIDIA driver", "host g:")), r.stderr
    assert state.exists()


def g_model(manifest, vgpu_id: str) -> str:
    return next(s.triton_model for m in manifest.models for p in m.pipelines for s in p.stages if vgpu_id in s.vgpus)


def test_vgpus_of_one_level_share_gpus_and_levels_do_not_mix(resnet):
    _, prof = resnet
    plan = make_plan(prof, [[((0, 1), "L4", 2, 3), ((1, 3), "L4", 1, 1)]])
    assert gpus_needed(plan) == {"L4": 3}
    cluster = cluster_from_dict({"hosts": [{"name": "a", "address": "x", "gpu_type": "L4", "gpus": 2,
                                            "bandwidth_gbps": 1},
                                           {"name": "b", "address": "y", "gpu_type": "L4", "gpus": 1,
                                            "bandwidth_gbps": 1}]})
    a = assign_vgpus(plan, cluster)
    assert [s.id for s in a[("resnet", 0, 1)]] == ["a-gpu0-s0"]
    assert [s.id for s in a[("resnet", 0, 0)]] == ["a-gpu1-s0", "a-gpu1-s1", "b-gpu0-s0"]


def _plan_files(tmp_path: Path, onnx_path: Path, prof: Profile, pipelines=PIPELINES) -> tuple[Path, Path]:
    plan = tmp_path / "plan.json"
    make_plan(prof, pipelines).save(plan)
    cluster = write_cluster(tmp_path / "cluster.json", cpu_hosts())
    return plan, cluster


def test_generate_cli_writes_a_deployment(resnet, tmp_path):
    onnx_path, prof = resnet
    plan, cluster = _plan_files(tmp_path, onnx_path, prof)
    r = run_cli("generate", "--plan", plan, "--onnx", f"resnet={onnx_path}", "--cluster", cluster,
                "--out", tmp_path / "out")
    assert r.returncode == 0, r.stderr
    assert "4 vGPU server(s)" in r.stdout and (tmp_path / "out" / "manifest.json").is_file()


@pytest.mark.parametrize("case", ["short_gpus", "missing_type", "more_blocks", "unreadable_onnx", "bad_cluster",
                                  "no_onnx"])
def test_generate_bad_inputs_give_one_line_errors(resnet, tmp_path, case):
    onnx_path, prof = resnet
    plan, cluster = _plan_files(tmp_path, onnx_path, prof)
    onnx_arg = f"resnet={onnx_path}"
    expect = {
        "short_gpus": "the plan needs 2 L4 GPU(s) but the cluster file has 1",
        "missing_type": "the plan needs 1 T4 GPU(s) but the cluster file has 0",
        "more_blocks": "does not have",
        "unreadable_onnx": "not a readable ONNX model",
        "bad_cluster": "hosts[0].gpus: expected a whole number >= 1",
        "no_onnx": "no ONNX file for plan model(s) resnet",
    }[case]
    if case == "short_gpus":
        write_cluster(cluster, cpu_hosts(l4=1))
    elif case == "missing_type":
        write_cluster(cluster, cpu_hosts()[:1])
    elif case == "more_blocks":
        # the plan's profile has a 4th block the ONNX file does not have
        d = json.loads(plan.read_text())
        p = d["models"][0]["profile"]
        last = p["blocks"][-1]
        p["blocks"][-1] = {"name": "block2", "output_bytes": 1000, "output_tensors": ["/stage9/block9/relu_output_0"]}
        p["blocks"].append(last)
        for dev in p["devices"].values():
            for t in dev.values():
                t["latency_us"].append(t["latency_us"][-1])
        d["models"][0]["pipelines"][0]["partitions"][1]["blocks"] = [1, 3]
        d["models"][0]["pipelines"][0]["partitions"].append({**d["models"][0]["pipelines"][0]["partitions"][1],
                                                            "blocks": [3, 4]})
        d["models"][0]["pipelines"][1]["partitions"][0]["blocks"] = [0, 4]
        plan_from_dict(d)  # the plan itself is valid
        plan.write_text(json.dumps(d))
    elif case == "unreadable_onnx":
        bad = tmp_path / "bad.onnx"
        bad.write_bytes(b"\x00not an onnx file at all" * 10)
        onnx_arg = f"resnet={bad}"
    elif case == "bad_cluster":
        hosts = cpu_hosts()
        hosts[0]["gpus"] = 0
        write_cluster(cluster, hosts)
    elif case == "no_onnx":
        onnx_arg = f"mobilenet={onnx_path}"
    r = run_cli("generate", "--plan", plan, "--onnx", onnx_arg, "--cluster", cluster, "--out", tmp_path / "out")
    assert r.returncode == 2, r.stderr
    assert expect in r.stderr and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_cluster_file_validation(tmp_path):
    ok = {"hosts": [{"name": "a", "address": "h", "gpu_type": "cpu", "gpus": 1, "bandwidth_gbps": 1}]}
    assert cluster_from_dict(ok).hosts[0].on_cpu
    (tmp_path / "c.yaml").write_text("hosts:\n  - {name: a, address: h, gpu_type: T4, gpus: 2, bandwidth_gbps: 5}\n")
    assert load_cluster(tmp_path / "c.yaml").gpus_of_type() == {"T4": 2}
    bad = [({"hosts": []}, "non-empty list"),
           ({"hosts": [{**ok["hosts"][0], "name": "a/b"}]}, "hosts[0].name"),
           ({"hosts": [ok["hosts"][0], ok["hosts"][0]]}, "appear more than once"),
           ({"hosts": [{**ok["hosts"][0], "device": "gpu"}]}, "cannot have device 'gpu'"),
           ({"hosts": [{**ok["hosts"][0], "base_port": 80}]}, "base_port"),
           ({"hosts": [{**ok["hosts"][0], "gpu": 1}]}, "unknown field 'gpu' (did you mean 'gpus'?)"),
           ({"hosts": [{**ok["hosts"][0], "emulate_slowdown": 0.5}]}, "emulate_slowdown: expected a number >= 1"),
           ({"hosts": [{**ok["hosts"][0], "gpu_type": "T4", "emulate_slowdown": 2}]}, "only CPU hosts")]
    for d, msg in bad:
        with pytest.raises(InputError, match=re.escape(msg)):
            cluster_from_dict(d)


def test_hosts_that_collide_on_ports_are_refused(resnet, tmp_path):
    onnx_path, prof = resnet
    plan, _ = _plan_files(tmp_path, onnx_path, prof)
    hosts = cpu_hosts()  # l4box: 3 vGPUs (ports base..base+8), t4box: 1 vGPU, both at 127.0.0.1
    for h in hosts:
        del h["base_port"]  # both on the default base port 8000
    cluster = write_cluster(tmp_path / "cluster.json", hosts)
    r = run_cli("generate", "--plan", plan, "--onnx", f"resnet={onnx_path}", "--cluster", cluster,
                "--out", tmp_path / "out")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "hosts l4box and t4box collide on ports 8000..8002 at 127.0.0.1" in r.stderr
    assert not (tmp_path / "out").exists()
    overlapping = [{**hosts[0], "base_port": 8000}, {**hosts[1], "base_port": 8006, "address": "localhost"}]
    with pytest.raises(InputError, match=r"hosts l4box and t4box collide on ports 8006\.\.8008"):
        generate(make_plan(prof, PIPELINES), {"resnet": onnx_path}, cluster_from_dict({"hosts": overlapping}),
                 tmp_path / "out")
    apart = [{**hosts[0], "base_port": 8000}, {**hosts[1], "base_port": 8009}]
    ok = generate(make_plan(prof, PIPELINES), {"resnet": onnx_path}, cluster_from_dict({"hosts": apart}),
                  tmp_path / "out")
    assert sorted(g.grpc_url for g in ok.vgpus) == [f"127.0.0.1:{p}" for p in (8001, 8004, 8007, 8010)]
