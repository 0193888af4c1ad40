"""The interference model (fit, validation) and ``profile measure --co-run`` on two real zoo ONNX models."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from poolpipe_common.errors import InputError
from profiling.interference import (
    CoRunSample,
    InterferenceModel,
    fit_interference,
    interference_from_dict,
)
from profiling.profile import load_profile, profile_from_dict
from profiling.zoo import build_zoo_model
from tests.conftest import run_cli


def _samples(model: InterferenceModel, rng: np.random.Generator, n: int = 40, noise: float = 0.0):
    out = []
    for _ in range(n):
        p = float(rng.uniform(0, 1))
        co = tuple((float(rng.choice([0.25, 0.5, 1.0])), float(rng.uniform(0, 1)))
                   for _ in range(int(rng.integers(1, 4))))
        out.append(CoRunSample(p, co, model.slowdown(p, co) * (1 + noise * float(rng.normal()))))
    return out


@settings(max_examples=30, deadline=None)
@given(st.floats(0, 0.2), st.floats(0, 0.5), st.floats(0, 0.5), st.integers(0, 10_000))
def test_fit_recovers_known_coefficients(a, b, c, seed):
    truth = InterferenceModel(a, b, c)
    fit = fit_interference(_samples(truth, np.random.default_rng(seed)))
    assert fit.per_corunner == pytest.approx(a, abs=1e-6)
    assert fit.per_pressure == pytest.approx(b, abs=1e-6)
    assert fit.sensitivity == pytest.approx(c, abs=1e-6)
    assert fit.rmse < 1e-6 and fit.points == 40


def test_fit_with_noise_stays_close_and_never_negative():
    truth = InterferenceModel(0.05, 0.3, 0.1)
    fit = fit_interference(_samples(truth, np.random.default_rng(1), n=400, noise=0.01))
    assert fit.per_corunner == pytest.approx(0.05, abs=0.02)
    assert fit.per_pressure == pytest.approx(0.3, abs=0.05)
    # slowdowns below 1 (co-running made it faster) give zero coefficients, never negative ones
    flat = fit_interference([CoRunSample(0.5, ((1.0, 0.5),), 0.9)] * 3)
    assert (flat.per_corunner, flat.per_pressure, flat.sensitivity) == (0.0, 0.0, 0.0)


def test_relative_slowdown_is_one_for_the_profiled_co_runners_and_grows_with_pressure():
    m = InterferenceModel(0.02, 0.4, 0.1)
    assert m.relative_slowdown(0.3, 4, [(1.0, 0.3)] * 3) == pytest.approx(1.0)
    assert m.relative_slowdown(0.1, 4, [(1.0, 0.9)] * 3) > m.relative_slowdown(0.1, 4, [(1.0, 0.5)] * 3) > 1.0
    assert m.relative_slowdown(0.9, 2, [(1.0, 0.1)]) == 1.0  # lighter co-runners: the profile stays the floor


def test_bad_interference_fields_are_one_line_errors():
    with pytest.raises(InputError, match="per_pressure.*>= 0"):
        interference_from_dict({"per_corunner": 0.1, "per_pressure": -1, "sensitivity": 0}, "x")
    with pytest.raises(InputError, match="missing field 'sensitivity'"):
        interference_from_dict({"per_corunner": 0.1, "per_pressure": 1}, "x")
    with pytest.raises(InputError, match="at least 3"):
        fit_interference([CoRunSample(0.1, ((1.0, 0.1),), 1.1)])


def test_co_run_measures_memory_and_fits_a_valid_model(tmp_path):
    victim = build_zoo_model("mobilenet", tmp_path / "mobilenet.onnx")
    other = build_zoo_model("resnet", tmp_path / "resnet.onnx")
    out = tmp_path / "p.json"
    r = run_cli("profile", "measure", victim, "--blocks", "2", "--threads", "2", "--batch-sizes", "1",
                "--repeats", "3", "--warmup", "1", "--co-run", other, "--co-run-repeats", "3", "--co-run-level", "3",
                "--out", out)
    assert r.returncode == 0, r.stderr
    assert "interference on cpu (measured)" in r.stdout
    p = load_profile(out)
    im = p.interference["cpu"]
    assert im.points == 2 * 2  # 2 blocks x (1 co-runner at 2 duty cycles)
    assert min(im.per_corunner, im.per_pressure, im.sensitivity) >= 0 and "resnet.onnx" in im.method
    # every process, the measured model's too, ran with the MPS share a 1/3 vGPU of the co-located plan has (each
    # reported what it ran with; before, all ran as whole-GPU processes)
    assert "every process at CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=33 (a 1/3 vGPU)" in im.method
    assert p.memory is not None and len(p.memory.weight_bytes) == 2
    assert all(w > 0 for w in p.memory.weight_bytes) and all(a > 0 for a in p.memory.activation_bytes)
    # the round trip keeps both fields
    again = profile_from_dict(p.to_dict())
    assert again.interference == p.interference and again.memory == p.memory
