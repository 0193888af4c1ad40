"""Whole-GPU dynamic programme: the best plan in which every partition owns whole GPUs, for clusters
of one or two GPU types, exactly and in milliseconds.

Why: the MILP's hard part is integral (vGPU counts must be whole), which its LP relaxation cannot
see; HiGHS then spends most of its time finding good integer points. Over the space of GPU counts
(A high, B low GPUs: at most a few thousand states) a knapsack DP finds the best plan in which no
two pipelines share a GPU. Such a plan is feasible for the MILP (a partition of V vGPUs per GPU on
w whole GPUs has w x V vGPUs), so it is a strong warm start; when no candidate uses a vGPU level
above 1 sharing cannot help and the DP's plan is optimal.

Per candidate, w whole GPUs at a partition of per-GPU rate e = r x V carry e x w req/s, so a
pipeline carrying T req/s needs ceil(T / e_k) GPUs at partition k; only T = e_k x w (some k, w) matter.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.ppipe.column_milp import ChosenPipeline
from planner.ppipe.pipeline_columns import PipelineColumns

MAX_STATES = 20_000  # (A + 1) x (B + 1); larger clusters skip the DP


@dataclass(frozen=True)
class Table:
    """F[A, B]: best throughput of one model on A high and B low GPUs, and how to rebuild it."""

    value: np.ndarray  # (A+1, B+1)
    step: np.ndarray  # (A+1, B+1, 2): GPUs (a, b) of the last pipeline added; (0, 0) = none
    item: np.ndarray  # (A+1, B+1): index into items of that pipeline
    items: list[tuple[int, float, tuple[int, ...]]]  # (candidate, throughput, whole GPUs per partition)


def applicable(cands: list[PipelineColumns], counts: np.ndarray) -> bool:
    """The DP handles one or two GPU types of modest counts."""
    return len(counts) <= 2 and int(np.prod(counts.astype(int) + 1)) <= MAX_STATES and all(len(c) for c in cands)


def exact_for(cands: list[PipelineColumns]) -> bool:
    """With vGPU level 1 everywhere, GPUs are never shared, so the DP's plan is optimal."""
    return all(int(c.v.max(initial=1)) <= 1 for c in cands)


def _levels(c: PipelineColumns, i: int, counts: np.ndarray) -> np.ndarray:
    """Throughputs worth trying for candidate i: every e_k x w up to the GPUs of partition k's type."""
    k = int(c.num_parts[i])
    e = c.rate_rps[i, :k] * c.v[i, :k]
    return np.unique(np.concatenate([e[p] * np.arange(1, counts[c.gpu[i, p]] + 1) for p in range(k)]))


def _candidate_points(c: PipelineColumns, i: int, counts: np.ndarray, shape: tuple[int, int]):
    """(throughput, a, b, whole GPUs per partition) of candidate i at every throughput worth trying."""
    k = int(c.num_parts[i])
    e = c.rate_rps[i, :k] * c.v[i, :k]
    t = _levels(c, i, counts)
    w = np.ceil(t[:, None] / e[None, :] - 1e-9).astype(int)  # (T, k) whole GPUs per partition
    gpu = c.gpu[i, :k]
    a = w[:, gpu == 0].sum(1)
    b = w[:, gpu == 1].sum(1)
    ok = (a < shape[0]) & (b < shape[1])
    wp = np.zeros((int(ok.sum()), c.gpu.shape[1]), int)
    wp[:, :k] = w[ok]
    return t[ok], a[ok], b[ok], wp


def _best_single(c: PipelineColumns, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray, list]:
    """best[a, b]: the most one pipeline carries on exactly a high / b low GPUs (and which item)."""
    shape = (int(counts[0]) + 1, int(counts[1]) + 1 if len(counts) > 1 else 1)
    pts = [_candidate_points(c, i, counts, shape) for i in range(len(c))]
    t = np.concatenate([p[0] for p in pts])
    cell = np.concatenate([p[1] * shape[1] + p[2] for p in pts])
    cand = np.concatenate([np.full(len(p[0]), i) for i, p in enumerate(pts)])
    w = np.concatenate([p[3] for p in pts])
    order = np.lexsort((-t, cell))
    first = order[np.r_[True, cell[order][1:] != cell[order][:-1]]] if len(order) else order
    best = np.zeros(shape)
    arg = np.full(shape, -1)
    best.flat[cell[first]] = t[first]
    arg.flat[cell[first]] = np.arange(len(first))
    items = [(int(cand[j]), float(t[j]), tuple(int(x) for x in w[j, :int(c.num_parts[cand[j]])])) for j in first]
    return best, arg, items


