"""Whole-pipeline candidates of one model: enumeration on the reference planner's terms, and pruning.

A candidate is one pooled pipeline shape: K <= max_partitions partitions at positions 0..K-1, each
with its blocks [first, end), GPU type, vGPU level V and batch. Its per-vGPU throughput per
partition is min(batch / latency, NIC-in rate, NIC-out rate) where a NIC rate is
1e6 / (per-request transfer µs x V x GPUs per server), applied at the partition's input and output
cuts only (the model's own input and final output are not limited). Its latency is the sum of
partition latencies (each block counted as at least 1 µs) plus the transfer of one batch at every
cut, plus the batch-forming delay ``batch_wait_us_per_request x (batch - 1)``, the SLO margin and the
per-stage cost of serving (``stage_overhead_us`` per partition); a
candidate over the SLO is discarded before solving.

Pruning keeps a candidate unless another of the same model, the same number of partitions and the
same GPU type at every position does at least as well at every position in throughput per
physical GPU with a vGPU level that is a multiple of its own. Such a candidate can replace it in
any MILP solution (same physical GPUs per position, whole vGPU counts, at least the throughput), so
pruning never loses the optimum.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from plans.spec.planning_spec import ClusterSpec, ModelSpec
from profiling.profile import MIN_BLOCK_US

LATENCY_TOLERANCE_US = 1e-6


@dataclass(frozen=True)
class PartitionOption:
    """One way to run a partition: GPU type (index into the cluster's types), vGPU level, batch."""

    gpu: int
    v: int
    batch: int


@dataclass(frozen=True)
class PipelineColumns:
    """Pipeline candidates of one model as parallel arrays; unused positions hold -1 / 0."""

    num_parts: np.ndarray  # (C,) K
    cuts: np.ndarray  # (C, P + 1) block boundaries; entries after K are the number of blocks
    gpu: np.ndarray  # (C, P) GPU type index, -1 where unused
    v: np.ndarray  # (C, P) vGPU level, 0 where unused
    batch: np.ndarray  # (C, P) batch, 0 where unused
    rate_rps: np.ndarray  # (C, P) throughput of one vGPU, 0 where unused
    latency_us: np.ndarray  # (C, P) partition latency at its batch
    transfer_us: np.ndarray  # (C, P) transfer of one batch out of the partition (0 for the last)
    pipeline_latency_us: np.ndarray  # (C,) partitions + transfers + batch forming + margin

    def __len__(self) -> int:
        return len(self.num_parts)

    def take(self, idx: np.ndarray) -> PipelineColumns:
        return PipelineColumns(*(getattr(self, f)[idx] for f in self.__dataclass_fields__))

    @staticmethod
    def concat(parts: list[PipelineColumns], max_parts: int) -> PipelineColumns:
        if not parts:
            return PipelineColumns.empty(max_parts)
        return PipelineColumns(*(np.concatenate([getattr(p, f) for p in parts])
                                 for f in PipelineColumns.__dataclass_fields__))

    @staticmethod
    def empty(max_parts: int) -> PipelineColumns:
        z = np.zeros((0, max_parts))
        return PipelineColumns(np.zeros(0, int), np.zeros((0, max_parts + 1), int), z.astype(int), z.astype(int),
                          z.astype(int), z, z, z, np.zeros(0))


def transfer_us_per_request(model: ModelSpec, bandwidth_gbps: float) -> np.ndarray:
    """Per-request transfer µs at every cut 0..N (inf where the boundary size is unknown; 0 at the ends)."""
    prof = model.profile
    n = prof.num_blocks
    out = np.zeros(n + 1)
    for cut in range(1, n):
        b = prof.blocks[cut - 1].output_bytes
        out[cut] = np.inf if b is None else b * 8 / (bandwidth_gbps * 1e9) * 1e6
    return out


def partition_options(model: ModelSpec, cluster: ClusterSpec, gpu_types: list[str]) -> list[PartitionOption]:
    """Every (GPU type, V, batch) the model's profile and the cluster's vGPU levels allow."""
    prof = model.profile
    opts = []
    for ti, t in enumerate(gpu_types):
        if t not in prof.timings or cluster.gpus.get(t, 0) <= 0:
            continue
        for v in range(1, cluster.vgpu_levels.get(t, 1) + 1):
            if v in prof.timings[t]:
                opts.extend(PartitionOption(ti, v, b) for b in prof.batch_sizes(t, v))
    return opts


def _option_tables(model: ModelSpec, cluster: ClusterSpec, gpu_types: list[str], opts: list[PartitionOption],
                   tr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """LAT[o, i, j] = latency of blocks [i, j) with option o; RATE[o, i, j] = per-vGPU throughput."""
    prof = model.profile
    n = prof.num_blocks
    cum = np.zeros((len(opts), n + 1))
    for k, o in enumerate(opts):
        col = prof.timings[gpu_types[o.gpu]][o.v].column(o.batch)
        cum[k, 1:] = np.cumsum(np.maximum(col, MIN_BLOCK_US))
    lat = cum[:, None, :] - cum[:, :, None]  # [o, i, j] = cum[j] - cum[i]
    v = np.array([o.v for o in opts], float)
    gps = np.array([cluster.gpus_per_server.get(gpu_types[o.gpu], 1) for o in opts], float)
    b = np.array([o.batch for o in opts], float)
    with np.errstate(divide="ignore", invalid="ignore"):
        infer = np.where(lat > 0, b[:, None, None] * 1e6 / lat, 0.0)
        nic = np.where(tr > 0, 1e6 / (tr[None, :] * (v * gps)[:, None]), np.inf)  # [o, cut]
    rate = np.minimum(infer, np.minimum(nic[:, :, None], nic[:, None, :]))
    return lat, rate


def enumerate_candidates(model: ModelSpec, cluster: ClusterSpec, gpu_types: list[str], max_parts: int,
                         batch_unification: bool, prune: bool = False, chunk_cells: int = 2_000_000) -> PipelineColumns:
    """All pipelines within the latency budget (numpy, vectorised over cuts x option tuples, in chunks
    of about ``chunk_cells`` pipelines); with ``prune``, dominated candidates are dropped on the way."""
    n = model.profile.num_blocks
    opts = partition_options(model, cluster, gpu_types)
    if not opts:
        return PipelineColumns.empty(max_parts)
    tr = transfer_us_per_request(model, cluster.bandwidth_gbps)
    lat_t, rate_t = _option_tables(model, cluster, gpu_types, opts, tr)
    og = np.array([o.gpu for o in opts])
    ov = np.array([o.v for o in opts])
    ob = np.array([o.batch for o in opts])
    limit = model.slo_us + LATENCY_TOLERANCE_US  # the totals below include the margin
    inner = [c for c in range(1, n) if np.isfinite(tr[c])]
    found = []
    for k in range(1, min(max_parts, n) + 1):
        cuts = np.array([(0, *c, n) for c in itertools.combinations(inner, k - 1)], int).reshape(-1, k + 1)
        if not len(cuts):
            continue
        if batch_unification:
            groups = [np.flatnonzero(ob == b).tolist() for b in sorted(set(ob.tolist()))]
        else:
            groups = [list(range(len(opts)))]
        tuples = np.array([t for g in groups for t in itertools.product(g, repeat=k)], int).reshape(-1, k)
        step = max(1, chunk_cells // len(cuts))
        for s0 in range(0, len(tuples), step):
            ot = tuples[s0:s0 + step]  # (T, k) option per position
            lat = np.stack([lat_t[ot[:, p][:, None], cuts[None, :, p], cuts[None, :, p + 1]] for p in range(k)], -1)
            rate = np.stack([rate_t[ot[:, p][:, None], cuts[None, :, p], cuts[None, :, p + 1]] for p in range(k)], -1)
            trans = np.zeros_like(lat)
            for p in range(k - 1):
                trans[..., p] = tr[cuts[:, p + 1]][None, :] * ob[ot[:, p]][:, None]
            total = (lat.sum(-1) + trans.sum(-1) + model.batch_wait_us_per_request * (ob[ot[:, 0]] - 1)[:, None]
                     + model.slo_margin_us + k * model.stage_overhead_us)
            ti, ci = np.nonzero((total <= limit) & (rate.min(-1) > 0))
            if not len(ti):
                continue
            pad = max_parts - k
            sel_o = ot[ti]
            chunk = PipelineColumns(
                num_parts=np.full(len(ti), k),
                cuts=np.pad(cuts[ci], ((0, 0), (0, pad)), constant_values=n),
                gpu=np.pad(og[sel_o], ((0, 0), (0, pad)), constant_values=-1),
                v=np.pad(ov[sel_o], ((0, 0), (0, pad))),
                batch=np.pad(ob[sel_o], ((0, 0), (0, pad))),
                rate_rps=np.pad(rate[ti, ci], ((0, 0), (0, pad))),
                latency_us=np.pad(lat[ti, ci], ((0, 0), (0, pad))),
                transfer_us=np.pad(trans[ti, ci], ((0, 0), (0, pad))),
                pipeline_latency_us=total[ti, ci])
            found.append(prune_dominated(chunk) if prune else chunk)
    out = PipelineColumns.concat(found, max_parts)
    return prune_dominated(out) if prune and len(found) > 1 else out


def prune_dominated(c: PipelineColumns) -> PipelineColumns:
    """Drop candidates that another of the same shape beats at every position (see module doc)."""
    if len(c) <= 1:
        return c
    per_gpu = c.rate_rps * c.v  # throughput per physical GPU at each position
    v_all = np.where(c.v > 0, c.v, 1)
    key = np.concatenate([c.num_parts[:, None], c.gpu], 1)
    _, group = np.unique(key, axis=0, return_inverse=True)
    group = group.ravel()
    keep = []
    for g in np.unique(group):
        idx = np.flatnonzero(group == g)
        r, v = per_gpu[idx], v_all[idx]
        # A dominator never comes after what it dominates in this order: higher total per-GPU rate
        # first; at equal rates, finer... coarser splits (multiples) first; then by index.
        score = (r / np.maximum(r.max(0), 1e-12)).sum(1)
        order = np.lexsort((np.arange(len(idx)), -v.sum(1), -np.round(score, 12)))
        r, v, idx = r[order], v[order], idx[order]
        alive = np.ones(len(idx), bool)
        for i in range(len(idx)):
            if not alive[i]:
                continue
            rest = slice(i + 1, None)
            dom = ((r[i] >= r[rest] - 1e-9).all(1) & (v[i] % v[rest] == 0).all(1))
            alive[rest] &= ~dom
        keep.append(idx[alive])
    return c.take(np.sort(np.concatenate(keep)))


def partition_rate_rps(model: ModelSpec, cluster: ClusterSpec, gpu: str, v: int, batch: int,
                       first: int, end: int) -> float:
    """Throughput of one vGPU running blocks [first, end) (the same rule as the candidates)."""
    tr = transfer_us_per_request(model, cluster.bandwidth_gbps)
    lat = model.profile.latency_us(gpu, v, batch, first, end)
    nic = v * cluster.gpus_per_server.get(gpu, 1)
    rates = [batch * 1e6 / lat if lat > 0 else np.inf]
    rates += [1e6 / (tr[c] * nic) for c in (first, end) if tr[c] > 0]
    return float(min(rates))
