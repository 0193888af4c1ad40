"""The cases the benchmarks share, importable wherever they run from: `live_paper --models all`'s rows (every
data/ppipe model with an L4+T4 reference entry at each of ALL_FACTORS) and promise_grid's simulated grid (one model
alone on HIGH+LOW GPUs at an SLO factor), with the flags that choose the grid's cases; how the live benchmarks read
a MODEL@SLO_FACTOR and whether their clients can use the native front end."""

from __future__ import annotations

import argparse
import dataclasses
import os

from planner.ppipe.reference_plans import load_reference_plans, spec_from_reference
from plans.spec.planning_spec import ClusterSpec, PlanningSpec, check_spec

ALL_FACTORS = (2.5, 3.0)  # live_paper --models all: every model at each of these SLO factors
PAIRS = (("L4", "T4"), ("L4", "P4"), ("V100", "T4"), ("V100", "P4"))
FACTORS = (2.0, 3.0, 4.0)
SIZES = ((4, 12), (8, 24))

Case = tuple[str, tuple[str, str], tuple[int, int], float]  # (model, HIGH+LOW pair, their GPU counts, SLO factor)


def all_models() -> list[str]:
    """Every model of data/ppipe with an L4+T4 reference entry, at each of ALL_FACTORS (MODEL@FACTOR)."""
    names = sorted({e["models"][0]["model"] for e in load_reference_plans()
                    if e["suite"] == "ablation" and tuple(e["cluster"]["gpu_name_arr"]) == ("L4", "T4")})
    return [f"{m}@{f:g}" for m in names for f in ALL_FACTORS]


def model_entry(ap: argparse.ArgumentParser, text: str, flag: str) -> tuple[str, float]:
    """MODEL or MODEL@SLO_FACTOR -> (model, factor; 3 when not given); a bad factor is a usage error of ``flag``."""
    model, _, at = text.partition("@")
    try:
        factor = float(at) if at else 3.0
    except ValueError:
        factor = -1.0
    if not factor > 0:
        ap.error(f"{flag}: {text!r}: expected MODEL or MODEL@SLO_FACTOR with a factor > 0")
    return model, factor


def native_front_built(who: str) -> bool:
    """Whether serve --native-grpc-port can run here (make venv builds it where a C compiler is); says so if not."""
    from backends import native_front

    if native_front.library() is None:
        print(f"{who}: the native front end is not built (no C compiler): clients use the sidecar's grpc.aio port")
        return False
    return True


def case_spec(model: str, pair: tuple[str, str], size: tuple[int, int], factor: float) -> PlanningSpec:
    """One model alone on ``size`` GPUs of ``pair``, with the NICs, vGPU levels and batch terms of the reference
    entry that plans it on that pair, and SLO = ``factor`` x its batch-1 latency on the high-class GPU."""
    entry = next(e for e in load_reference_plans() if tuple(e["cluster"]["gpu_name_arr"]) == pair
                 and any(m["model"] == model for m in e["models"]))
    spec = spec_from_reference(entry)
    ms = next(m for m in spec.models if m.profile.model == model)
    slo = factor * ms.profile.latency_us(pair[0], 1, 1, 0, len(ms.profile.blocks))
    c = spec.cluster
    cluster = ClusterSpec(dict(zip(pair, size)), c.gpus_per_server, c.bandwidth_gbps, c.vgpu_levels)
    return check_spec(dataclasses.replace(spec, cluster=cluster, models=(
        dataclasses.replace(ms, slo_us=slo, slo_margin_us=0.0, weight=1.0),)))


def grid_arguments(ap: argparse.ArgumentParser) -> None:
    """The flags that choose the grid's cases (:func:`grid_cases`), and --jobs."""
    ap.add_argument("--quick", action="store_true", help="L4+T4, 4+12 GPUs, SLO 3x, every model")
    ap.add_argument("--models", help="comma list of data/ppipe models (default: all twelve)")
    ap.add_argument("--pairs", help="comma list of HIGH+LOW cluster pairs, e.g. L4+T4,V100+P4 (default: all four)")
    ap.add_argument("--factors", help="comma list of SLO factors (default: 2,3,4)")
    ap.add_argument("--sizes", help="comma list of HIGH+LOW GPU counts, e.g. 4+12 (default: 4+12,8+24)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)


def grid_cases(args: argparse.Namespace) -> list[Case]:
    """(model, pair, size, factor) for every case the flags of :func:`grid_arguments` choose."""
    models = args.models.split(",") if args.models else sorted({
        m["model"] for e in load_reference_plans() for m in e["models"]})
    pairs, factors, sizes = (PAIRS[:1], (3.0,), SIZES[:1]) if args.quick else (PAIRS, FACTORS, SIZES)
    pairs = tuple(tuple(p.split("+")) for p in args.pairs.split(",")) if args.pairs else pairs
    factors = tuple(float(x) for x in args.factors.split(",")) if args.factors else factors
    sizes = tuple(tuple(int(n) for n in s.split("+")) for s in args.sizes.split(",")) if args.sizes else sizes
    return [(m, p, s, f) for m in models for p in pairs for s in sizes for f in factors]
