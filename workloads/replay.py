"""Replaying real arrivals (``replay:FILE``): a CSV with a ``TIMESTAMP`` column of dates (the Azure LLM inference
trace format) or one arrival time in seconds per line, read strictly, its gaps scaled to the target rate over the
stretch replayed."""

from __future__ import annotations

import csv
import os
import warnings
from functools import lru_cache

import numpy as np

from poolpipe_common.errors import InputError


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
    """A trace's arrivals from arrival ``start`` on, in [0, duration_s), cyclic: round(rate x duration_s) of its
    gaps, all scaled by one factor so that they span the run, so the run offers exactly ``rate`` on average and keeps
    the trace's shape (its bursts and lulls, hence its CV) within the stretch it replays.

    Why the stretch's own mean, not the whole trace's: a trace's rate drifts over an hour (the first minutes of
    azure-conv run at 0.85 of its mean), so scaling by the whole trace's mean made a short run offer up to 15 %
    less or more than the rate it was labelled with, and every figure read against that rate was off as much."""
    gaps = np.roll(replay_gaps(times), -start)
    n = max(1, round(rate * duration_s))
    window = np.tile(gaps, -(-n // gaps.size))[:n]
    span = window.sum()
    if span <= 0:  # every arrival of the stretch at one instant: the whole trace's mean gap sets the scale
        span = gaps.mean() * n
    out = np.concatenate(([0.0], np.cumsum(window[:-1]))) * (duration_s / span)
    return out[out < duration_s]
