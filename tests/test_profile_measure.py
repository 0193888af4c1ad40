"""``poolpipe profile measure`` and ``profile merge`` end to end on a zoo model, and their errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from model_repository_gen.cut import FP32_ATOL, cut_partition, partition_io
from profiling.profile import load_profile
from profiling.zoo import build_zoo_model
from tests.conftest import run_cli

MEASURE = ("--batch-sizes", "1,2", "--repeats", "3", "--warmup", "1")


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> dict[str, Path]:
    """mobilenet measured as two device labels (the second via --like, with V=1,2 workers and the latency
    distribution over the runs) and merged."""
    d = tmp_path_factory.mktemp("measure")
    model = build_zoo_model("mobilenet", d / "mobilenet.onnx")
    a, b, merged = d / "a.json", d / "b.json", d / "merged.json"
    r = run_cli("profile", "measure", model, "--blocks", "3", "--threads", "1", "--label", "cpu-1t", *MEASURE,
                "--out", a)
    assert r.returncode == 0, r.stderr
    assert "3 blocks on cpu-1t" in r.stdout
    r = run_cli("profile", "measure", model, "--like", a, "--threads", "2", "--label", "cpu-2t",
                "--vgpu-levels", "1,2", "--latency-quantiles", "3", *MEASURE, "--out", b)
    assert r.returncode == 0, r.stderr
    r = run_cli("profile", "merge", a, b, "--out", merged)
    assert r.returncode == 0, r.stderr
    return {"model": model, "a": a, "b": b, "merged": merged, "dir": d}


def test_measure_fills_blocks_tensors_bytes_and_provenance(measured):
    p = load_profile(measured["a"])
    assert p.model == "mobilenet" and p.num_blocks == 3 and p.devices == ["cpu-1t"]
    assert p.input_tensors == ("input",) and p.input_bytes == 3 * 192 * 192 * 4
    assert p.blocks[-1].output_tensors == ("logits",) and p.blocks[-1].output_bytes == 10 * 4
    t = p.timings["cpu-1t"][1]
    assert t.batch_sizes == (1, 2) and t.latency_us.shape == (3, 2) and np.all(t.latency_us > 0)
    for key in ("host", "cpu_model", "threads", "onnxruntime", "date", "repeats", "method", "model_sha256"):
        assert key in p.provenance, key
    assert p.provenance["threads"] == 1 and p.provenance["repeats"] == 3
    # the Contract: the engine and the execution providers that ran the timed blocks, per device label too
    assert p.provenance["engine"] == "ort" and p.provenance["providers"] == ["CPUExecutionProvider"]
    assert p.provenance["devices"]["cpu-1t"]["providers"] == ["CPUExecutionProvider"]
    # each boundary's bytes are those of the tensor the cut partitions exchange
    for i, blk in enumerate(p.blocks[:-1]):
        _, outs = partition_io(cut_partition(measured["model"], p, i, i + 1))
        assert [o.name for o in outs] == list(blk.output_tensors)
        assert blk.output_bytes == sum(o.bytes_per_request() for o in outs)


def test_like_keeps_blocks_and_vgpu_levels_are_measured(measured):
    a, b = load_profile(measured["a"]), load_profile(measured["b"])
    assert [x.output_tensors for x in b.blocks] == [x.output_tensors for x in a.blocks]
    assert [x.output_bytes for x in b.blocks] == [x.output_bytes for x in a.blocks]
    assert b.levels("cpu-2t") == [1, 2]
    assert np.all(b.timings["cpu-2t"][2].latency_us > 0)
    assert b.provenance["blocks_from"] == str(measured["a"])
    assert b.provenance["providers"] == ["CPUExecutionProvider"]  # reported by the V=2 worker processes too
    merged = load_profile(measured["merged"]).provenance["devices"]
    assert {d: (merged[d]["engine"], merged[d]["providers"]) for d in merged} == {
        "cpu-1t": ("ort", ["CPUExecutionProvider"]), "cpu-2t": ("ort", ["CPUExecutionProvider"])}
    assert b.model == a.model == "mobilenet"


def test_latency_quantiles_are_recorded_over_the_runs_and_kept_by_merge(measured):
    a, b, m = (load_profile(measured[k]) for k in ("a", "b", "merged"))
    assert a.timings["cpu-1t"][1].quantiles is None  # not asked for: the median only
    for v in (1, 2):
        t = b.timings["cpu-2t"][v]
        q = t.quantiles.latency_us  # blocks x batch sizes x levels (min, median, max of the runs)
        assert t.quantiles.levels == (0.0, 0.5, 1.0) and q.shape == (3, 2, 3)
        assert np.all(np.diff(q, axis=2) >= 0) and np.all(q > 0)
        assert np.all(q[:, :, 0] <= t.latency_us) and np.all(t.latency_us <= q[:, :, 2])
    # one worker: its median is the median (each stored rounded to 0.01 µs on its own)
    np.testing.assert_allclose(b.timings["cpu-2t"][1].quantiles.latency_us[:, :, 1],
                               b.timings["cpu-2t"][1].latency_us, rtol=0, atol=0.0101)
    assert m.latency_quantiles_us("cpu-2t", 2, 2) == b.latency_quantiles_us("cpu-2t", 2, 2)


def test_merge_joins_device_types_and_partitions_still_chain(measured):
    m = load_profile(measured["merged"])
    assert m.devices == ["cpu-1t", "cpu-2t"] and m.levels("cpu-2t") == [1, 2]
    assert set(m.provenance["devices"]) == {"cpu-1t", "cpu-2t"}
    assert m.latency_us("cpu-1t", 1, 2) == load_profile(measured["a"]).latency_us("cpu-1t", 1, 2)
    x = np.random.RandomState(3).randn(2, 3, 192, 192).astype(np.float32)
    ref = ort.InferenceSession(str(measured["model"])).run(None, {"input": x})[0]
    feeds = {"input": x}
    for i in range(m.num_blocks):
        s = ort.InferenceSession(cut_partition(measured["model"], m, i, i + 1).SerializeToString())
        feeds = dict(zip([o.name for o in s.get_outputs()], s.run(None, feeds)))
    assert np.max(np.abs(feeds["logits"] - ref)) <= FP32_ATOL


def _fails(r, *fragments: str) -> None:
    """Exit 2 with exactly one line on stderr that contains every fragment, and no traceback."""
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    for f in fragments:
        assert f in lines[0], (f, lines[0])


def test_measure_and_merge_errors_exit_2_with_one_line(measured):
    d, model = measured["dir"], measured["model"]
    out = d / "err.json"
    corrupt = d / "corrupt.onnx"
    corrupt.write_bytes(b"\x08\x07garbage that is not protobuf")
    _fails(run_cli("profile", "measure", corrupt, "--blocks", "2", "--out", out), str(corrupt), "not a valid ONNX")
    _fails(run_cli("profile", "measure", d / "nope.onnx", "--blocks", "2", "--out", out), "nope.onnx")
    resnet = build_zoo_model("resnet", d / "resnet.onnx")
    _fails(run_cli("profile", "measure", resnet, "--like", measured["a"], "--out", out),
           "--like", "is not in the model")
    _fails(run_cli("profile", "measure", model, "--device", "cuda", "--blocks", "2", "--out", out),
           "--device cuda needs an NVIDIA GPU")
    _fails(run_cli("profile", "measure", model, "--engine", "trt", "--blocks", "2", "--out", out), "--engine trt")
    _fails(run_cli("profile", "measure", model, "--vgpu-levels", "4", "--threads", "2", "--blocks", "2",
                   "--out", out), "--threads >= 4")
    _fails(run_cli("profile", "measure", model, "--batch-sizes", "1,x", "--blocks", "2", "--out", out),
           "--batch-sizes")
    _fails(run_cli("profile", "measure", model, "--blocks", "999", "--out", out), "cannot make 999 blocks")
    _fails(run_cli("profile", "measure", model, "--blocks", "2", "--repeats", "3", "--latency-quantiles", "5",
                   "--out", out), "--latency-quantiles 5", "2..--repeats")
    assert not out.exists()
    # merge: a profile with other blocks, and a device type present twice
    two = d / "two.json"
    assert run_cli("profile", "measure", model, "--blocks", "2", "--threads", "1", "--label", "other",
                   "--batch-sizes", "1", "--repeats", "1", "--warmup", "0", "--out", two).returncode == 0
    _fails(run_cli("profile", "merge", measured["a"], two, "--out", out), str(two), "3 blocks vs 2 blocks")
    doc = json.loads(measured["b"].read_text())
    doc["blocks"][1]["output_tensors"] = ["/some/other_output_0"]
    shifted = d / "shifted.json"
    shifted.write_text(json.dumps(doc))
    _fails(run_cli("profile", "merge", measured["a"], shifted, "--out", out), "blocks[1].output_tensors")
    _fails(run_cli("profile", "merge", measured["a"], measured["merged"], "--out", out), "'cpu-1t'", "--label")
    assert not out.exists()


def test_emulated_slowdown_scales_the_measured_device_class(measured, tmp_path):
    """--emulate-slowdown K records K x the engine time (the backend stays busy as long when serving)."""
    slow = tmp_path / "slow.json"
    r = run_cli("profile", "measure", measured["model"], "--like", measured["a"], "--threads", "1", "--label",
                "cpu-slow", "--emulate-slowdown", "50", *MEASURE, "--out", slow)
    assert r.returncode == 0, r.stderr
    fast, prof = load_profile(measured["a"]), load_profile(slow)
    assert prof.provenance["emulate_slowdown"] == 50.0
    assert prof.latency_us("cpu-slow", 1, 1) > 10 * fast.latency_us("cpu-1t", 1, 1)  # 50x, minus timing noise
    r = run_cli("profile", "measure", measured["model"], "--like", measured["a"], "--emulate-slowdown", "0.5",
                "--out", tmp_path / "x.json")
    assert r.returncode == 2 and "--emulate-slowdown" in r.stderr and "Traceback" not in r.stderr
