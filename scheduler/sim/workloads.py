"""Arrival processes for the simulator and the Locust load tests (times in seconds, deterministic per seed).

- ``poisson``: exponential inter-arrival times.
- ``bursty:CV``: gamma inter-arrival times with coefficient of variation CV (default 4), per request.
  A synthetic stress test: at CV 4 the bursts exceed what any plan can absorb at 99% attainment
  (see ``scheduler.sim.bound``), so it is not the paper's "bursty" workload.
- ``maf19:FILE``: Azure Functions 2019 per-minute counts (HashOwner,HashApp,HashFunction,Trigger,1..1440);
  functions go to models round-robin; each trace minute becomes ``bucket_s`` simulated seconds
  (default 1 s) with Poisson arrivals inside at the trace's relative rate.
- ``maf21:FILE``: Azure Functions 2021 per invocation (app,func,end_timestamp,duration); an invocation
  starts at end_timestamp - duration; functions go to models round-robin. This is what the PPipe
  paper calls "bursty" (its artifact labels the MAF21 runs "Bursty" and the Poisson MAF19 runs
  "Poisson"), scaled the way its simulator does: the start times are folded modulo a segment of
  (n - 1) / rate seconds, so that the n invocations overlay into one segment at the target rate,
  and the folded inter-arrival times are replayed cyclically from t = 0. When the target rate is
  below the trace's own rate, time is stretched instead.
Every generator is scaled to the requested mean rate.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from poolpipe_common.errors import InputError


@dataclass(frozen=True)
class TraceSpec:
    kind: str  # poisson | bursty | maf19 | maf21
    cv: float = 4.0
    path: str | None = None

    def __str__(self) -> str:
        if self.kind == "bursty":
            return f"bursty:{self.cv:g}"
        return f"{self.kind}:{self.path}" if self.path else self.kind


def parse_trace(text: str) -> TraceSpec:
    """Parse ``poisson | bursty[:CV] | maf19:FILE | maf21:FILE`` (raises InputError naming --trace)."""
    kind, _, arg = text.partition(":")
    if kind == "poisson" and not arg:
        return TraceSpec("poisson")
    if kind == "bursty":
        try:
            cv = float(arg) if arg else 4.0
        except ValueError:
            raise InputError(f"--trace {text!r}: CV must be a number, e.g. bursty:4") from None
        if not cv > 0:
            raise InputError(f"--trace {text!r}: CV must be > 0")
        return TraceSpec("bursty", cv)
    if kind in ("maf19", "maf21"):
        if not arg:
            raise InputError(f"--trace {text!r}: give the trace file, e.g. {kind}:path/to/file.csv")
        if not Path(arg).is_file():
            raise InputError(f"--trace {text!r}: no such file {arg}")
        return TraceSpec(kind, path=arg)
    raise InputError(f"--trace {text!r}: expected poisson, bursty:CV, maf19:FILE or maf21:FILE")


def _poisson(rate: float, duration_s: float, rng: np.random.Generator) -> np.ndarray:
    n = rng.poisson(rate * duration_s)
    return np.sort(rng.uniform(0.0, duration_s, n))


def _gamma(rate: float, duration_s: float, cv: float, rng: np.random.Generator) -> np.ndarray:
    shape = 1.0 / (cv * cv)
    scale = 1.0 / (rate * shape)
    out = []
    t = rng.uniform(0.0, 1.0 / rate)  # random phase so that models do not start in lockstep
    need = int(rate * duration_s * 1.2) + 64
    while True:
        gaps = rng.gamma(shape, scale, need)
        times = t + np.cumsum(gaps)
        out.append(times[times < duration_s])
        if times[-1] >= duration_s:
            break
        t = times[-1]
    return np.concatenate(out)


@lru_cache(maxsize=8)
def _maf19_counts(path: str) -> np.ndarray:
    """Per-minute counts, one row per function (file order)."""
    rows = []
    try:
        with open(path, newline="") as f:
            reader = csv.reader(f)
            header = next(reader, None)
            if not header or len(header) < 5 or header[4] != "1":
                raise InputError(f"{path}: not a MAF 2019 per-minute file (header "
                                 "HashOwner,HashApp,HashFunction,Trigger,1,2,...)")
            for i, row in enumerate(reader, 2):
                try:
                    rows.append([float(x) for x in row[4:]])
                except ValueError:
                    raise InputError(f"{path}:{i}: per-minute counts must be numbers") from None
    except OSError as e:
        raise InputError(f"cannot read trace {path}: {e.strerror or e}") from None
    if not rows:
        raise InputError(f"{path}: no functions in the trace")
    width = max(len(r) for r in rows)
    return np.array([r + [0.0] * (width - len(r)) for r in rows])


@lru_cache(maxsize=8)
def _maf21_invocations(path: str) -> tuple[np.ndarray, np.ndarray]:
    """(function index, start time in s) per invocation, functions numbered in order of appearance."""
    funcs: dict[tuple[str, str], int] = {}
    fidx, starts = [], []
    try:
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            need = {"app", "func", "end_timestamp", "duration"}
            if not reader.fieldnames or not need <= set(reader.fieldnames):
                raise InputError(f"{path}: not a MAF 2021 invocation file (header app,func,end_timestamp,duration)")
            for i, row in enumerate(reader, 2):
                try:
                    start = float(row["end_timestamp"]) - float(row["duration"])
                except ValueError:
                    raise InputError(f"{path}:{i}: end_timestamp and duration must be numbers") from None
                fidx.append(funcs.setdefault((row["app"], row["func"]), len(funcs)))
                starts.append(start)
    except OSError as e:
        raise InputError(f"cannot read trace {path}: {e.strerror or e}") from None
    if not starts:
        raise InputError(f"{path}: no invocations in the trace")
    return np.array(fidx), np.array(starts)


def _maf19(path: str, rate: float, duration_s: float, model_index: int, n_models: int,
           rng: np.random.Generator, bucket_s: float) -> np.ndarray:
    counts = _maf19_counts(path)
    mine = counts[model_index % n_models::n_models] if counts.shape[0] > model_index % n_models else counts
    per_minute = mine.sum(axis=0)
    buckets = int(np.ceil(duration_s / bucket_s))
    if per_minute.sum() <= 0:
        raise InputError(f"{path}: the functions assigned to model #{model_index} have no invocations")
    shape = np.resize(per_minute, buckets)  # wraps around when the run is longer than the trace
    if shape.sum() <= 0:
        shape = np.ones(buckets)
    rates = rate * shape / shape.mean()
    out = []
    for i, r in enumerate(rates):
        lo = i * bucket_s
        hi = min(duration_s, lo + bucket_s)
        n = rng.poisson(r * (hi - lo))
        out.append(rng.uniform(lo, hi, n))
    return np.sort(np.concatenate(out)) if out else np.zeros(0)


def _maf21(path: str, rate: float, duration_s: float, model_index: int, n_models: int) -> np.ndarray:
    fidx, starts = _maf21_invocations(path)
    sel = starts[fidx % n_models == model_index % n_models]
    if sel.size < 2:
        sel = starts
    sel = np.sort(sel)
    span = max(sel[-1] - sel[0], 1e-9)
    if sel.size < 2 or (sel.size - 1) / span >= rate:
        return _stretched(sel - sel[0], rate, duration_s)
    return _folded(sel, rate, duration_s)


def _folded(starts: np.ndarray, rate: float, duration_s: float) -> np.ndarray:
    """The PPipe artifact's scaling: fold the start times modulo (n - 1) / rate and replay the folded
    inter-arrival gaps cyclically from t = 0 (about ``rate`` on average)."""
    segment = (starts.size - 1) / rate
    folded = np.sort(np.mod(starts, segment))
    # the gaps between folded starts, and the wrap from the last back to the first one segment later
    # (the artifact omits the wrap, which only matters when the folded segment is sparse)
    gaps = np.append(np.diff(folded), segment - folded[-1] + folded[0])
    if gaps.sum() <= 0:
        return np.zeros(0)
    reps = int(np.ceil(duration_s / gaps.sum())) + 1
    times = np.concatenate(([0.0], np.cumsum(np.tile(gaps, reps))))
    return times[times < duration_s]


def _stretched(sel: np.ndarray, rate: float, duration_s: float) -> np.ndarray:
    """Slow the trace down so that its mean rate is ``rate``, tiled to cover the run."""
    span = max(sel[-1], 1e-9)
    scaled = sel * ((sel.size / span) / rate)
    period = scaled[-1] + 1.0 / rate
    reps = int(np.ceil(duration_s / period)) + 1
    tiled = np.concatenate([scaled + i * period for i in range(reps)])
    return tiled[tiled < duration_s]


def arrival_times(trace: TraceSpec | str, rate_rps: float, duration_s: float, seed: int = 0,
                  model_index: int = 0, n_models: int = 1, bucket_s: float = 1.0) -> np.ndarray:
    """Sorted arrival times in seconds in [0, duration_s) with mean rate ``rate_rps`` for one model."""
    spec = parse_trace(trace) if isinstance(trace, str) else trace
    if rate_rps <= 0 or duration_s <= 0:
        return np.zeros(0)
    rng = np.random.default_rng([seed, model_index])
    if spec.kind == "poisson":
        return _poisson(rate_rps, duration_s, rng)
    if spec.kind == "bursty":
        return _gamma(rate_rps, duration_s, spec.cv, rng)
    if spec.kind == "maf19":
        return _maf19(spec.path, rate_rps, duration_s, model_index, n_models, rng, bucket_s)
    if spec.kind == "maf21":
        return _maf21(spec.path, rate_rps, duration_s, model_index, n_models)
    raise InputError(f"unknown trace kind {spec.kind!r}")


def mixed_arrivals(trace: TraceSpec | str, rates_rps: dict[str, float], duration_s: float, seed: int = 0
                   ) -> list[tuple[float, str]]:
    """Arrivals of several models, (time_us, model) sorted by time; each model at its own mean rate."""
    out: list[tuple[float, str]] = []
    names = list(rates_rps)
    for i, m in enumerate(names):
        ts = arrival_times(trace, rates_rps[m], duration_s, seed, i, len(names))
        out.extend(zip((ts * 1e6).tolist(), [m] * len(ts)))
    out.sort(key=lambda x: x[0])
    return out
