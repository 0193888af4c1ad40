"""A fitted interference model for vGPUs of different partitions sharing one physical GPU (InSS, section 4.1).

MPS isolates a process's streaming multiprocessors but not the L2 cache or the memory bandwidth, so a
partition runs slower the busier and the more memory-hungry its co-runners are. In the spirit of InSS's
execution-latency model (a per-co-runner term plus a cache/bandwidth term weighted by each co-runner's
utilisation; paraphrased, not copied) the slowdown of a victim with memory pressure ``p`` is

    m - 1 = sum over co-runners q of u_q * (per_corunner + per_pressure * p_q + sensitivity * p * p_q)

where ``u_q`` is the fraction of time co-runner q computes and ``p_q`` its memory pressure: the bytes it
touches per second (weights + activations) over the device's memory bandwidth (profiling.block_memory).
It is linear in the three coefficients, fitted by non-negative least squares from co-run measurements.

A profile's latency at vGPU level V was measured with V-1 identical, always-busy co-runners, so the
planner and the simulator use ``relative_slowdown``: the model's slowdown for the actual co-runners over
its slowdown for the profiled ones, never below 1 (the profiled latency stays the floor).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from poolpipe_common.documents import as_float, as_int, check_fields
from poolpipe_common.errors import InputError

INTERFERENCE_FIELDS = ("per_corunner", "per_pressure", "sensitivity", "points", "rmse", "method")


@dataclass(frozen=True)
class CoRunSample:
    """One measurement: the victim's pressure, its co-runners' (utilisation, pressure), the observed slowdown."""

    pressure: float
    corunners: tuple[tuple[float, float], ...]
    slowdown: float  # latency with the co-runners / latency alone


@dataclass(frozen=True)
class InterferenceModel:
    """Coefficients of the slowdown model above (all >= 0), with how well they fit."""

    per_corunner: float
    per_pressure: float
    sensitivity: float
    points: int = 0
    rmse: float = 0.0
    method: str = ""

    def __post_init__(self) -> None:
        for name in ("per_corunner", "per_pressure", "sensitivity"):
            x = getattr(self, name)
            if not (np.isfinite(x) and x >= 0):
                raise InputError(f"interference: {name} must be a finite number >= 0, got {x!r}")

    def slowdown(self, pressure: float, corunners: Sequence[tuple[float, float]]) -> float:
        """Latency multiplier of a victim of ``pressure`` next to co-runners given as (utilisation, pressure)."""
        return 1.0 + float(sum(u * (self.per_corunner + (self.per_pressure + self.sensitivity * pressure) * pq)
                               for u, pq in corunners))

    def relative_slowdown(self, pressure: float, v: int, corunners: Sequence[tuple[float, float]]) -> float:
        """Multiplier over the latency profiled at level ``v`` (v-1 identical busy co-runners), at least 1."""
        profiled = self.slowdown(pressure, [(1.0, pressure)] * (v - 1))
        return max(1.0, self.slowdown(pressure, corunners) / profiled)

    def to_dict(self) -> dict:
        return {"per_corunner": self.per_corunner, "per_pressure": self.per_pressure,
                "sensitivity": self.sensitivity, "points": self.points, "rmse": self.rmse, "method": self.method}


NO_INTERFERENCE = InterferenceModel(0.0, 0.0, 0.0, 0, 0.0, "none")


def _features(s: CoRunSample) -> np.ndarray:
    u = sum(u for u, _ in s.corunners)
    up = sum(u * pq for u, pq in s.corunners)
    return np.array([u, up, s.pressure * up])


def fit_interference(samples: Sequence[CoRunSample], method: str = "") -> InterferenceModel:
    """Non-negative least-squares fit of the three coefficients (every subset of them tried; 3 unknowns)."""
    if len(samples) < 3:
        raise InputError(f"interference fit: need at least 3 co-run measurements, got {len(samples)}")
    x = np.array([_features(s) for s in samples])
    y = np.array([s.slowdown - 1.0 for s in samples])
    if not np.all(np.isfinite(x)) or not np.all(np.isfinite(y)):
        raise InputError("interference fit: measurements must be finite")
    best_err, best = np.inf, np.zeros(3)
    for k in range(1, 4):
        for cols in itertools.combinations(range(3), k):
            coef, *_ = np.linalg.lstsq(x[:, cols], y, rcond=None)
            if np.any(coef < 0):
                continue
            full = np.zeros(3)
            full[list(cols)] = coef
            err = float(np.sum((x @ full - y) ** 2))
            if err < best_err - 1e-15:
                best_err, best = err, full
    if not np.isfinite(best_err):  # every fit wanted a negative coefficient: no measurable interference
        best_err = float(np.sum(y ** 2))
    rmse = float(np.sqrt(best_err / len(samples)))
    return InterferenceModel(float(best[0]), float(best[1]), float(best[2]), len(samples), round(rmse, 6), method)


def interference_from_dict(d: object, where: str) -> InterferenceModel:
    check_fields(d, INTERFERENCE_FIELDS, where)
    assert isinstance(d, dict)
    coef = {}
    for k in ("per_corunner", "per_pressure", "sensitivity"):
        if k not in d:
            raise InputError(f"{where}: missing field {k!r} (a fitted coefficient >= 0)")
        coef[k] = as_float(d[k], f"{where}.{k}", 0)
    method = d.get("method", "")
    if not isinstance(method, str):
        raise InputError(f"{where}.method: expected a string")
    return InterferenceModel(coef["per_corunner"], coef["per_pressure"], coef["sensitivity"],
                             as_int(d.get("points", 0), f"{where}.points", 0),
                             as_float(d.get("rmse", 0.0), f"{where}.rmse", 0), method)


def interference_map_from_dict(d: object, where: str) -> dict[str, InterferenceModel]:
    """The profile's ``interference`` field: device type -> fitted model."""
    if not isinstance(d, dict) or not d:
        raise InputError(f"{where}: expected a map of device type -> fitted interference model")
    return {str(dev): interference_from_dict(m, f"{where}.{dev}") for dev, m in d.items()}
