"""The arrival process a plan must sustain: ``poisson``, ``bursty:CV`` (gamma gaps with that coefficient of
variation) or ``replay:NAME_OR_FILE`` (a recorded trace; the evaluator that runs it resolves the name)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from poolpipe_common.errors import InputError

ARRIVAL_KINDS = ("poisson", "bursty", "replay")


@dataclass(frozen=True)
class Arrivals:
    """What ``--arrivals`` said, and the squared coefficient of variation of its gaps the closed form uses
    (a replayed trace is taken as Poisson there; the simulator replays it)."""

    text: str
    scv: float = 1.0

    def __str__(self) -> str:
        return self.text


def parse_arrivals(text: str) -> Arrivals:
    """``poisson`` | ``bursty:CV`` | ``replay:NAME_OR_FILE`` (a one-line InputError naming --arrivals)."""
    kind, _, arg = str(text).strip().partition(":")
    if kind == "poisson" and not arg:
        return Arrivals("poisson")
    if kind == "bursty":
        try:
            cv = float(arg)
        except ValueError:
            cv = math.nan
        if not (cv > 0 and math.isfinite(cv)):
            raise InputError(f"--arrivals {text!r}: bursty needs a positive coefficient of variation, e.g. bursty:2")
        return Arrivals(f"bursty:{arg}", cv * cv)
    if kind == "replay" and arg:
        return Arrivals(f"replay:{arg}")
    raise InputError(f"--arrivals {text!r}: expected poisson, bursty:CV (e.g. bursty:2) or replay:NAME_OR_FILE "
                     "(e.g. replay:azure-conv)")
