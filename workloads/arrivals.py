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
- ``replay:FILE``: real arrivals replayed with their burstiness. FILE is a CSV with a ``TIMESTAMP``
  column of dates (the Azure LLM inference trace format, ``2023-11-16 18:17:03.9799600``) or a plain
  file of one arrival time in seconds per line (an optional header line; ties allowed, no decrease).
  Every inter-arrival time is multiplied by (trace rate / target rate), so the mean rate is the target
  and the inter-arrival shape (its CV) is the trace's; the trace repeats from its start when the run is
  longer, the wrap from its last arrival back to its first taking one mean gap. Seed 0 starts at the
  trace's first arrival, another seed at a seed-chosen arrival; with several models (each at its own
  rate), model i of m starts i*n/m of the trace's n arrivals further on, so their bursts do not coincide.
  Shortcuts: ``azure-code`` and ``azure-conv`` name the shipped traces in data/traces/azure-llm-2023.
Every generator is scaled to the requested mean rate.
"""

from __future__ import annotations

import csv
import os
import warnings
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from poolpipe_common.errors import InputError

TRACES_DIR = Path(__file__).resolve().parents[1] / "data" / "traces"
REPLAY_SHORTCUTS = {
    "azure-code": TRACES_DIR / "azure-llm-2023" / "AzureLLMInferenceTrace_code.csv",
    "azure-conv": TRACES_DIR / "azure-llm-2023" / "AzureLLMInferenceTrace_conv.csv",
}
TRACE_KINDS = "poisson, bursty:CV, maf19:FILE, maf21:FILE or replay:FILE|azure-code|azure-conv"


@dataclass(frozen=True)
class TraceSpec:
    kind: str  # poisson | bursty | maf19 | maf21 | replay
    cv: float = 4.0
    path: str | None = None

    def __str__(self) -> str:
        if self.kind == "bursty":
            return f"bursty:{self.cv:g}"
        short = next((k for k, v in REPLAY_SHORTCUTS.items() if str(v) == self.path), None)
        if self.kind == "replay" and short:
            return f"replay:{short}"
        return f"{self.kind}:{self.path}" if self.path else self.kind


def parse_trace(text: str) -> TraceSpec:
    """Parse ``poisson | bursty[:CV] | maf19:FILE | maf21:FILE | replay:FILE`` (raises InputError naming --trace).

    A replay file is read here (and cached), so that a bad one fails before any simulation or load test."""
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
    if kind == "replay":
        return _parse_replay(text, arg)
    raise InputError(f"--trace {text!r}: expected {TRACE_KINDS}")


def _parse_replay(text: str, arg: str) -> TraceSpec:
    """``replay:FILE`` or a shortcut; the file must hold a usable trace."""
    if not arg:
        raise InputError(f"--trace {text!r}: give the trace file or a shortcut, e.g. replay:azure-code "
                         f"(shortcuts: {', '.join(REPLAY_SHORTCUTS)})")
    path = str(REPLAY_SHORTCUTS[arg]) if arg in REPLAY_SHORTCUTS else arg
    if not Path(path).is_file():
        raise InputError(f"--trace {text!r}: no such file {path}")
    replay_trace(path)
    return TraceSpec("replay", path=path)


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


def replay_trace(path: str) -> np.ndarray:
    """Arrival times in seconds since the file's first arrival, checked; cached while the file is unchanged."""
    st = os.stat(path)
    return _replay_file(path, st.st_mtime_ns, st.st_size)


@lru_cache(maxsize=8)
def _replay_file(path: str, _mtime_ns: int, _size: int) -> np.ndarray:
    where = f"--trace replay:{path}"
    try:
        with open(path, newline="") as f:
            reader = csv.reader(f)
            rows = [(reader.line_num, r) for r in reader if any(c.strip() for c in r)]
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise InputError(f"{where}: cannot read the file: {getattr(e, 'strerror', None) or e}") from None
    lines, times = _timestamps(rows, where)
    return _checked(lines, times, where)


