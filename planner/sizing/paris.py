"""PARIS instance sizing (PARIS/ELSA, Sec. IV-B, Algorithm 1) over the unequal vGPU sizes of one GPU type.

From each size's whole-model latency curve: its utilisation at batch b is its throughput at b over its best
throughput at any profiled batch (our profiles have no SM counters; this is the share of the size's peak
that batch b reaches), and its knee batch is the smallest batch reaching 80 % (capped at the largest batch
that meets the SLO). The knees, smallest size first and made non-decreasing, cut the batch-size PDF into
ranges (B_{k-1}, B_k]; the largest size takes every batch above the previous knee. Size k then needs
R_k = sum over its range of P(b) x latency_k(b) instance-seconds per batch (the paper's Dist / Throughput),
so a batch rate lambda needs lambda x R_k instances of it. The paper scales R to a budget of GPCs
(``paper_counts``); here the GPUs must also be split into whole allowed splits (MPS splits or MIG
geometries), so a small integer programme picks how many GPUs take each split to carry the largest
lambda, then spends what is left (``pack_splits``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from planner.sizing.size_profiles import sized_device, sized_profile
from planner.solvers.milp_solvers import MilpArrays, SolverOptions, solve_milp
from plans.plan_json import ModelPlan, PartitionPlan, PipelinePlan, Plan
from plans.spec.planning_spec import ModelSpec, PlanningSpec
from plans.spec.vgpu_sizes import GpuSplits
from poolpipe_common.errors import InputError

KNEE_UTILISATION = 0.8


@dataclass(frozen=True)
class SizeCurve:
    """Whole-model latency of one vGPU of a size at each profiled batch (within the SLO)."""

    label: str
    share: float
    latency_us: dict[int, float]

    def rate_bps(self, b: int) -> float:
        """Batches per second at batch b (the next profiled batch up serves a batch between two)."""
        return 1e6 / self.latency_at(b)

    def latency_at(self, b: int) -> float:
        up = [x for x in sorted(self.latency_us) if x >= b]
        if not up:
            raise KeyError(b)
        return self.latency_us[up[0]]

    def utilisation(self, b: int) -> float:
        peak = max(x * 1e6 / lat for x, lat in self.latency_us.items())
        return b * self.rate_bps(b) / peak

    @property
    def max_batch(self) -> int:
        return max(self.latency_us)


def knee_batch(c: SizeCurve, threshold: float = KNEE_UTILISATION) -> int:
    """The smallest profiled batch at which the size reaches ``threshold`` of its peak throughput."""
    return min(b for b in sorted(c.latency_us) if c.utilisation(b) >= threshold - 1e-12)


def check_pdf(pdf: Mapping[int, float], where: str = "--batch-pdf") -> dict[int, float]:
    """A batch-size PDF normalised to sum 1 (batch sizes >= 1, weights >= 0, not all 0)."""
    out = {}
    for b, p in pdf.items():
        if isinstance(b, bool) or not isinstance(b, int) or b < 1:
            raise InputError(f"{where}: batch sizes must be whole numbers >= 1, got {b!r}")
        if not isinstance(p, (int, float)) or isinstance(p, bool) or not math.isfinite(p) or p < 0:
            raise InputError(f"{where}: the weight of batch {b} must be a number >= 0, got {p!r}")
        if p > 0:
            out[b] = float(p)
    total = sum(out.values())
    if not total:
        raise InputError(f"{where}: every weight is 0; give the share of batches of each size, e.g. 1=0.5,2=0.3,4=0.2")
    return {b: p / total for b, p in sorted(out.items())}


def size_curves(model: ModelSpec, gpu: str, splits: GpuSplits) -> list[SizeCurve]:
    """Each size's curve from the sized profile, keeping batches within the model's SLO; smallest share first."""
    prof = sized_profile(model.profile, {gpu: splits})
    out = []
    for s in splits.sizes:
        dev = sized_device(gpu, s.label)
        if dev not in prof.timings:
            continue
        lat = {b: prof.latency_us(dev, 1, b) for b in prof.batch_sizes(dev, 1)}
        ok = {b: x for b, x in lat.items()
              if x + model.batch_wait_us_per_request * (b - 1) + model.slo_margin_us + model.stage_overhead_us
              <= model.slo_us}
        if ok:
            out.append(SizeCurve(s.label, s.share, ok))
    if not out:
        raise InputError(f"model {model.name}: no vGPU size of {gpu} meets the SLO even at batch 1 (or the profile "
                         f"has no {gpu} timings to derive them from)")
    return sorted(out, key=lambda c: c.share)


def batch_ranges(curves: list[SizeCurve], pdf: Mapping[int, float]) -> list[tuple[int, int]]:
    """(lo, hi]: the batches each size serves (knees made non-decreasing; the last size takes the rest)."""
    top = max(pdf)
    if top > curves[-1].max_batch:
        raise InputError(f"the batch-size PDF has batches up to {top}, but the largest size "
                         f"({curves[-1].label}) runs at most batch {curves[-1].max_batch} within the SLO")
    out, lo = [], 0
    for i, c in enumerate(curves):
        hi = top if i == len(curves) - 1 else min(max(knee_batch(c), lo), top)
        out.append((lo, hi))
        lo = hi
    return out


def instance_seconds(curves: list[SizeCurve], ranges: list[tuple[int, int]], pdf: Mapping[int, float]) -> list[float]:
    """R_k: instance-seconds of size k per batch (Algorithm 1, step B)."""
    return [sum(p / c.rate_bps(b) for b, p in pdf.items() if lo < b <= hi) for c, (lo, hi) in zip(curves, ranges)]


def counts_for_rate(r: list[float], batch_rate: float) -> list[int]:
    """Instances of each size that carry ``batch_rate`` batches/s (each fully busy at most)."""
    return [math.ceil(batch_rate * x - 1e-9) for x in r]


def paper_counts(r: list[float], shares: list[float], total_share: float) -> list[float]:
    """Algorithm 1, step C: instance counts in the ratio of R, scaled to ``total_share`` whole GPUs."""
    denom = sum(s * x for s, x in zip(shares, r))
    return [total_share * x / denom for x in r] if denom > 0 else [0.0] * len(r)


def pack_splits(r: list[float], labels: list[str], splits: GpuSplits, gpus: int, opts: SolverOptions
                ) -> tuple[float, dict[tuple[str, ...], int]]:
    """(largest batch rate lambda, GPUs per split) with lambda R_k <= vGPUs of size k, at most ``gpus`` GPUs;
    a second solve keeps lambda and spends leftover GPUs on the most instance-seconds."""
    pats = list(splits.patterns)
    npat = len(pats)
    rows, cols, vals, hi = [], [], [], []
    for k, (label, x) in enumerate(zip(labels, r)):
        rows += [k] * (npat + 1)
        cols += [0] + [1 + g for g in range(npat)]
        vals += [x] + [-float(p.count(label)) for p in pats]
        hi.append(0.0)
    rows += [len(labels)] * npat
    cols += [1 + g for g in range(npat)]
    vals += [1.0] * npat
    hi.append(float(gpus))
    n = 1 + npat
    upper = np.r_[np.inf, np.full(npat, float(gpus))]
    integer = np.r_[False, np.ones(npat, bool)]
    args = (upper, integer, np.array(rows), np.array(cols), np.array(vals, float),
            np.full(len(hi), -np.inf), np.array(hi))
    first = solve_milp(MilpArrays(np.r_[1.0, np.zeros(npat)], np.zeros(n), *args), opts.solver, opts.time_limit_s,
                       opts.rel_gap)
    if first.x is None or not first.objective:
        raise InputError(f"PARIS: no split of {gpus} {splits.gpu} GPU(s) gives every needed size an instance")
    lam = float(first.objective)
    lower = np.r_[lam * (1 - 1e-7), np.zeros(npat)]
    fill = np.r_[0.0, [sum(r[labels.index(lb)] for lb in p if lb in labels) for p in pats]]
    second = solve_milp(MilpArrays(fill, lower, *args), opts.solver, opts.time_limit_s, opts.rel_gap, start=first.x)
    x = second.x if second.x is not None else first.x
    return lam, {p: int(round(x[1 + g])) for g, p in enumerate(pats) if round(x[1 + g]) > 0}


@dataclass(frozen=True)
class ParisSizing:
    """What PARIS decided, for the report: knees, ranges, R, instance counts, splits and the batch rate."""

    gpu: str
    curves: tuple[SizeCurve, ...]
    knees: tuple[int, ...]
    ranges: tuple[tuple[int, int], ...]
    instance_seconds: tuple[float, ...]
    counts: tuple[int, ...]
    splits: dict[tuple[str, ...], int]
    batch_rate: float
    # (size, batch rate) where one size alone, on every GPU, carries more than the mix: the plan uses it
    fallback: tuple[str, float] | None = None

    def lines(self) -> list[str]:
        out = [f"PARIS on {self.gpu}: knee = smallest batch at >= {KNEE_UTILISATION:.0%} of the size's peak "
               f"throughput; capacity {self.batch_rate:,.1f} batches/s"]
        for c, kb, (lo, hi), r, n in zip(self.curves, self.knees, self.ranges, self.instance_seconds, self.counts):
            rng = f"batches {lo + 1}..{hi}" if hi > lo else "no batches"
            out.append(f"  {c.label:>8}: knee batch {kb}, {rng}, R = {r * 1e3:.3f} ms/batch, {n} instance(s)")
        out.append("  splits: " + ", ".join(f"{n} x [{' + '.join(p)}]" for p, n in self.splits.items()))
        if self.fallback:
            label, rate = self.fallback
            out.append(f"  the mix carries {self.batch_rate:,.1f} batches/s, {label} instances alone on every GPU "
                       f"{rate:,.1f}: the plan uses {label} alone (the mix is kept only where it carries more)")
        return out


def paris_sizing(model: ModelSpec, gpu: str, splits: GpuSplits, gpus: int, pdf: Mapping[int, float],
                 opts: SolverOptions) -> ParisSizing:
    pdf = check_pdf(pdf)
    curves = size_curves(model, gpu, splits)
    ranges = batch_ranges(curves, pdf)
    r = instance_seconds(curves, ranges, pdf)
    labels = [c.label for c in curves]
    used = [lb for lb, x in zip(labels, r) if x > 0]
    lam, chosen = pack_splits([x for x in r if x > 0], used, splits, gpus, opts)
    counts = tuple(sum(p.count(lb) * n for p, n in chosen.items()) for lb in labels)
    return ParisSizing(gpu, tuple(curves), tuple(knee_batch(c) for c in curves), tuple(ranges), tuple(r),
                       counts, chosen, lam)


def paris_type(spec: PlanningSpec) -> tuple[str, GpuSplits]:
    sizes = spec.cluster.vgpu_sizes or {}
    if len(spec.models) != 1:
        raise InputError(f"--paris sizes instances for one model; the spec has {len(spec.models)}")
    if len(sizes) != 1:
        raise InputError("--paris needs cluster.vgpu_sizes for exactly one GPU type (the GPUs PARIS splits), "
                         f"got {len(sizes)}")
    return next(iter(sizes.items()))


def plan_from_counts(spec: PlanningSpec, gpu: str, curves: list[SizeCurve], batches: list[int], counts: list[int],
                     rates_rps: list[float], splits: dict[tuple[str, ...], int], planner: str, seconds: float) -> Plan:
    """A plan of whole-model pipelines, one per size with instances (its batch, vGPUs and planned rate)."""
    m = spec.models[0]
    prof = sized_profile(m.profile, {gpu: spec.cluster.vgpu_sizes[gpu]})
    pipes = []
    for c, b, n, rate in zip(curves, batches, counts, rates_rps):
        if n <= 0:
            continue
        top = max(x for x in c.latency_us if x <= max(b, min(c.latency_us)))
        part = PartitionPlan((0, prof.num_blocks), gpu, 1, top, n, c.latency_us[top], 0.0, size=c.label, share=c.share)
        pipes.append(PipelinePlan((part,), rate, c.latency_us[top]))
    thr = sum(p.throughput_rps for p in pipes)
    mp = ModelPlan(m.name, m.slo_us, thr, tuple(pipes), prof, m.weight, m.slo_margin_us,
                   m.batch_wait_us_per_request)
    gsplits: dict[str, list[dict[str, Any]]] = {gpu: [{"vgpus": list(p), "gpus": n} for p, n in splits.items()]}
    return Plan(planner, "highs", seconds, spec.cluster, (mp,), spec.to_dict(), "optimal", thr, gpu_splits=gsplits)


def single_size_rates(z: ParisSizing, splits: GpuSplits, gpus: int, pdf: Mapping[int, float]) -> dict[str, float]:
    """The batch rate each size carries alone with every GPU split for the most instances of it (the same model
    as the mix: lambda x R <= instances), for the sizes that run every batch of the PDF within the SLO."""
    out = {}
    for c in z.curves:
        if max(pdf) <= c.max_batch:
            r = sum(p / c.rate_bps(b) for b, p in pdf.items())
            out[c.label] = gpus * max(pat.count(c.label) for pat in splits.patterns) / r
    return out


def paris_plan(spec: PlanningSpec, pdf: Mapping[int, float], opts: SolverOptions, mix_only: bool = False
               ) -> tuple[Plan, ParisSizing]:
    """The PARIS plan of the spec's one model on its GPU type with vgpu_sizes (other GPU types are not used).
    Where one size alone carries a higher batch rate than PARIS's mix in PARIS's own model (the knees do not
    weigh that a small size's instances only take small batches), the plan is that size alone, unless
    ``mix_only`` (the paper's algorithm as it is)."""
    t0 = time.perf_counter()
    gpu, splits = paris_type(spec)
    z = paris_sizing(spec.models[0], gpu, splits, spec.cluster.gpus[gpu], pdf, opts)
    p = check_pdf(pdf)
    alone = {} if mix_only else single_size_rates(z, splits, spec.cluster.gpus[gpu], p)
    best = max(alone, key=alone.__getitem__, default=None)
    if best is not None and alone[best] > z.batch_rate * (1 + 1e-6):
        plan = replace(single_size_plan(spec, best), planner="paris", solve_seconds=time.perf_counter() - t0)
        return plan, replace(z, fallback=(best, alone[best]))
    rates = [z.batch_rate * sum(q * b for b, q in p.items() if lo < b <= hi) for lo, hi in z.ranges]
    plan = plan_from_counts(spec, gpu, list(z.curves), [hi for _, hi in z.ranges], list(z.counts), rates, z.splits,
                            "paris", time.perf_counter() - t0)
    return plan, z


def single_size_plan(spec: PlanningSpec, label: str) -> Plan:
    """Every GPU of the PARIS type split into the allowed split with the most vGPUs of ``label`` (only that
    size serves), each vGPU taking batches up to its largest within the SLO: the homogeneous baseline."""
    gpu, splits = paris_type(spec)
    curves = {c.label: c for c in size_curves(spec.models[0], gpu, splits)}
    if label not in curves:
        raise InputError(f"size {label} of {gpu} cannot serve {spec.models[0].name} within its SLO")
    pat = max(splits.patterns, key=lambda p: (p.count(label), -len(p)))
    n = spec.cluster.gpus[gpu]
    c = curves[label]
    rate = pat.count(label) * n * c.max_batch * c.rate_bps(c.max_batch)
    return plan_from_counts(spec, gpu, [c], [c.max_batch], [pat.count(label) * n], [rate], {pat: n},
                            f"single-{label}", 0.0)


def batch_pdf_arg(text: str) -> dict[int, float]:
    """--batch-pdf: 'B=P,...' (e.g. 1=0.5,2=0.3,4=0.2), or a JSON file with ``batch_sizes`` (batch -> count) or
    a ``poolpipe simulate`` result.json (the batch log of its point at max_load_factor, else its last point)."""
    import json
    from pathlib import Path

    path = Path(text)
    if path.is_file():
        try:
            d = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise InputError(f"--batch-pdf {text}: not a readable JSON file ({e})") from None
        if isinstance(d, dict) and isinstance(d.get("points"), list) and d["points"]:
            pts = d["points"]
            at = [p for p in pts if p.get("load_factor") == d.get("max_load_factor")]
            d = (at or pts)[-1]
        raw = d.get("batch_sizes") if isinstance(d, dict) else None
        if not isinstance(raw, dict) or not raw:
            raise InputError(f"--batch-pdf {text}: expected a JSON object with batch_sizes {{batch: count}} or a "
                             "poolpipe simulate result.json")
        items = list(raw.items())
    else:
        items = [tuple(x.split("=", 1)) if "=" in x else (x, "") for x in text.split(",")]
    try:
        return check_pdf({int(b): float(p) for b, p in items})
    except ValueError:
        raise InputError(f"--batch-pdf {text!r}: expected BATCH=WEIGHT[,...] (e.g. 1=0.5,2=0.3,4=0.2) or a JSON "
                         "file") from None
