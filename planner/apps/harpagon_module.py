"""Harpagon's module scheduler: the cheapest set of machine configurations that serves one module's request rate
within its latency budget (Harpagon §II-III, ``../shared/papers/harpagon.txt``).

A configuration is a batch size on a kind of machine (here a vGPU of one GPU type and MPS level) with its measured
duration and unit price. Machines are ranked by throughput/price. The worst-case latency of a machine is its
duration plus the time to collect its batch:

- ``tc`` (throughput-cost dispatch, Harpagon): whole batches go to machines in rank order, so a machine collects
  its batch at the rate of all the work left to it and to the machines ranked after it: ``d + b / w``;
- ``rr`` (round-robin, Nexus/Clipper): single requests go to machines in turn, so a machine collects its batch at
  its own rate ``f``: ``d + b / f`` (``2d`` at full load).

The cost of a schedule is ``sum price x (rate served / throughput)`` (frame-rate proportionality): a machine at
partial load costs its share. Units are the caller's (seconds and requests per second here and in the toy cases).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

DISPATCHES = ("tc", "rr")
_EPS = 1e-9  # rates and latencies are compared with this slack (0.32 + 8/100 must meet a 0.4 s budget)


@dataclass(frozen=True)
class Config:
    """A batch size on one kind of machine: its duration per batch and its unit price."""

    batch: int
    duration: float
    price: float = 1.0
    hardware: str = ""

    @property
    def throughput(self) -> float:
        return self.batch / self.duration

    @property
    def ratio(self) -> float:
        """Throughput per unit price: the rank Harpagon dispatches in."""
        return self.throughput / self.price


@dataclass(frozen=True)
class Machines:
    """``count`` machines at ``config`` (a fraction for one machine at partial load) serving ``rate``."""

    config: Config
    count: float
    rate: float
    worst_latency: float


@dataclass(frozen=True)
class ModuleSchedule:
    """The machines serving one module, the dummy request rate added to fill their batches, and the cost."""

    rows: tuple[Machines, ...]
    rate: float  # real requests
    dummy_rate: float = 0.0

    @property
    def cost(self) -> float:
        return sum(r.config.price * r.count for r in self.rows)

    @property
    def machines(self) -> float:
        return sum(r.count for r in self.rows)

    @property
    def worst_latency(self) -> float:
        return max((r.worst_latency for r in self.rows), default=0.0)

    def describe(self) -> str:
        """Table II's notation: ``rate (machines x batch)`` per row, the dummy rate if any."""
        merged: list[list] = []  # a configuration's whole machines and its partial one read as one row
        for r in self.rows:
            if merged and merged[-1][0] == r.config:
                merged[-1][1] += r.count
                merged[-1][2] += r.rate
            else:
                merged.append([r.config, r.count, r.rate])
        rows = " + ".join(f"{rate:.4g} ({count:.4g} x b{c.batch}{' ' + c.hardware if c.hardware else ''})"
                          for c, count, rate in merged)
        return rows + (f", dummy {self.dummy_rate:.4g}" if self.dummy_rate else "")


def worst_latency(c: Config, own_rate: float, left_rate: float, dispatch: str) -> float:
    """Worst-case latency of a machine at ``c`` serving ``own_rate`` when ``left_rate`` (its own included) is
    the work still to dispatch at its rank (Harpagon's Theorem 1 for ``tc``; ``rr`` collects at its own rate)."""
    collect_rate = left_rate if dispatch == "tc" else own_rate
    return c.duration + c.batch / collect_rate


def ranked(configs: Sequence[Config]) -> list[Config]:
    """Configurations by throughput/price, best first (ties: the shorter duration first)."""
    return sorted(configs, key=lambda c: (-c.ratio, c.duration))


def _whole(n: float) -> int:
    """floor(n), treating n within _EPS of the next integer as that integer (200/40 is 5 machines, not 4)."""
    return math.floor(n + _EPS)


def _rows_at(c: Config, rate: float, budget: float, dispatch: str) -> list[Machines] | None:
    """Machines at ``c`` taking all of ``rate`` (whole ones, then one at partial load), if every one meets
    ``budget``; None otherwise."""
    rows, left = [], rate
    n = _whole(left / c.throughput)
    if n >= 1:
        lat = worst_latency(c, c.throughput, left, dispatch)
        if lat > budget + _EPS:
            return None
        rows.append(Machines(c, n, n * c.throughput, lat))
        left -= n * c.throughput
    if left > _EPS:
        lat = worst_latency(c, left, left, dispatch)
        if lat > budget + _EPS:
            return None
        rows.append(Machines(c, left / c.throughput, left, lat))
    return rows


