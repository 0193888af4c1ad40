"""Triton's batcher controls in the simulator: `simulate --dynamic-batching` (as `generate`) and `--priorities`
(the share of requests sent at each ``priority``), and SLO attainment per priority."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from poolpipe_common.batcher import BatcherControls
from poolpipe_common.errors import InputError
from scheduler.core.topology import Topology


@dataclass(frozen=True)
class SimControls:
    """Each model's batcher controls, and the mix of request priorities the workload sends."""

    batcher: dict[str, BatcherControls] = field(default_factory=dict)
    priority_mix: tuple[tuple[int, float], ...] = ()  # (priority parameter, share of requests)

    def topology(self, topo: Topology) -> Topology:
        return replace(topo, batcher={**topo.batcher, **self.batcher}) if self.batcher else topo

    def draw(self, n: int, seed: int) -> list[int] | None:
        """Each arrival's priority (None without a mix), drawn independently with the given shares."""
        if not self.priority_mix:
            return None
        levels = np.array([p for p, _ in self.priority_mix])
        shares = np.array([s for _, s in self.priority_mix])
        rng = np.random.default_rng(seed + 104729)
        return levels[rng.choice(len(levels), size=n, p=shares / shares.sum())].tolist()


def parse_priority_mix(text: str) -> tuple[tuple[int, float], ...]:
    """``PRIORITY=SHARE,...`` (e.g. ``1=0.2,2=0.8``; shares are normalised)."""
    out = []
    for part in text.split(","):
        p, eq, s = part.partition("=")
        try:
            prio, share = int(p), float(s)
        except ValueError:
            prio, share = -1, -1.0
        if not eq or prio < 0 or not share > 0:
            raise InputError(f"--priorities {text!r}: expected PRIORITY=SHARE,... with priorities >= 0 and positive "
                             "shares, e.g. 1=0.2,2=0.8")
        out.append((prio, share))
    if len({p for p, _ in out}) != len(out):
        raise InputError(f"--priorities {text!r}: a priority is given twice")
    return tuple(out)


def by_priority(outcomes: dict[int, str], priorities: Sequence[int] | None, first: int = 0
                ) -> dict[str, dict[str, Any]]:
    """Per priority parameter: requests offered, met (within the SLO), dropped, and the attainment; of the requests
    from index ``first`` on (those before it warmed the run up)."""
    if priorities is None:
        return {}
    out: dict[str, dict[str, Any]] = {}
    for rid, prio in enumerate(priorities[first:], start=first):
        s = out.setdefault(str(prio), {"offered": 0, "met": 0, "dropped": 0})
        s["offered"] += 1
        o = outcomes.get(rid)
        s["met"] += o == "met"
        s["dropped"] += o == "dropped"
    for s in out.values():
        s["slo_attainment"] = s["met"] / s["offered"]
    return dict(sorted(out.items()))
