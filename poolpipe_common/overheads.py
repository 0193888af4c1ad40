"""What serving adds beyond the profiled compute: the per-stage costs a live executor measures (``poolpipe serve
--overheads-out``), which the simulator (``simulate --overheads``) and the planner (``plan --overheads``) use, and
the margin the driver keeps before each deadline. Shared by the planner and the scheduler, so it sits at the bottom.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

OVERHEADS_FORMAT = "poolpipe.overheads/1"
OVERHEADS_FIELDS = ("format", "source", "lead_us", "tail_us", "wake_late_us", "slowdown", "front_us")
# The driver plans every batch against its deadline less max(DRIVER_MIN_MARGIN_US, DRIVER_MARGIN_FRACTION x SLO)
# (scheduler.core.driver.DriverConfig.live); a plan must leave at least that free.
DRIVER_MIN_MARGIN_US = 3000.0
DRIVER_MARGIN_FRACTION = 0.05


def driver_margin_us(slo_us: float) -> float:
    """The margin the sidecar's driver keeps before a deadline of a model with this SLO."""
    return max(DRIVER_MIN_MARGIN_US, DRIVER_MARGIN_FRACTION * slo_us)


@dataclass(frozen=True)
class Overheads:
    """Per-stage costs a live executor has beyond the profiled compute (µs), and the driver's wake lateness.

    ``poolpipe serve --overheads-out FILE`` writes what the sidecar measured; ``poolpipe simulate
    --overheads FILE`` runs the shared driver with them, as the sidecar does."""

    lead_us: float = 0.0  # stage sent -> its compute starts (serialisation, the server's input copy)
    tail_us: float = 0.0  # compute end -> response back at the driver
    wake_late_us: float = 0.0  # mean (exponential) lateness of a requested wake-up
    slowdown: float = 1.0  # compute takes this times the profiled latency
    # A request's way outside the sidecar's clock (the client's send and gRPC up to the handler, the answer's way
    # back): the client's latency is the sidecar's plus this, so deadlines (live and simulated) come this much
    # sooner than the SLO from the client's send. Not measurable by the sidecar; `serve --front-us` sets it.
    front_us: float = 0.0

    @classmethod
    def from_dict(cls, raw: dict[str, Any], where: str = "overheads") -> "Overheads":
        """Validated: known fields, non-negative times, slowdown > 0 (ValueError names the bad field)."""
        fields = OVERHEADS_FIELDS[2:]
        unknown = sorted(set(raw) - set(OVERHEADS_FIELDS))
        if unknown:
            raise ValueError(f"{where}: unknown field(s) {', '.join(unknown)} (known: {', '.join(fields)})")
        vals: dict[str, float] = {}
        for k in fields:
            if k in raw:
                try:
                    vals[k] = float(raw[k])
                except (TypeError, ValueError):
                    raise ValueError(f"{where}: {k} must be a number, got {raw[k]!r}") from None
                if not (vals[k] > 0 if k == "slowdown" else vals[k] >= 0) or math.isinf(vals[k]):
                    raise ValueError(f"{where}: {k} must be {'> 0' if k == 'slowdown' else '>= 0'}, got {raw[k]!r}")
        return cls(**vals)

    def to_dict(self) -> dict[str, Any]:
        return {"format": OVERHEADS_FORMAT, "lead_us": self.lead_us, "tail_us": self.tail_us,
                "wake_late_us": self.wake_late_us, "slowdown": self.slowdown, "front_us": self.front_us}


def sidecar_slo_us(slo_us: float, front_us: float) -> float:
    """The time the sidecar (live or simulated) has for a request whose client sees ``slo_us``."""
    return max(0.0, slo_us - front_us)


# Chosen from loopback runs with a Python tritonclient at ~400 req/s on this project's 2-core machine: with it the
# late answers the client counted and the sidecar did not fell from 29 and 24 to 19 and 5 in 1,740 (a scratch
# run), while sheds rose; the tail outside the sidecar's clock is longer. `serve --front-us` sets it.
DEFAULT_FRONT_US = 2000.0
# What the sidecar measured per stage call on emulated servers at moderate load (this project's own calibration,
# `poolpipe serve --overheads-out`): what plans assume when no --overheads file is given.
DEFAULT_OVERHEADS = Overheads(lead_us=1100.0, tail_us=1300.0, wake_late_us=0.0, slowdown=1.0,
                              front_us=DEFAULT_FRONT_US)


def read_overheads(path: str | Path, flag: str = "--overheads") -> Overheads:
    """An overheads file (``poolpipe serve --overheads-out``), validated; a bad one is a one-line InputError."""
    from poolpipe_common.documents import check_fields, read_document
    from poolpipe_common.errors import InputError

    raw = check_fields(read_document(path, "overheads file"), OVERHEADS_FIELDS, f"{flag} {path}")
    try:
        return Overheads.from_dict(raw, f"{flag} {path}")
    except ValueError as e:
        raise InputError(str(e)) from None
