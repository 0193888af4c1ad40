"""Time-varying model mixes for the simulator: phases of per-model rates (a scripted step change of the
ratio between models, or per-model shifts over a replayed trace), each phase's arrivals drawn from one of
the workloads of workloads.arrivals at that phase's rates."""

from __future__ import annotations

from dataclasses import dataclass

from poolpipe_common.errors import InputError
from workloads.arrivals import TraceSpec, arrival_times


@dataclass(frozen=True)
class MixPhase:
    start_s: float
    rates_rps: dict[str, float]  # model -> mean arrival rate from start_s until the next phase


def parse_phases(text: str, models: list[str]) -> list[MixPhase]:
    """``START:MODEL=RPS,MODEL=RPS;START:...`` (starts in seconds, the first 0, increasing; every model named)."""
    phases: list[MixPhase] = []
    for part in (p for p in text.split(";") if p.strip()):
        start, sep, body = part.partition(":")
        try:
            t = float(start)
            rates = {k.strip(): float(v) for k, v in (kv.split("=", 1) for kv in body.split(","))}
        except ValueError:
            raise InputError(f"--phases {part!r}: expected START:MODEL=RPS,MODEL=RPS (e.g. 0:a=100,b=100)") from None
        missing = sorted(set(models) - set(rates))
        unknown = sorted(set(rates) - set(models))
        if not sep or missing or unknown or any(r < 0 for r in rates.values()):
            raise InputError(f"--phases {part!r}: give a rate >= 0 for each of {', '.join(models)}"
                             + (f" (unknown: {', '.join(unknown)})" if unknown else ""))
        if phases and t <= phases[-1].start_s or not phases and t != 0:
            raise InputError(f"--phases {part!r}: phases start at 0 s and in increasing order")
        phases.append(MixPhase(t, rates))
    if not phases:
        raise InputError("--phases: give at least one phase, e.g. 0:a=100,b=100;30:a=50,b=150")
    return phases


def step_change(rates_rps: dict[str, float], ratio_after: dict[str, float], at_s: float) -> list[MixPhase]:
    """The same total rate before and after ``at_s``; after it split in ``ratio_after``'s proportions."""
    total = sum(rates_rps.values())
    weight = sum(ratio_after.values())
    return [MixPhase(0.0, dict(rates_rps)), MixPhase(at_s, {m: total * ratio_after[m] / weight for m in rates_rps})]


def shifting_arrivals(trace: TraceSpec | str, phases: list[MixPhase], duration_s: float, seed: int = 0
                      ) -> list[tuple[float, str]]:
    """(time_us, model) sorted by time: each phase's arrivals at its rates, on ``trace``'s process."""
    out: list[tuple[float, str]] = []
    for i, ph in enumerate(phases):
        end = phases[i + 1].start_s if i + 1 < len(phases) else duration_s
        if end <= ph.start_s:
            continue
        names = list(ph.rates_rps)
        for j, m in enumerate(names):
            ts = arrival_times(trace, ph.rates_rps[m], end - ph.start_s, seed + 1009 * i, j, len(names))
            out.extend(((ph.start_s + float(t)) * 1e6, m) for t in ts)
    out.sort(key=lambda x: x[0])
    return out
