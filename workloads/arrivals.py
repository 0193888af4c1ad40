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

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from poolpipe_common.errors import InputError
from workloads.azure_functions import maf19_arrivals, maf21_arrivals
from workloads.replay import replay_arrivals, replay_start, replay_trace

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
            cv = float(arg) if arg else TraceSpec.cv
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
        return maf19_arrivals(spec.path, rate_rps, duration_s, model_index, n_models, rng, bucket_s)
    if spec.kind == "maf21":
        return maf21_arrivals(spec.path, rate_rps, duration_s, model_index, n_models)
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
