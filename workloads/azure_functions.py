"""Azure Functions traces as arrivals: MAF 2019 per-minute counts (``maf19:FILE``) and MAF 2021 invocations
(``maf21:FILE``, what the PPipe paper calls "bursty"); see workloads.arrivals for how each is scaled."""

from __future__ import annotations

import csv
from functools import lru_cache

import numpy as np

from poolpipe_common.errors import InputError


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
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise InputError(f"cannot read trace {path}: {getattr(e, 'strerror', None) or e}") from None
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
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise InputError(f"cannot read trace {path}: {getattr(e, 'strerror', None) or e}") from None
    if not starts:
        raise InputError(f"{path}: no invocations in the trace")
    return np.array(fidx), np.array(starts)


def maf19_arrivals(path: str, rate: float, duration_s: float, model_index: int, n_models: int,
                   rng: np.random.Generator, bucket_s: float) -> np.ndarray:
    """Model ``model_index``'s share of the functions (round-robin), each trace minute ``bucket_s`` seconds of
    Poisson arrivals at the trace's relative rate."""
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


def maf21_arrivals(path: str, rate: float, duration_s: float, model_index: int, n_models: int) -> np.ndarray:
    """Model ``model_index``'s share of the invocations (round-robin by function), folded as PPipe's artifact
    does, or stretched when the target rate is below the trace's own."""
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
