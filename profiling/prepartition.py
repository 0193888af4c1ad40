"""Pre-partitioning: time every segment between consecutive cut points, group them into N balanced blocks.

Segments are timed one by one at batch 1 with real activations (each segment is fed what the
previous one produced), then grouped greedily: consecutive segments join a block until the running
total reaches the next multiple of 1/N of the whole (closing at whichever segment boundary lies
nearer to it), always leaving at least one segment for each remaining block.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnx.utils

from poolpipe_common.errors import InputError
from profiling.cutpoints import GraphCuts, Segment, find_cut_points
from profiling.devices import make_runner
from profiling.onnx_graph import (
    TensorSpec,
    extract,
    load_onnx,
    tensor_spec,
    value_infos,
    with_shapes,
)


@dataclass(frozen=True)
class BlockBoundaries:
    """One block: the segments it groups and the tensors leaving it."""

    segments: tuple[int, int]         # [first, end) segment indices
    output_tensors: tuple[str, ...]
    time_us: float                    # sum of its segments' batch-1 times on the pre-partitioning device


@dataclass(frozen=True)
class Prepartition:
    input_tensors: tuple[str, ...]
    blocks: tuple[BlockBoundaries, ...]
    segment_times_us: tuple[float, ...]


def model_input_specs(model: onnx.ModelProto) -> list[TensorSpec]:
    """Specs of the model's inputs; each must have a static shape apart from the batch dimension."""
    vis = value_infos(model)
    inits = {t.name for t in model.graph.initializer}
    specs = [tensor_spec(vis[i.name]) for i in model.graph.input if i.name not in inits]
    for s in specs:
        if not s.static:
            raise InputError(f"model input {s.name!r} has shape [batch, {', '.join(map(str, s.shape))}]: "
                             "profiling needs static dimensions after the batch; export the model with a fixed "
                             "input size")
    return specs


def random_feeds(specs: list[TensorSpec], batch: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Deterministic random inputs at ``batch``: normal floats, small non-negative integers."""
    rng = np.random.RandomState(seed)
    feeds = {}
    for s in specs:
        shape = (batch, *s.shape)
        if np.issubdtype(s.dtype, np.floating):
            feeds[s.name] = rng.randn(*shape).astype(s.dtype)
        elif s.dtype == np.bool_:
            feeds[s.name] = rng.randint(0, 2, size=shape).astype(np.bool_)
        else:
            feeds[s.name] = rng.randint(0, 4, size=shape).astype(s.dtype)
    return feeds


def time_runner_samples_us(run, feeds: dict[str, np.ndarray], repeats: int, warmup: int) -> list[float]:
    """Wall time of each of ``repeats`` runs of ``run(feeds)`` in µs after ``warmup`` untimed runs."""
    for _ in range(warmup):
        run(feeds)
    times = []
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter_ns()
        run(feeds)
        times.append((time.perf_counter_ns() - t0) / 1e3)
    return times


def time_runner_us(run, feeds: dict[str, np.ndarray], repeats: int, warmup: int) -> float:
    """Median wall time of ``run(feeds)`` in µs after ``warmup`` untimed runs."""
    return float(statistics.median(time_runner_samples_us(run, feeds, repeats, warmup)))


def segment_models(model: onnx.ModelProto, segments: list[Segment]) -> list[onnx.ModelProto]:
    """Each segment as a stand-alone ONNX model (``model`` must be shape-inferred)."""
    ex = onnx.utils.Extractor(model)
    return [extract(ex, list(s.inputs), list(s.outputs), f"segment {s.index}") for s in segments]


def time_segments_us(model: onnx.ModelProto, cuts: GraphCuts, device: str = "cpu", engine: str = "ort",
                     threads: int | None = None, repeats: int = 10, warmup: int = 3) -> list[float]:
    """Batch-1 median time of every segment, chained with real activations."""
    feeds = random_feeds(model_input_specs(model), 1)
    times = []
    for seg, sub in zip(cuts.segments(), segment_models(model, cuts.segments())):
        runner = make_runner(sub, device, engine, threads)
        times.append(time_runner_us(runner.run, {n: feeds[n] for n in seg.inputs}, repeats, warmup))
        feeds.update(zip(seg.outputs, runner.run({n: feeds[n] for n in seg.inputs})))
    return times


def group_segments(times_us: list[float], n_blocks: int) -> list[tuple[int, int]]:
    """Greedy balanced grouping of consecutive segments into ``n_blocks`` non-empty [first, end) ranges."""
    n = len(times_us)
    if not 1 <= n_blocks <= n:
        raise InputError(f"cannot make {n_blocks} blocks: the model has {n} segments between cut points "
                         f"(ask for 1..{n} blocks)")
    total = float(sum(times_us)) or 1.0
    cum = np.cumsum(times_us)
    ranges, start = [], 0
    for b in range(1, n_blocks):
        target = total * b / n_blocks
        # the block ends at segment index `end` (exclusive): at least one segment, leaving one per later block
        lo, hi = start + 1, n - (n_blocks - b)
        end = int(np.clip(np.searchsorted(cum, target, side="left") + 1, lo, hi))
        if end > lo and abs(cum[end - 2] - target) < abs(cum[end - 1] - target):
            end -= 1  # stopping one segment earlier lands nearer the target
        ranges.append((start, end))
        start = end
    ranges.append((start, n))
    return ranges


def prepartition(model_path: str | Path, n_blocks: int, device: str = "cpu", engine: str = "ort",
                 threads: int | None = None, max_tensors: int = 1, repeats: int = 10, warmup: int = 3
                 ) -> Prepartition:
    """Cut points of the model, timed on ``device``, grouped into ``n_blocks`` blocks of similar time."""
    model = with_shapes(load_onnx(model_path))
    return prepartition_model(model, n_blocks, device, engine, threads, max_tensors, repeats, warmup)


def prepartition_model(model: onnx.ModelProto, n_blocks: int, device: str = "cpu", engine: str = "ort",
                       threads: int | None = None, max_tensors: int = 1, repeats: int = 10, warmup: int = 3
                       ) -> Prepartition:
    """``prepartition`` on an already loaded, shape-inferred model."""
    cuts = find_cut_points(model, max_tensors)
    segs = cuts.segments()
    if n_blocks > len(segs):
        raise InputError(f"cannot make {n_blocks} blocks: the model has {len(segs)} segments between cut points "
                         f"with at most {max_tensors} crossing tensor(s) (ask for 1..{len(segs)} blocks)")
    times = time_segments_us(model, cuts, device, engine, threads, repeats, warmup) if n_blocks > 1 \
        else [0.0] * len(segs)
    blocks = tuple(BlockBoundaries((a, b), segs[b - 1].outputs, float(sum(times[a:b])))
                   for a, b in group_segments(times, n_blocks))
    return Prepartition(cuts.inputs, blocks, tuple(times))
