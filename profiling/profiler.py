"""Block profiler: time each block of an ONNX model at each batch size (and vGPU level) on one device type.

Blocks come from pre-partitioning (``n_blocks``) or from an existing profile (``like``), so that
profiles of one model measured on different device types can be merged. Each block runs as its own
ONNX sub-model on real activations (the block before it produces its input), ``warmup`` untimed
runs then the median of ``repeats`` timed runs. A vGPU level V > 1 runs V worker processes at once,
each limited to 1/V of the device (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100/V`` on a GPU, threads/V
on the CPU), barrier-synchronised before every block so that their interference is measured; the
level's latency is the median over the workers' medians.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import multiprocessing as mp
import os
import platform
import queue as queue_mod
import socket
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np
import onnx
import onnx.utils

from poolpipe_common.errors import InputError
from profiling.block_memory import memory_of_blocks
from profiling.corun import CoRunOptions, measure_interference
from profiling.devices import check_engine, cuda_device_name, make_runner
from profiling.input_sets import input_batches, load_input_set
from profiling.latency_quantiles import LatencyQuantiles
from profiling.onnx_graph import (
    TensorSpec,
    extract,
    graph_inputs,
    load_onnx,
    value_infos,
    with_shapes,
)
from profiling.prepartition import (
    model_input_specs,
    prepartition_model,
    random_feeds,
    time_runner_samples_us,
)
from profiling.profile import Block, DeviceTiming, Profile

METHOD = ("per block and batch size: median of `repeats` timed runs after `warmup` untimed runs; each block "
          "is its own ONNX sub-model fed real activations; vGPU level V>1: V worker processes at once, each with "
          "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100/V (cpu: threads/V), barrier-synchronised per block, median "
          "over workers")
WORKER_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class MeasureOptions:
    device: str = "cpu"
    engine: str = "ort"
    label: str = "cpu"
    threads: int | None = None
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8)
    repeats: int = 20
    warmup: int = 5
    vgpu_levels: tuple[int, ...] = (1,)
    max_tensors: int = 1
    # cpu only: the device class emulated is this many times slower; the partition backend stays busy
    # (sleeping) K x the engine time with the same setting, so profile and serving agree.
    emulate_slowdown: float = 1.0
    # >= 2: also record each block's latency at this many evenly spaced quantile levels of its timed runs (all
    # workers' runs together), the distribution of a variable-latency model; 0: the median only
    quantile_levels: int = 0
    # profile measure --inputs: real samples per model input (profiling.input_sets), timed in turn instead of
    # one random batch, so the quantiles span the inputs; None: random inputs
    inputs: dict[str, np.ndarray] | None = field(default=None, compare=False)

    @property
    def levels(self) -> tuple[float, ...]:
        n = self.quantile_levels
        return tuple(i / (n - 1) for i in range(n)) if n >= 2 else ()


@dataclass(frozen=True)
class BlockPlan:
    """Where the blocks of the profile start and end, by boundary tensor names."""

    input_tensors: tuple[str, ...]
    names: tuple[str, ...]
    output_tensors: tuple[tuple[str, ...], ...]
    origin: dict[str, Any] = field(default_factory=dict)


def blocks_like(model: onnx.ModelProto, like: Profile, like_path: str) -> BlockPlan:
    """The blocks of an existing profile, checked against ``model``'s tensors."""
    known = value_infos(model)
    inputs = like.input_tensors or tuple(graph_inputs(model.graph))
    for t in inputs:
        if t not in graph_inputs(model.graph):
            raise InputError(f"--like {like_path}: input tensor {t!r} is not an input of the model")
    outs = []
    for i, b in enumerate(like.blocks):
        if not b.output_tensors:
            raise InputError(f"--like {like_path}: blocks[{i}] has no output_tensors (a profile measured by "
                             "'poolpipe profile measure' has them)")
        for t in b.output_tensors:
            if t not in known:
                raise InputError(f"--like {like_path}: blocks[{i}] output tensor {t!r} is not in the model")
        outs.append(tuple(b.output_tensors))
    model_outputs = tuple(o.name for o in model.graph.output)
    if set(outs[-1]) != set(model_outputs):
        raise InputError(f"--like {like_path}: the last block ends at {list(outs[-1])}, not at the model's "
                         f"outputs {list(model_outputs)}")
    return BlockPlan(tuple(inputs), tuple(b.name for b in like.blocks), tuple(outs),
                     {"blocks_from": str(like_path)})