def _prefix_max(best: np.ndarray, arg: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Monotone best/arg over (a, b), with the exact (a, b) each value is reached at."""
    where = np.stack(np.indices(best.shape), -1)
    for axis in (0, 1):
        for j in range(1, best.shape[axis]):
            cur = np.take(best, j, axis)
            prev = np.take(best, j - 1, axis)
            better = prev > cur
            idx = [slice(None)] * 2
            idx[axis] = j
            pidx = list(idx)
            pidx[axis] = j - 1
            best[tuple(idx)] = np.where(better, prev, cur)
            arg[tuple(idx)] = np.where(better, arg[tuple(pidx)], arg[tuple(idx)])
            where[tuple(idx)] = np.where(better[..., None], where[tuple(pidx)], where[tuple(idx)])
    return best, arg, where


def model_table(c: PipelineColumns, counts: np.ndarray) -> Table:
    """Unbounded knapsack over (A, B) with one pipeline per item: F[A, B] = max best[a, b] + F[A-a, B-b]."""
    best, arg, items = _best_single(c, counts)
    best, arg, where = _prefix_max(best, arg)
    na, nb = best.shape
    value = np.zeros((na, nb))
    step = np.zeros((na, nb, 2), int)
    item = np.full((na, nb), -1)
    for s in range(1, na * nb):
        aa, bb = divmod(s, nb)
        cand = best[:aa + 1, :bb + 1] + value[aa::-1, bb::-1]
        cand[0, 0] = -1.0
        j = int(np.argmax(cand))
        ja, jb = divmod(j, bb + 1)
        if cand[ja, jb] > 0:
            value[aa, bb] = cand[ja, jb]
            step[aa, bb] = where[ja, jb]
            item[aa, bb] = arg[ja, jb]
    return Table(value, step, item, items)


def rebuild(t: Table, a: int, b: int) -> list[tuple[int, float, tuple[int, ...]]]:
    """The pipelines (candidate, throughput, whole GPUs per partition) of F[a, b]."""
    out = []
    while a > 0 or b > 0:
        da, db = (int(x) for x in t.step[a, b])
        if da == db == 0:
            break
        if t.item[a, b] >= 0:  # else a step that leaves GPUs idle
            out.append(t.items[int(t.item[a, b])])
        a, b = a - da, b - db
    return out


def chosen(model: int, c: PipelineColumns, picks: list[tuple[int, float, tuple[int, ...]]]) -> list[ChosenPipeline]:
    """Picks as ChosenPipelines; a candidate picked twice is one pool with the summed GPUs."""
    pooled: dict[int, np.ndarray] = {}
    for i, _, w in picks:
        pooled[i] = pooled.get(i, 0) + np.asarray(w)
    out = []
    for i, w in pooled.items():
        k = int(c.num_parts[i])
        n = w * c.v[i, :k]
        out.append(ChosenPipeline(model, i, float(np.min(c.rate_rps[i, :k] * n)), tuple(int(x) for x in n)))
    return out


def combine(tables: list[Table], weights: list[float]) -> tuple[np.ndarray, list[np.ndarray]]:
    """acc[A, B] = max over splits of min_m F_m / w_m, and per added model the split that reaches it."""
    shape = tables[0].value.shape
    acc = tables[0].value / weights[0]
    splits: list[np.ndarray] = []
    for t, w in zip(tables[1:], weights[1:]):
        nxt = np.zeros(shape)
        arg = np.zeros(shape + (2,), int)
        for s in range(shape[0] * shape[1]):
            aa, bb = divmod(s, shape[1])
            v = np.minimum(acc[:aa + 1, :bb + 1], t.value[aa::-1, bb::-1] / w)
            j = int(np.argmax(v))
            nxt[aa, bb] = v.flat[j]
            arg[aa, bb] = divmod(j, bb + 1)
        acc = nxt
        splits.append(arg)
    return acc, splits


def split_max_min(splits: list[np.ndarray], at: tuple[int, int]) -> list[tuple[int, int]]:
    """GPUs (a_m, b_m) per model, within ``at``, maximising the smallest F_m / w_m (splits from combine)."""
    a, b = at
    out = []
    for arg in reversed(splits):  # the last model gets (a - a', b - b')
        pa, pb = (int(x) for x in arg[a, b])
        out.append((a - pa, b - pb))
        a, b = pa, pb
    out.append((a, b))
    return list(reversed(out))


def whole_gpu_plan(cands: list[PipelineColumns], counts: np.ndarray, weights: list[float]) -> list[ChosenPipeline]:
    """The best whole-GPU plan: max throughput (one model) or max smallest throughput/weight."""
    tables = [model_table(c, counts) for c in cands]
    if len(cands) == 1:
        a, b = (int(x) - 1 for x in tables[0].value.shape)
        return chosen(0, cands[0], rebuild(tables[0], a, b))
    out = []
    at = (tables[0].value.shape[0] - 1, tables[0].value.shape[1] - 1)
    for m, (a, b) in enumerate(split_max_min(combine(tables, weights)[1], at)):
        out += chosen(m, cands[m], rebuild(tables[m], a, b))
    return out
