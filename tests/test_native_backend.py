"""The native emulated backend (backends/native): the Python backend's device without its stub. It holds each batch
for its profiled latency, returns the same outputs (checksums included) in every datatype, refuses bad parameters
at load, serves the next request after a bad one, and generate falls back to the Python backend where it cannot
be built."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException, triton_to_np_dtype

from backends import native
from backends.partition.emulated import emulated_outputs, latency_at
from model_repository_gen import triton_config as tc
from model_repository_gen.generate import generate
from poolpipe_common.errors import InputError
from poolpipe_common.tensors import TensorSpec
from runtime.tritonserver import TritonProcess
from tests.conftest import run_cli
from tests.deploy_helpers import write_cluster
from tests.test_emulated import MODEL, SCALE, _cpu_seconds, emulated_hosts, ppipe_plan

pytestmark = pytest.mark.skipif(native.library() is None, reason="no C compiler here: the Python backend serves")

TABLE = ((1, 30_000.0), (2, 45_000.0), (4, 75_000.0))  # µs; batch 3 interpolates to 60 ms
DTYPES = ("FP16", "FP32", "FP64", "INT8", "INT64", "UINT8", "BOOL")
# a second input wider than the digest's head (64 KiB per row): only the head enters the checksum
INPUTS = [TensorSpec("x", "FP32", (16,)), TensorSpec("z", "UINT8", (70_000,))]


def _emulated(stage: int = 3, cv: float = 0.0, quantiles: tuple | None = None, table: tuple = TABLE
              ) -> tc.BackendSettings:
    return tc.BackendSettings(emulated=tc.EmulatedSettings(table, stage, cv, quantiles, backend=native.BACKEND))


def _write(repo: Path) -> list[str]:
    """One model per output datatype, plus two with noise / a latency distribution and one with a bad table."""
    names = []
    for dt in DTYPES:
        names.append(f"emu_{dt.lower()}")
        outs = [TensorSpec("y", dt, (8,)), TensorSpec("w", "FP32", (3,))]
        tc.write_model(repo, tc.partition_config(names[-1], INPUTS, outs, 4, settings=_emulated()))
    one = [TensorSpec("y", "FP32", (4,))]
    noisy = tc.partition_config("noisy", INPUTS[:1], one, 4, settings=_emulated(0, 0.5, table=((1, 3000.0),)))
    noisy.parameters["emulated_seed"].string_value = "11"
    tc.write_model(repo, noisy)
    spread = _emulated(0, quantiles=((0.0, 1.0), ((1, (1000.0, 5000.0)),)), table=((1, 3000.0),))
    tc.write_model(repo, tc.partition_config("spread", INPUTS[:1], one, 4, settings=spread))
    bad = tc.partition_config("bad", INPUTS[:1], one, 4, settings=_emulated())
    bad.parameters["emulated_latency_us"].string_value = '{"1": "fast"}'
    tc.write_model(repo, bad)
    return names + ["noisy", "spread"]


def _infer(client: grpcclient.InferenceServerClient, model: str, xs: list[np.ndarray], outputs: tuple[str, ...]
           ) -> grpcclient.InferResult:
    inputs = []
    for spec, x in zip(INPUTS, xs):
        inputs.append(grpcclient.InferInput(spec.name, list(x.shape), spec.datatype))
        inputs[-1].set_data_from_numpy(x)
    return client.infer(model, inputs, outputs=[grpcclient.InferRequestedOutput(n) for n in outputs])


def _held_us(res: grpcclient.InferResult) -> float:
    return (res.as_numpy(tc.COMPUTE_END_OUTPUT)[0, 0] - res.as_numpy(tc.COMPUTE_START_OUTPUT)[0, 0]) / 1e3


@pytest.mark.triton
def test_native_backend_holds_batches_and_returns_the_python_devices_outputs(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    models = _write(repo)
    version = repo / "emu_fp32" / "1"
    assert sorted(p.name for p in version.iterdir()) == [native.LIBRARY]  # no model.py, no ONNX
    assert tc.parse_config(repo / "emu_fp32" / "config.pbtxt").backend == native.BACKEND
    server = TritonProcess(repo, log_path=tmp_path / "triton.log", name="native",
                           extra_args=("--model-control-mode=explicit", *(f"--load-model={m}" for m in models)))
    rng = np.random.default_rng(0)
    with server, grpcclient.InferenceServerClient(server.grpc_url) as client:
        with pytest.raises(InferenceServerException, match="model bad: emulated_latency_us: batch 1"):
            client.load_model("bad")  # a clear load error; the server keeps serving
        cpu0, late_us, held_s = _cpu_seconds(server.proc.pid), [], 0.0
        for i, batch in enumerate((1, 2, 3, 4, 1, 3, 2)):
            dt = DTYPES[i % len(DTYPES)]
            xs = [rng.standard_normal((batch, 16)).astype(np.float32),
                  rng.integers(0, 256, (batch, 70_000)).astype(np.uint8)]
            res = _infer(client, f"emu_{dt.lower()}", xs, ("y", "w", *tc.TIMING_OUTPUTS))
            want_us = latency_at(dict(TABLE), batch)
            assert _held_us(res) >= want_us  # never early
            late_us.append(_held_us(res) - want_us)
            held_s += _held_us(res) / 1e6
            want = emulated_outputs(xs, 3, [(np.dtype(triton_to_np_dtype(dt)), (8,)), (np.float32, (3,))])
            np.testing.assert_array_equal(res.as_numpy("y"), want[0])
            np.testing.assert_array_equal(res.as_numpy("w"), want[1])
            assert res.as_numpy(tc.COMPUTE_START_OUTPUT).shape == (batch, 1)
        cpu = _cpu_seconds(server.proc.pid) - cpu0
        assert np.median(late_us) < 10_000 and max(late_us) < 100_000, late_us
        assert cpu < 0.2 * held_s, (cpu, held_s)  # asleep while it holds
        only = _infer(client, "emu_int8", xs, ("y",))  # only what was asked for comes back
        assert [o.name for o in only.get_response().outputs] == ["y"]
        with pytest.raises(InferenceServerException, match="z"):
            _infer(client, "emu_int8", xs[:1], ("y",))  # a missing input: an error for this request only
        assert _infer(client, "emu_int8", xs, ("y",)).as_numpy("y").shape == (2, 8)
        stats = client.get_inference_statistics("emu_fp32").model_stats[0]
        assert stats.inference_stats.success.count >= 1 and stats.execution_count >= 1  # Triton's own statistics
        one = [xs[0][:1]]  # batch 1
        noisy = np.array([_held_us(_infer(client, "noisy", one, tc.TIMING_OUTPUTS)) for _ in range(40)])
        assert 0.25 < noisy.std() / noisy.mean() < 0.8, noisy  # cv 0.5 lognormal noise around 3 ms
        spread = np.array([_held_us(_infer(client, "spread", one, tc.TIMING_OUTPUTS)) for _ in range(40)])
        assert spread.min() >= 1000 and spread.max() < 5000 + 10_000 and 2000 < np.median(spread) < 4000, spread
        assert server.proc.poll() is None


def test_generate_falls_back_to_the_python_backend_with_one_log_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(native.BuildError, match="cannot run the C compiler"):
        native.build(tmp_path / "b", cc=str(tmp_path / "no-cc"))
    assert tc.emulated_backend("auto") == native.BACKEND  # built here
    monkeypatch.setenv("CC", str(tmp_path / "no-cc"))
    monkeypatch.setattr(native, "_build_root", lambda lib: tmp_path / "fresh")
    native.library.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="poolpipe.native"):
            assert tc.emulated_backend("auto") == "python" and tc.emulated_backend("python") == "python"
            with pytest.raises(InputError, match="--emulated-backend native: the poolpipe_emulated backend could "
                                                 "not be built"):
                tc.emulated_backend("native")
        lines = [r.getMessage() for r in caplog.records]
        assert len(lines) == 1 and "native emulated backend not built" in lines[0] and "Python backend" in lines[0]
        cfg = tc.partition_config("m", INPUTS[:1], INPUTS[:1], 2, settings=_emulated())
        with pytest.raises(InputError, match="could not be built here"):
            tc.write_model(tmp_path / "repo", cfg)
    finally:
        native.library.cache_clear()
    with pytest.raises(InputError, match="expected auto, native or python"):
        tc.emulated_backend("fast")
    with pytest.raises(ValueError, match="emulated backend 'onnx'"):
        tc.EmulatedSettings(TABLE, 0, backend="onnx")


def test_generate_chooses_the_emulated_backend(tmp_path: Path) -> None:
    cluster = write_cluster(tmp_path / "cluster.json", emulated_hosts())
    for choice, backend, files in (("auto", native.BACKEND, [native.LIBRARY]),
                                   ("python", "python", ["emulated.py", "engine_trt.py", "engines.py", "model.py"])):
        manifest = generate(ppipe_plan(), {}, cluster, tmp_path / choice, emulated_tensor_scale=SCALE,
                            emulated_backend=choice)
        configs = sorted((tmp_path / choice).glob("*/*/model_repository/*/config.pbtxt"))
        assert len(configs) == sum(len(s.vgpus) for p in manifest.model(MODEL).pipelines for s in p.stages)
        for path in configs:
            assert tc.parse_config(path).backend == backend
            assert sorted(p.name for p in (path.parent / "1").iterdir()) == files
    r = run_cli("generate", "--plan", tmp_path / "none.json", "--cluster", cluster, "--out", tmp_path / "x",
                "--emulated-backend", "fast")
    assert r.returncode == 2 and "--emulated-backend: invalid choice: 'fast'" in r.stderr, r.stderr