def _timestamps(rows: list[tuple[int, list[str]]], where: str) -> tuple[np.ndarray, np.ndarray]:
    """(line numbers, times in s) of a TIMESTAMP column of dates or of a one-column file of seconds."""
    header = [c.strip().upper() for c in rows[0][1]] if rows else []
    if "TIMESTAMP" in header:
        col = header.index("TIMESTAMP")
        cells = [(n, r[col].strip() if col < len(r) else "") for n, r in rows[1:]]
        return np.array([n for n, _ in cells], dtype=int), _dates(cells, where)
    if rows and len(rows[0][1]) == 1 and not _is_number(rows[0][1][0]):
        rows = rows[1:]  # the header of a one-column file
    out = []
    for n, r in rows:
        cells = [c.strip() for c in r if c.strip()]
        if len(cells) != 1 or not _is_number(cells[0]):
            raise InputError(f"{where}: line {n}: expected one arrival time in seconds per line "
                             f"(or a TIMESTAMP column of dates), got {','.join(r)[:60]!r}")
        out.append(float(cells[0]))
    return np.array([n for n, _ in rows], dtype=int), np.array(out, dtype=float)


def _is_number(text: str) -> bool:
    try:
        return bool(np.isfinite(float(text)))
    except ValueError:
        return False


def _dates(cells: list[tuple[int, str]], where: str) -> np.ndarray:
    """Seconds since the first date, to the nanosecond (dates like ``2023-11-16 18:17:03.9799600``)."""
    texts = [text.replace(" ", "T", 1) if text else "NaT" for _, text in cells]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # a zone suffix: numpy converts to UTC
        try:
            stamps = np.array(texts, dtype="datetime64[ns]")
        except ValueError:
            stamps = np.array([_date_or_nat(t) for t in texts], dtype="datetime64[ns]")
    bad = np.flatnonzero(np.isnat(stamps))
    if bad.size:
        n, text = cells[bad[0]]
        raise InputError(f"{where}: line {n}: TIMESTAMP {text!r} is not a date like 2023-11-16 18:17:03.97996")
    if not len(stamps):
        return np.zeros(0)
    return (stamps - stamps[0]).astype("int64") / 1e9


def _date_or_nat(text: str) -> np.datetime64:
    try:
        return np.datetime64(text, "ns")
    except ValueError:
        return np.datetime64("NaT")


def _checked(lines: np.ndarray, times: np.ndarray, where: str) -> np.ndarray:
    """At least 2 arrivals, never earlier than the one before, spanning some time; origin at the first."""
    if times.size < 2:
        raise InputError(f"{where}: {times.size} arrival(s); a replay needs at least 2")
    back = np.flatnonzero(np.diff(times) < 0)
    if back.size:
        raise InputError(f"{where}: line {lines[back[0] + 1]}: the arrival is earlier than the one before "
                         "(times must not decrease)")
    if times[-1] <= times[0]:
        raise InputError(f"{where}: all {times.size} arrivals are at one instant; a replay needs a time span")
    return times - times[0]


def replay_gaps(times: np.ndarray) -> np.ndarray:
    """One cycle of a trace as n gaps: its n - 1 inter-arrival times, then the wrap to its start (the mean gap)."""
    gaps = np.diff(times)
    return np.append(gaps, gaps.mean())


def replay_start(n: int, seed: int, model_index: int = 0, n_models: int = 1) -> int:
    """The arrival a replay starts at: the first for seed 0, a seed-chosen one otherwise; model i of m i/m later."""
    base = 0 if seed == 0 else int(np.random.default_rng(seed).integers(n))
    return (base + (model_index % n_models) * n // n_models) % n


def replay_arrivals(times: np.ndarray, rate: float, duration_s: float, start: int = 0) -> np.ndarray:
    """A trace's arrivals from arrival ``start`` on, in [0, duration_s), cyclic, its gaps scaled to mean 1 / rate."""
    gaps = np.roll(replay_gaps(times), -start)
    gaps = gaps / (gaps.mean() * rate)  # x (trace rate / target rate): the shape is kept
    reps = int(np.ceil(duration_s / gaps.sum())) + 1
    out = np.concatenate(([0.0], np.cumsum(np.tile(gaps, reps))))
    return out[out < duration_s]


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
    if spec.kind == "replay":
        times = replay_trace(spec.path)
        return replay_arrivals(times, rate_rps, duration_s, replay_start(times.size, seed, model_index, n_models))
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
