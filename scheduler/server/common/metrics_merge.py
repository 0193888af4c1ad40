"""One Prometheus exposition from the expositions of ``serve --workers N``'s workers, so that the metrics port
shows one server: samples with the same name and labels are summed (counters, histogram buckets, counts and
sums, and gauges such as queue lengths), ``*_created`` takes the earliest, and the ratio gauges in ``MEAN`` are
averaged over the workers that report a number. Families keep the order and the help text of their first
appearance; a series only one worker has (a vGPU of its share) passes through unchanged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from prometheus_client.utils import floatToGoString

# fractions (a sum over workers would exceed 1), and rates each worker reports for the whole plan
MEAN = frozenset({"poolpipe_sidecar_slo_attainment", "poolpipe_sidecar_event_loop_busy",
                  "poolpipe_sidecar_promised_rps", "poolpipe_sidecar_sustainable_rps"})


@dataclass
class _Family:
    header: list[str] = field(default_factory=list)
    kind: str = "untyped"
    samples: dict[str, list[float]] = field(default_factory=dict)  # "name{labels}" -> one value per worker


def _split(line: str) -> tuple[str, float] | None:
    """``name{labels} value [timestamp]`` -> (series, value); None for a line that is not a sample."""
    key, _, rest = line.rpartition("}") if "}" in line else ("", "", line)
    if key:
        key += "}"
        parts = rest.split()
    else:
        key, *parts = line.split()
    try:
        return key, float(parts[0])
    except (IndexError, ValueError):
        return None


def _combine(series: str, kind: str, family: str, values: list[float]) -> float:
    name = series.split("{", 1)[0]
    if name.endswith("_created"):
        return min(values)
    if kind == "summary" and 'quantile="' in series:  # the union's quantile is within the workers' range: the
        numbers = [v for v in values if not math.isnan(v)]  # upper end, a bound that holds
        return max(numbers) if numbers else math.nan
    if kind == "gauge" and family in MEAN:
        numbers = [v for v in values if not math.isnan(v)]
        return sum(numbers) / len(numbers) if numbers else math.nan
    return sum(values)


def merge_expositions(texts: list[bytes]) -> bytes:
    """The workers' expositions (Prometheus text format 0.0.4) as one."""
    families: dict[str, _Family] = {}
    for text in texts:
        current = families.setdefault("", _Family())
        for line in text.decode().splitlines():
            if line.startswith("# HELP ") or line.startswith("# TYPE "):
                name = line.split()[2]
                current = families.setdefault(name, _Family())
                if line not in current.header:
                    current.header.append(line)
                if line.startswith("# TYPE "):
                    current.kind = line.split()[3]
            elif line and not line.startswith("#"):
                sample = _split(line)
                if sample is not None:
                    current.samples.setdefault(sample[0], []).append(sample[1])
    out: list[str] = []
    for name, fam in families.items():
        out.extend(fam.header)
        out.extend(f"{series} {_format(_combine(series, fam.kind, name, values))}"
                   for series, values in fam.samples.items())
    return ("\n".join(out) + "\n").encode() if out else b""


def _format(value: float) -> str:
    """Integers as integers (Triton's nv_inference_* lines), everything else as prometheus_client writes it."""
    if math.isfinite(value) and value == int(value) and abs(value) < 2 ** 53:
        return str(int(value))
    return floatToGoString(value)


CUMULATIVE = ("counter", "histogram", "summary")


def counter_samples(text: bytes) -> bytes:
    """Only the cumulative samples of an exposition (counters, histograms, summaries, without ``*_created``): what
    a dead worker counted, carried in the sums so that they never drop when a worker is restarted (a summary's
    quantiles are of the last minute, not cumulative: left out)."""
    out, keep = [], False
    for line in text.decode().splitlines():
        if line.startswith("# TYPE "):
            keep = line.split()[3] in CUMULATIVE
        if line.startswith("#"):
            out.append(line)
        elif keep and line and not line.split("{", 1)[0].split()[0].endswith("_created") and 'quantile="' not in line:
            out.append(line)
    return ("\n".join(out) + "\n").encode()