def generate_config(rate: float, budget: float, configs: Sequence[Config], dispatch: str = "tc",
                    seen: set[float] | None = None) -> list[Machines] | None:
    """Harpagon's Algorithm 1: walk the configurations in rank order; the current one takes as many whole
    machines of the remaining rate as it can while it meets the budget at the rate left, or the whole rest at
    partial load; when it misses the budget, move on to the next. None when no configuration meets it.
    ``seen`` collects the rates left at each check (where the outcome can change with the budget)."""
    order, k, left, rows = ranked(configs), 0, rate, []
    while left > _EPS:
        c = order[k]
        if seen is not None:
            seen.add(left)
        n = left / c.throughput
        whole = _whole(n)
        lat = worst_latency(c, c.throughput if whole >= 1 else left, left, dispatch)
        if lat <= budget + _EPS:
            if whole >= 1:
                rows.append(Machines(c, whole, whole * c.throughput, lat))
                left -= whole * c.throughput
            else:
                rows.append(Machines(c, n, left, lat))
                left = 0.0
        else:
            k += 1
            if k >= len(order):
                return None
    return rows


def two_tuple(rate: float, budget: float, configs: Sequence[Config], dispatch: str = "rr") -> list[Machines] | None:
    """What Nexus-style schedulers do: the best-ranked configuration that meets the budget at full load takes
    whole machines of the rate, and one other configuration (of any number of machines) all of the residual."""
    order = ranked(configs)
    best = next((c for c in order if worst_latency(c, min(c.throughput, rate), rate, dispatch) <= budget + _EPS),
                None)
    if best is None:
        return None
    n = _whole(rate / best.throughput)
    if n < 1:
        return _rows_at(best, rate, budget, dispatch)
    rows = [Machines(best, n, n * best.throughput, worst_latency(best, best.throughput, rate, dispatch))]
    residual = rate - n * best.throughput
    if residual <= _EPS:
        return rows
    for c in order:
        res = _rows_at(c, residual, budget, dispatch)
        if res is not None:
            return rows + res
    return None


def schedule_module(rate: float, budget: float, configs: Sequence[Config], dispatch: str = "tc",
                    multi: bool = True, dummy: bool = True, seen: set[float] | None = None
                    ) -> ModuleSchedule | None:
    """The cheapest schedule for ``rate`` within ``budget``: Algorithm 1 (``multi``) or the two-tuple heuristic;
    with ``dummy``, Harpagon's dummy generator tries each configuration's fill-up rate ``t_i - u_i`` (``u_i``: the
    rate given to configurations ranked after it) and keeps the cheapest. None when nothing meets the budget."""
    if dispatch not in DISPATCHES:
        raise ValueError(f"dispatch {dispatch!r}: expected one of {DISPATCHES}")

    def plan(r: float) -> list[Machines] | None:
        if multi:
            return generate_config(r, budget, configs, dispatch, seen)
        return two_tuple(r, budget, configs, dispatch)
    rows = plan(rate)
    if rows is None:
        return None
    best = ModuleSchedule(tuple(rows), rate)
    if not dummy:
        return best
    for i, r in enumerate(rows):
        leftover = sum(x.rate for x in rows[i + 1:])
        extra = r.config.throughput - leftover
        if not 0 < leftover < r.config.throughput or extra <= _EPS:
            continue
        padded = plan(rate + extra)
        candidate = None if padded is None else ModuleSchedule(tuple(padded), rate, extra)
        if candidate is not None and candidate.cost < best.cost - _EPS:
            best = candidate
    return best


def latency_cost_efficiency(rate: float, prev: Config, new: Config) -> float:
    """Harpagon's LC: cost saved per unit of latency spent moving one module from ``prev`` to ``new``, both
    taking the whole rate under throughput-cost dispatch (``d + b / rate``). Infinite for a cheaper move that
    costs no latency."""
    saved = prev.price * rate / prev.throughput - new.price * rate / new.throughput
    spent = (new.duration + new.batch / rate) - (prev.duration + prev.batch / rate)
    return saved / spent if spent > _EPS else math.inf