def blocks_prepartitioned(model: onnx.ModelProto, n_blocks: int, opts: MeasureOptions) -> BlockPlan:
    """N blocks of similar batch-1 time on the measured device (pre-partitioning)."""
    pp = prepartition_model(model, n_blocks, opts.device, opts.engine, opts.threads, opts.max_tensors,
                            repeats=max(3, opts.repeats // 2), warmup=max(1, opts.warmup))
    return BlockPlan(pp.input_tensors, tuple(f"block{i}" for i in range(n_blocks)),
                     tuple(b.output_tensors for b in pp.blocks),
                     {"blocks_from": "prepartition", "max_boundary_tensors": opts.max_tensors,
                      "segments": [list(b.segments) for b in pp.blocks],
                      "segment_times_us": [round(t, 1) for t in pp.segment_times_us]})


def block_models(model: onnx.ModelProto, plan: BlockPlan) -> list[onnx.ModelProto]:
    """Each block as a stand-alone ONNX sub-model (``model`` shape-inferred)."""
    ex = onnx.utils.Extractor(model)
    bounds = [plan.input_tensors, *plan.output_tensors]
    return [extract(ex, list(bounds[i]), list(bounds[i + 1]), f"block {i} ({plan.names[i]})")
            for i in range(len(plan.names))]


def _measure_blocks(models: list[bytes], input_specs: list[TensorSpec], opts: MeasureOptions, threads: int | None,
                    sync: Callable[[], None], report: Callable[[int, list[float]], None]) -> list[str]:
    """Time every block at every batch size, calling ``sync`` before and ``report(step, runs in µs)`` after each;
    returns the execution providers that ran them (every engine refuses to run on another than asked)."""
    subs = [onnx.load_from_string(m) for m in models]
    runners = [make_runner(s, opts.device, opts.engine, threads, max(opts.batch_sizes)) for s in subs]
    ins = [[i.name for i in s.graph.input if i.name not in {t.name for t in s.graph.initializer}] for s in subs]
    outs = [[o.name for o in s.graph.output] for s in subs]
    for bi, batch in enumerate(opts.batch_sizes):
        feed_sets = ([random_feeds(input_specs, batch)] if opts.inputs is None
                     else input_batches(opts.inputs, batch))
        repeats = max(1, -(-opts.repeats // len(feed_sets)))  # about opts.repeats runs over all the inputs
        for k, runner in enumerate(runners):
            sync()
            runs: list[float] = []
            for j, feeds in enumerate(feed_sets):
                block_feeds = {n: feeds[n] for n in ins[k]}
                runs += time_runner_samples_us(runner.run, block_feeds, repeats,
                                               opts.warmup if j == 0 else min(1, opts.warmup))
                feeds.update(zip(outs[k], runner.run(block_feeds)))
            report(bi * len(runners) + k, runs)
    return list(runners[0].providers)


def _worker(models: list[bytes], input_specs: list[TensorSpec], opts: MeasureOptions, v: int, threads: int | None,
            barrier: Any, results: Any, worker: int) -> None:
    """One of V concurrent processes of vGPU level V; sets its MPS share before any CUDA work."""
    os.environ["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(100 // v)
    try:
        providers = _measure_blocks(models, input_specs, opts, threads, lambda: barrier.wait(WORKER_TIMEOUT_S),
                                    lambda step, us: results.put((worker, step, us)))
        results.put((worker, -1, providers))
    except BaseException as e:  # reported to the parent, which fails the measurement with it
        barrier.abort()
        results.put((worker, -2, f"{type(e).__name__}: {e}"))


def _level_threads(opts: MeasureOptions, v: int) -> int | None:
    if opts.device != "cpu":
        return opts.threads
    total = opts.threads or os.cpu_count() or 1
    if total < v:
        raise InputError(f"--vgpu-levels {v} on cpu splits {total} thread(s) {v} ways; use --threads >= {v}")
    return total // v


def measure_level(models: list[bytes], input_specs: list[TensorSpec], opts: MeasureOptions, v: int,
                  tick: Callable[[], None] = lambda: None) -> tuple[np.ndarray, np.ndarray | None, list[str]]:
    """Latency matrix (blocks x batch sizes, µs) of one vGPU while V of them run at once (the median over the
    workers' medians), with ``opts.quantile_levels`` the quantiles of all their runs (blocks x sizes x levels), and
    the execution providers that ran them."""
    n_blocks, n_bs = len(models), len(opts.batch_sizes)
    threads = _level_threads(opts, v)
    lat = np.zeros((n_blocks, n_bs))
    quant = np.zeros((n_blocks, n_bs, len(opts.levels))) if opts.levels else None

    def store(step: int, runs: list[list[float]]) -> None:
        b, k = step % n_blocks, step // n_blocks
        lat[b, k] = round(float(np.median([np.median(r) for r in runs])) * opts.emulate_slowdown, 2)
        if quant is not None:
            quant[b, k] = np.round(np.quantile(np.concatenate(runs), opts.levels) * opts.emulate_slowdown, 2)
        tick()

    if v == 1:
        providers = _measure_blocks(models, input_specs, opts, threads, lambda: None, lambda s, us: store(s, [us]))
        return lat, quant, providers
    ctx = mp.get_context("spawn")  # fresh interpreters: no CUDA context inherited, MPS share set first
    barrier, results = ctx.Barrier(v), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(models, input_specs, opts, v, threads, barrier, results, w),
                         daemon=True) for w in range(v)]
    pending: dict[int, list[list[float]]] = {}
    providers: list[str] = []
    try:
        for p in procs:
            p.start()
        done = 0
        while done < v:
            try:
                worker, step, value = results.get(timeout=WORKER_TIMEOUT_S)
            except queue_mod.Empty:
                raise RuntimeError(f"vGPU level {v}: a worker process sent nothing for "
                                   f"{WORKER_TIMEOUT_S:.0f} s") from None
            if step == -2:
                raise RuntimeError(f"vGPU level {v}: worker {worker} failed: {value}")
            if step == -1:
                done += 1
                providers = value
                continue
            pending.setdefault(step, []).append(value)
            if len(pending[step]) == v:
                store(step, pending.pop(step))
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
                p.join()
    return lat, quant, providers


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _provenance(model_path: Path, opts: MeasureOptions) -> dict[str, Any]:
    import onnxruntime as ort
    p: dict[str, Any] = {
        "host": socket.gethostname(), "cpu_model": _cpu_model(), "cpu_count": os.cpu_count(),
        "device": opts.device, "engine": opts.engine, "threads": opts.threads or os.cpu_count(),
        "onnxruntime": ort.__version__, "onnx": onnx.__version__, "python": platform.python_version(),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "repeats": opts.repeats, "warmup": opts.warmup, "batch_sizes": list(opts.batch_sizes),
        "vgpu_levels": list(opts.vgpu_levels), "method": METHOD}
    if opts.levels:
        p["latency_quantiles"] = len(opts.levels)
        p["method"] += f"; latency_quantiles: {len(opts.levels)} levels over every timed run of every worker"
    if opts.inputs is not None:
        p["input_samples"] = len(next(iter(opts.inputs.values())))
        p["method"] += f"; timed over {p['input_samples']} given input samples in turn (--inputs)"
    if opts.emulate_slowdown != 1.0:
        p["emulate_slowdown"] = opts.emulate_slowdown
        p["method"] += (f"; emulated device class: engine time x {opts.emulate_slowdown:g} (the partition "
                        "backend's emulate_slowdown stays busy as long)")
    if opts.device == "cuda":
        p["gpu"] = cuda_device_name() or "unknown"
    return p


def measure_profile(model_path: str | Path, opts: MeasureOptions, n_blocks: int | None = None,
                    like: Profile | None = None, like_path: str = "", model_name: str | None = None,
                    progress: bool | None = None, inputs_path: Path | None = None,
                    co_run: tuple[Path, ...] = (), co_run_repeats: int = 10, co_run_level: int = 2) -> Profile:
    """Measure a profile of ``model_path`` on one device type (``opts.label``), all levels and batch sizes;
    timed over the samples of ``inputs_path`` (profiling.input_sets) where given, else over random inputs.
    Each block's weights and peak activations are recorded; with ``co_run`` models, the interference model
    fitted from block timings next to them (profiling.corun), every process at the MPS share of a 1/``co_run_level``
    vGPU."""
    from tqdm import tqdm

    check_engine(opts.device, opts.engine, (*opts.vgpu_levels, co_run_level) if co_run else opts.vgpu_levels)
    for v in opts.vgpu_levels:
        _level_threads(opts, v)
    model_path = Path(model_path)
    model = with_shapes(load_onnx(model_path))
    specs = model_input_specs(model)
    if inputs_path is not None:
        opts = replace(opts, inputs=load_input_set(Path(inputs_path), specs))
    if like is not None:
        plan = blocks_like(model, like, like_path)
    elif n_blocks is not None:
        plan = blocks_prepartitioned(model, n_blocks, opts)
    else:
        raise InputError("give --blocks N or --like EXISTING.json")
    subs = block_models(model, plan)

    # boundary sizes at batch 1, from the tensors the blocks actually produce
    feeds = random_feeds(specs, 1)
    out_bytes = []
    for sub in subs:
        runner = make_runner(sub, "cpu", "ort", opts.threads)
        ins = [i.name for i in sub.graph.input if i.name not in {t.name for t in sub.graph.initializer}]
        outs = runner.run({n: feeds[n] for n in ins})
        feeds.update(zip([o.name for o in sub.graph.output], outs))
        out_bytes.append(int(sum(o.nbytes for o in outs)))

    models = [s.SerializeToString() for s in subs]
    steps = len(opts.vgpu_levels) * len(subs) * len(opts.batch_sizes)
    timings: dict[int, DeviceTiming] = {}
    providers: list[str] = []
    with tqdm(total=steps, desc=f"profile {model_path.name} on {opts.label}", unit="block",
              disable=(None if progress is None else not progress)) as bar:
        for v in opts.vgpu_levels:
            bar.set_postfix_str(f"V={v}")
            lat, quant, ran = measure_level(models, specs, opts, v, lambda: bar.update(1))
            providers = providers or ran
            timings[v] = DeviceTiming(tuple(opts.batch_sizes), lat,
                                      None if quant is None else LatencyQuantiles(opts.levels, quant))

    blocks = tuple(Block(name, b, outs) for name, b, outs in zip(plan.names, out_bytes, plan.output_tensors))
    # the engine and the execution providers that ran the timed blocks (the Contract: provenance.engine/.providers)
    dev_prov = {**_provenance(model_path, opts), "providers": providers, **plan.origin}
    prov = {"source": "poolpipe profile measure", "model_file": model_path.name,
            "model_sha256": hashlib.sha256(model_path.read_bytes()).hexdigest(),
            **dev_prov, "devices": {opts.label: dev_prov}}
    input_bytes = int(sum(int(np.prod(s.shape)) * s.dtype.itemsize for s in specs if s.name in plan.input_tensors))
    name = model_name or (like.model if like is not None else model_path.stem)  # --like: mergeable by default
    memory = memory_of_blocks(subs, "ONNX initializers (weights) and inferred tensor shapes (peak activations)")
    interference = {}
    if co_run:
        copts = CoRunOptions(opts.device, opts.engine, opts.label, max(1, (opts.threads or 2) // 2),
                             co_run_repeats, max(1, opts.warmup), co_run_level)
        interference[opts.label] = measure_interference(subs, specs, list(co_run), copts)
    return Profile(name, blocks, {opts.label: timings}, input_bytes,
                   plan.input_tensors, prov, memory, interference)
