"""When to re-plan: the measured, smoothed arrival rate of each model against the current plan's throughputs.

Clock-free like the rest of the core: the driver (simulator or sidecar) reports arrivals and asks at
times of its own clock. Rates are counted over fixed windows and smoothed (EWMA), so one burst does not
re-plan. A re-plan is due when some model runs above ``high`` of its planned throughput (out of headroom)
while the mix of rates has moved from the plan's mix by more than ``mix_tolerance`` (total-variation
distance of the shares): a re-plan then moves capacity from the models that have it to those short of it.
It waits until the mix has settled (the last window's mix within half the tolerance of the smoothed one),
so that it plans for where the mix went, not for a moment of the move. A re-plan is due too when the serving plan's
costs moved: its owner passes in (``costs_imply``) the rate each model sustains at the per-stage costs measured now
(the sidecar's promise check), and a model whose smoothed rate runs above ``high`` of that, where it fell more than
``cost_tolerance`` below the plan's throughput, is out of headroom at those costs (kind ``costs``: re-plan with
them). After a re-plan nothing is decided for ``cooldown_s`` (no flapping between two plans).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ReplanConfig:
    window_s: float = 2.0  # arrivals are counted per window of this length
    smoothing: float = 0.5  # weight of the newest window in the moving average (1: no smoothing)
    high: float = 0.9  # a model above this fraction of its planned throughput is out of headroom
    mix_tolerance: float = 0.1  # total-variation distance between measured and planned shares that counts
    cooldown_s: float = 20.0  # no new re-plan this soon after the last one
    cost_tolerance: float = 0.05  # the rate measured costs imply may fall this share below the plan's unremarked

    def __post_init__(self) -> None:
        checks = {"window_s": self.window_s > 0, "smoothing": 0 < self.smoothing <= 1, "high": self.high > 0,
                  "mix_tolerance": 0 <= self.mix_tolerance < 1, "cooldown_s": self.cooldown_s >= 0,
                  "cost_tolerance": 0 <= self.cost_tolerance < 1}
        bad = [k for k, ok in checks.items() if not ok]
        if bad:
            raise ValueError(f"replan config: {', '.join(f'{k}={getattr(self, k)!r}' for k in bad)} out of range "
                             "(window_s > 0, 0 < smoothing <= 1, high > 0, 0 <= mix_tolerance < 1, cooldown_s >= 0, "
                             "0 <= cost_tolerance < 1)")


@dataclass(frozen=True)
class ReplanDecision:
    at_us: float
    rates_rps: dict[str, float]  # the smoothed rates the new plan should serve (its weights)
    reason: str
    kind: str = "mix"  # mix: the mix left the plan's headroom; costs: the measured costs took the headroom


def mix_distance(a: dict[str, float], b: dict[str, float]) -> float:
    """Total-variation distance between the shares of two rate maps (0: same mix, 1: disjoint)."""
    sa, sb = sum(a.values()), sum(b.values())
    if sa <= 0 or sb <= 0:
        return 0.0
    return 0.5 * sum(abs(a.get(m, 0.0) / sa - b.get(m, 0.0) / sb) for m in set(a) | set(b))


class ReplanTrigger:
    """Smoothed per-model rates; ``check(now)`` returns a decision when the mix leaves the plan's headroom."""

    def __init__(self, config: ReplanConfig, capacity_rps: dict[str, float], start_us: float = 0.0) -> None:
        self.config = config
        self.capacity_rps = dict(capacity_rps)
        self.rates_rps: dict[str, float | None] = {m: None for m in capacity_rps}
        self._counts = {m: 0 for m in capacity_rps}
        self.implied_rps: dict[str, float] = {}  # what the plan sustains at the costs measured now (costs_imply)
        self._window_start = start_us
        self._quiet_until = start_us

    @property
    def window_us(self) -> float:
        return self.config.window_s * 1e6

    def next_check_us(self) -> float:
        """When the current window closes (the next time ``check`` can decide anything new)."""
        return self._window_start + self.window_us

    def costs_imply(self, capacity_rps: dict[str, float]) -> None:
        """The rate each model of the serving plan sustains at the per-stage costs measured now (empty: none
        measured yet; a model left out or NaN: not judged)."""
        self.implied_rps = {m: c for m, c in capacity_rps.items() if m in self.capacity_rps and c == c}

    def arrived(self, model: str, t_us: float) -> None:
        if model in self._counts:
            self._counts[model] += 1

    def check(self, now_us: float) -> ReplanDecision | None:
        """Close the windows that ended by ``now_us``; a decision when a re-plan is due."""
        closed = False
        last: dict[str, float] = {}
        while now_us >= self._window_start + self.window_us:
            a = self.config.smoothing
            for m, n in self._counts.items():
                r = last[m] = n / self.config.window_s
                old = self.rates_rps[m]
                self.rates_rps[m] = r if old is None else a * r + (1 - a) * old
                self._counts[m] = 0
            self._window_start += self.window_us
            closed = True
        if not closed or now_us < self._quiet_until or any(r is None for r in self.rates_rps.values()):
            return None
        rates = {m: float(r or 0.0) for m, r in self.rates_rps.items()}
        load = {m: rates[m] / c if c > 0 else float("inf") for m, c in self.capacity_rps.items()}
        hot = [m for m, x in load.items() if x > self.config.high]
        moved = mix_distance(rates, self.capacity_rps)
        if not hot or moved <= self.config.mix_tolerance or mix_distance(last, rates) > self.config.mix_tolerance / 2:
            return self._costs_decision(now_us, rates)
        reason = (f"{','.join(hot)} at {', '.join(f'{100 * load[m]:.0f}%' for m in hot)} of planned throughput, "
                  f"mix moved {moved:.2f} from the plan's")
        return ReplanDecision(now_us, rates, reason)

    def _costs_decision(self, now_us: float, rates: dict[str, float]) -> ReplanDecision | None:
        """A decision of kind costs where a model runs above ``high`` of what the measured costs let the plan
        sustain, and they let it sustain less than planned (beyond ``cost_tolerance``)."""
        low = {m: c for m, c in self.implied_rps.items()
               if c < (1.0 - self.config.cost_tolerance) * self.capacity_rps[m] and rates[m] > self.config.high * c}
        if not low:
            return None
        reason = "costs: " + ", ".join(f"{m} at {rates[m]:.1f} req/s, the plan holds {c:.1f} at the costs measured "
                                       f"now (planned {self.capacity_rps[m]:.1f})" for m, c in low.items())
        return ReplanDecision(now_us, rates, reason, "costs")

    def replanned(self, capacity_rps: dict[str, float], now_us: float) -> None:
        """A new plan serves from ``now_us``: its throughputs are the new headroom; cool down."""
        self.capacity_rps = dict(capacity_rps)
        self.implied_rps = {}  # the new plan's costs are measured anew
        self._quiet_until = now_us + self.config.cooldown_s * 1e6
