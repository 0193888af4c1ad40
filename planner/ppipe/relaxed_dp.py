"""A knapsack DP at fractional-GPU resolution: a bound far tighter than the LP relaxation, and the
candidate levels no better plan can use.

Why: the LP relaxation lets every pipeline run on fractional vGPUs, so it overestimates the optimum
by up to ~1 % on the hard cases and the MILP's search must close that gap. Counting vGPUs whole but
letting vGPUs of one GPU type share physical GPUs across partition positions (the MILP shares them
only within a position) leaves a group knapsack over (units of GPU type 0, units of type 1), where a
unit is 1/lcm(vGPU levels) of a GPU: each candidate at most once, at one of its levels (throughputs
where some partition's vGPUs are exactly full). Its optimum F[G] bounds the MILP's, and a plan that
runs candidate c at level l has at most l + F[G - u_l] (the other pipelines fit in what c leaves).
Levels where that is below the incumbent are in no better plan, so c's throughput is capped at its
best remaining level. Usage is rounded down to the grid, which keeps both bounds valid when the
grid is coarsened to stay within MAX_STATES.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.ppipe.pipeline_columns import PipelineColumns
from planner.ppipe.reduction import TOLERANCE, candidate_levels

MAX_STATES = 100_000


@dataclass(frozen=True)
class Grid:
    """Units per GPU of each type and the DP's shape (capacity in units + 1 per type, two dims)."""

    units: np.ndarray  # (T,)
    shape: tuple[int, int]


def applicable(cands: list[PipelineColumns], gpu_counts: np.ndarray) -> bool:
    """One model on one or two GPU types."""
    return len(cands) == 1 and len(gpu_counts) <= 2 and len(cands[0]) > 0


def _unit_choices(levels: np.ndarray) -> list[int]:
    """Units per GPU to try, finest first: exact (lcm of the levels), then exact for levels 1, 2, 4."""
    exact = int(np.lcm.reduce(levels)) if len(levels) else 1
    return sorted({exact, *(u for u in (4, 2, 1) if u < exact)}, reverse=True)


def grid(c: PipelineColumns, gpu_counts: np.ndarray) -> Grid:
    """The finest grid (lcm of the vGPU levels in use) unless that exceeds MAX_STATES; then coarser on
    the type with more units first."""
    choices = [_unit_choices(np.unique(c.v[c.gpu == t])) for t in range(len(gpu_counts))]
    pick = [0] * len(gpu_counts)

    def units() -> np.ndarray:
        return np.array([ch[i] for ch, i in zip(choices, pick)])
    while np.prod(gpu_counts * units() + 1) > MAX_STATES:
        coarser = [t for t in range(len(pick)) if pick[t] + 1 < len(choices[t])]
        if not coarser:
            break
        pick[max(coarser, key=lambda t: gpu_counts[t] * units()[t])] += 1
    dims = tuple(int(x) for x in gpu_counts * units() + 1)
    return Grid(units(), (dims[0], dims[1] if len(dims) > 1 else 1))


def level_usage(c: PipelineColumns, i: int, gpu_counts: np.ndarray, g: Grid, cap: float
                ) -> tuple[np.ndarray, np.ndarray]:
    """Levels of candidate i up to ``cap`` and the grid units each uses per type (rounded down), (L, 2)."""
    lv, n = candidate_levels(c, i, gpu_counts)
    keep = lv <= cap * (1 + 1e-12)
    lv, n = lv[keep], n[keep]
    k = int(c.num_parts[i])
    use = np.zeros((len(lv), 2))
    for p in range(k):
        t = int(c.gpu[i, p])
        use[:, t] += n[:, p] * g.units[t] / c.v[i, p]
    return lv, np.floor(use + 1e-9).astype(int)


def knapsack(c: PipelineColumns, gpu_counts: np.ndarray, g: Grid, caps: np.ndarray) -> np.ndarray:
    """F[a, b]: the most throughput within a and b units (each candidate once, at one level <= its cap)."""
    f = np.zeros(g.shape)
    na, nb = g.shape
    for i in np.flatnonzero(caps > 0):
        lv, use = level_usage(c, i, gpu_counts, g, caps[i])
        nxt = f.copy()
        for x, (a, b) in zip(lv, use):
            if a < na and b < nb:
                np.maximum(nxt[a:, b:], f[:na - a, :nb - b] + x, out=nxt[a:, b:])
        f = nxt
    return f


@dataclass(frozen=True)
class Relaxation:
    """The knapsack over the candidates within some caps: valid for any plan that respects those caps."""

    grid: Grid
    table: np.ndarray  # F[a, b]

    @property
    def bound(self) -> float:
        return float(self.table[-1, -1])


def relax(c: PipelineColumns, gpu_counts: np.ndarray, caps: np.ndarray) -> Relaxation:
    g = grid(c, gpu_counts)
    return Relaxation(g, knapsack(c, gpu_counts, g, caps))


def dp_caps(c: PipelineColumns, gpu_counts: np.ndarray, caps: np.ndarray, incumbent: float, rel: Relaxation
            ) -> np.ndarray:
    """The caps lowered to each candidate's best level that can still beat ``incumbent`` (see the module
    doc); ``rel`` must have been built with caps at least these."""
    g, f = rel.grid, rel.table
    need = incumbent - TOLERANCE * max(1.0, abs(incumbent))
    out = np.zeros_like(caps)
    for i in np.flatnonzero(caps > 0):
        lv, use = level_usage(c, i, gpu_counts, g, caps[i])
        fit = (use[:, 0] < g.shape[0]) & (use[:, 1] < g.shape[1])
        best = lv[fit] + f[g.shape[0] - 1 - use[fit, 0], g.shape[1] - 1 - use[fit, 1]]
        out[i] = lv[fit][best >= need].max(initial=0.0)
    return out
