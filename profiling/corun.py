"""``profile measure --co-run``: time each block while other models run on the same device in other processes,
and fit the interference model (profiling.interference) from the slowdowns.

Each co-runner process runs its whole model at batch 1 in a loop at a duty cycle u (run, then idle for
(1-u)/u of the run), so the fit sees both the co-runners' utilisation and their memory pressure. The
configurations are every co-runner alone and (with several) all of them together, each at u = 1 and 0.5.
On a CPU-only machine this measures real CPU interference (shared caches, memory bandwidth, cores); on a GPU
under MPS each process keeps its own share, as the vGPUs of a plan would.
"""

from __future__ import annotations

import multiprocessing as mp
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx

from poolpipe_common.errors import InputError
from profiling.block_memory import memory_of_blocks, pressure
from profiling.devices import make_runner
from profiling.interference import CoRunSample, InterferenceModel, fit_interference
from profiling.onnx_graph import load_onnx, with_shapes
from profiling.prepartition import model_input_specs, random_feeds, time_runner_samples_us

DUTY_CYCLES = (1.0, 0.5)
START_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class CoRunOptions:
    device: str = "cpu"
    engine: str = "ort"
    label: str = "cpu"
    threads: int = 1  # per process: victim and co-runners each get their own thread(s)
    repeats: int = 10
    warmup: int = 2


@dataclass(frozen=True)
class CoRunner:
    path: Path
    model: bytes
    pressure: float
    latency_us: float


def _loop(model: bytes, opts: CoRunOptions, duty: float, ready: Any, stop: Any) -> None:
    """A co-runner process: its model at batch 1 in a loop at ``duty`` until told to stop."""
    proto = onnx.load_from_string(model)
    runner = make_runner(proto, opts.device, opts.engine, opts.threads)
    feeds = random_feeds(model_input_specs(proto), 1)
    runner.run(feeds)
    ready.set()
    while not stop.is_set():
        t0 = time.perf_counter()
        runner.run(feeds)
        if duty < 1.0:
            time.sleep((time.perf_counter() - t0) * (1.0 - duty) / duty)


def _median_us(runner: Any, feeds: dict, opts: CoRunOptions) -> float:
    return float(statistics.median(time_runner_samples_us(runner.run, feeds, opts.repeats, opts.warmup)))


def _load_corunner(path: Path, opts: CoRunOptions) -> CoRunner:
    model = with_shapes(load_onnx(path))
    mem = memory_of_blocks([model], str(path))
    runner = make_runner(model, opts.device, opts.engine, opts.threads)
    lat = _median_us(runner, random_feeds(model_input_specs(model), 1), opts)
    return CoRunner(path, model.SerializeToString(), pressure(mem.traffic_bytes(0, 1, 1), lat, opts.label), lat)


def _block_times(runners: list, feeds: list[dict], opts: CoRunOptions) -> list[float]:
    return [_median_us(r, f, opts) for r, f in zip(runners, feeds)]


def measure_interference(blocks: list[onnx.ModelProto], model_specs: list, others: list[Path],
                         opts: CoRunOptions) -> InterferenceModel:
    """Fit the interference model of ``blocks`` (shape-inferred block sub-models) next to ``others``."""
    if not others:
        raise InputError("--co-run: give at least one OTHER.onnx to run beside the model")
    corunners = [_load_corunner(Path(p), opts) for p in others]
    runners = [make_runner(b, opts.device, opts.engine, opts.threads) for b in blocks]
    feeds, cur = [], random_feeds(model_specs, 1)
    for b, r in zip(blocks, runners):  # real activations: each block is fed by the one before
        ins = [i.name for i in b.graph.input if i.name not in {t.name for t in b.graph.initializer}]
        f = {n: cur[n] for n in ins}
        feeds.append(f)
        cur.update(zip([o.name for o in b.graph.output], r.run(f)))
    mem = memory_of_blocks(blocks, "")
    alone = _block_times(runners, feeds, opts)
    own = [pressure(mem.traffic_bytes(i, i + 1, 1), alone[i], opts.label) for i in range(len(blocks))]
    sets = [[c] for c in corunners] + ([corunners] if len(corunners) > 1 else [])
    samples: list[CoRunSample] = []
    ctx = mp.get_context("spawn")
    for group in sets:
        for duty in DUTY_CYCLES:
            stop = ctx.Event()
            readies = [ctx.Event() for _ in group]
            procs = [ctx.Process(target=_loop, args=(c.model, opts, duty, ev, stop), daemon=True)
                     for c, ev in zip(group, readies)]
            try:
                for p in procs:
                    p.start()
                if not all(ev.wait(START_TIMEOUT_S) for ev in readies):
                    raise RuntimeError(f"--co-run: a co-runner did not start within {START_TIMEOUT_S:.0f} s")
                times = _block_times(runners, feeds, opts)
            finally:
                stop.set()
                for p in procs:
                    p.join(timeout=10)
                    if p.is_alive():
                        p.terminate()
                        p.join()
            co = tuple((duty, c.pressure) for c in group)
            samples += [CoRunSample(own[i], co, times[i] / max(alone[i], 1e-3)) for i in range(len(blocks))]
    names = ", ".join(p.name for p in map(Path, others))
    return fit_interference(samples, f"profile measure --co-run {names}: {len(samples)} block timings on "
                                     f"{opts.label} ({opts.engine}, {opts.threads} thread(s) per process) with "
                                     f"co-runners at duty cycles {', '.join(map(str, DUTY_CYCLES))}; non-negative "
                                     "least squares")
