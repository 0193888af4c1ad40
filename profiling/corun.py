"""``profile measure --co-run``: time each block while other models run on the same device in other processes,
and fit the interference model (profiling.interference) from the slowdowns.

Each co-runner process runs its whole model at batch 1 in a loop at a duty cycle u (run, then idle for
(1-u)/u of the run), so the fit sees both the co-runners' utilisation and their memory pressure. The
configurations are every co-runner alone and (with several) all of them together, each at u = 1 and 0.5.
On a CPU-only machine this measures real CPU interference (shared caches, memory bandwidth, cores). On a GPU
every process, the measured model's included, runs in a fresh process with the MPS share a vGPU of the
co-located plan has (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100/level`` set before CUDA starts; ``level``: the
vGPU level, ``profile measure --co-run-level``), so the slowdowns fitted are those of vGPUs, not of whole-GPU
processes; each process reports the share it ran with, and the fit records it.
"""

from __future__ import annotations

import multiprocessing as mp
import os
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
    level: int = 2  # vGPU level whose MPS share (100/level %) every process runs with

    @property
    def mps_percent(self) -> int:
        return 100 // self.level


def _take_share(opts: CoRunOptions) -> str:
    """Set this process's MPS share before any CUDA work; returns what it runs with."""
    os.environ["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(opts.mps_percent)
    return os.environ["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"]


@dataclass(frozen=True)
class CoRunner:
    path: Path
    model: bytes
    pressure: float
    latency_us: float


def _loop(model: bytes, opts: CoRunOptions, duty: float, ready: Any, stop: Any, shares: Any) -> None:
    """A co-runner process: its model at batch 1 in a loop at ``duty`` until told to stop, at its vGPU share."""
    shares.put(_take_share(opts))
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
    """A co-runner's model, its memory pressure and its batch-1 latency alone (timed in a process at its share)."""
    model = with_shapes(load_onnx(path))
    mem = memory_of_blocks([model], str(path))
    with _Victim([model], random_feeds(model_input_specs(model), 1), opts) as alone:
        lat = alone.times()[0]
    return CoRunner(path, model.SerializeToString(), pressure(mem.traffic_bytes(0, 1, 1), lat, opts.label), lat)


def _victim_main(models: list[bytes], feeds: dict, opts: CoRunOptions, conn: Any) -> None:
    """The measured model's process: its blocks' runners at its vGPU share; times them whenever asked."""
    try:
        share = _take_share(opts)
        blocks = [onnx.load_from_string(m) for m in models]
        runners = [make_runner(b, opts.device, opts.engine, opts.threads) for b in blocks]
        per_block, cur = [], dict(feeds)
        for b, r in zip(blocks, runners):  # real activations: each block is fed by the one before
            ins = [i.name for i in b.graph.input if i.name not in {t.name for t in b.graph.initializer}]
            f = {n: cur[n] for n in ins}
            per_block.append(f)
            cur.update(zip([o.name for o in b.graph.output], r.run(f)))
        conn.send(("ready", share))
        while conn.recv() == "time":
            conn.send(("times", [_median_us(r, f, opts) for r, f in zip(runners, per_block)]))
    except BaseException as e:  # reported to the parent, which fails the measurement with it
        conn.send(("error", f"{type(e).__name__}: {e}"))


class _Victim:
    """The measured blocks in a process of their own, at the share a vGPU of the plan has (a context manager)."""

    def __init__(self, blocks: list[onnx.ModelProto], feeds: dict, opts: CoRunOptions) -> None:
        ctx = mp.get_context("spawn")  # a fresh interpreter: no CUDA context inherited, the share set first
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_victim_main, args=([b.SerializeToString() for b in blocks], feeds, opts,
                                                           child), daemon=True)
        self.share = ""

    def _answer(self, what: str) -> Any:
        if not self.conn.poll(START_TIMEOUT_S * 5):
            raise RuntimeError(f"--co-run: the measured model's process sent nothing for {START_TIMEOUT_S * 5:.0f} s")
        kind, value = self.conn.recv()
        if kind == "error":
            raise RuntimeError(f"--co-run: the measured model's process failed: {value}")
        assert kind == what, kind
        return value

    def __enter__(self) -> "_Victim":
        self.proc.start()
        self.share = self._answer("ready")
        return self

    def times(self) -> list[float]:
        self.conn.send("time")
        return self._answer("times")

    def __exit__(self, *exc: object) -> None:
        try:
            self.conn.send("stop")
        except OSError:
            pass
        self.proc.join(timeout=10)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join()


def _times_beside(victim: _Victim, group: list[CoRunner], duty: float, opts: CoRunOptions) -> tuple[list[float],
                                                                                                     list[str]]:
    """The victim's block times while ``group`` runs at ``duty``; the co-runners' shares."""
    ctx = mp.get_context("spawn")
    stop, shares = ctx.Event(), ctx.Queue()
    readies = [ctx.Event() for _ in group]
    procs = [ctx.Process(target=_loop, args=(c.model, opts, duty, ev, stop, shares), daemon=True)
             for c, ev in zip(group, readies)]
    try:
        for p in procs:
            p.start()
        if not all(ev.wait(START_TIMEOUT_S) for ev in readies):
            raise RuntimeError(f"--co-run: a co-runner did not start within {START_TIMEOUT_S:.0f} s")
        return victim.times(), [shares.get(timeout=START_TIMEOUT_S) for _ in group]
    finally:
        stop.set()
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
                p.join()


def measure_interference(blocks: list[onnx.ModelProto], model_specs: list, others: list[Path],
                         opts: CoRunOptions) -> InterferenceModel:
    """Fit the interference model of ``blocks`` (shape-inferred block sub-models) next to ``others``."""
    if not others:
        raise InputError("--co-run: give at least one OTHER.onnx to run beside the model")
    corunners = [_load_corunner(Path(p), opts) for p in others]
    mem = memory_of_blocks(blocks, "")
    sets = [[c] for c in corunners] + ([corunners] if len(corunners) > 1 else [])
    samples: list[CoRunSample] = []
    shares: set[str] = set()
    with _Victim(blocks, random_feeds(model_specs, 1), opts) as victim:
        shares.add(victim.share)
        alone = victim.times()
        own = [pressure(mem.traffic_bytes(i, i + 1, 1), alone[i], opts.label) for i in range(len(blocks))]
        for group in sets:
            for duty in DUTY_CYCLES:
                times, got = _times_beside(victim, group, duty, opts)
                shares.update(got)
                co = tuple((duty, c.pressure) for c in group)
                samples += [CoRunSample(own[i], co, times[i] / max(alone[i], 1e-3)) for i in range(len(blocks))]
    if shares != {str(opts.mps_percent)}:
        raise RuntimeError(f"--co-run: processes ran with MPS shares {sorted(shares)}, not {opts.mps_percent} %")
    names = ", ".join(p.name for p in map(Path, others))
    return fit_interference(samples, f"profile measure --co-run {names}: {len(samples)} block timings on "
                                     f"{opts.label} ({opts.engine}, {opts.threads} thread(s) per process) with "
                                     f"co-runners at duty cycles {', '.join(map(str, DUTY_CYCLES))}; every process "
                                     f"at CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={opts.mps_percent} (a 1/{opts.level} "
                                     "vGPU); non-negative least squares")
