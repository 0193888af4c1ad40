"""``poolpipe demo``: the whole flow on this machine, measured, then stopped.

Builds a zoo CNN, profiles it on the CPU as two emulated device classes, plans a pooled pipeline,
generates Triton repositories, launches the Triton servers and the sidecar on loopback, drives them
with Locust at a few load factors, then does the same with the Triton-only baseline (the whole model
behind Triton's dynamic batcher on the fast device, what a Triton user runs today while the old
devices idle), and prints and plots what it measured.

The device classes: "cpu-fast" is one engine thread; "cpu-slow" is one engine thread that stays busy
SLOWDOWN x as long (the backend's emulate_slowdown), like an old GPU that is slow but costs this
machine's cores little. One fast and two slow devices fit a 2-core machine with the sidecar and Locust.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

FAST, SLOW = "cpu-fast", "cpu-slow"  # emulated device classes (labels in the profile and cluster)
SLOWDOWN = 4.0  # the slow class takes this many times the fast class's time


@dataclass(frozen=True)
class DemoOptions:
    out: Path
    model: str = "resnet"
    input_hw: int = 224  # large enough that a request's compute dwarfs the per-hop serving overhead on CPU
    blocks: int = 4
    batch_sizes: tuple[int, ...] = (1, 2, 4)
    load_factors: tuple[float, ...] = (0.3, 0.45, 0.6, 0.75, 0.9)
    duration_s: float = 12.0
    slo_multiplier: float = 5.0  # SLO = this x the fastest batch-1 latency (the paper's setting)
    seed: int = 0


@dataclass
class DemoResult:
    options: dict[str, Any]
    plan: dict[str, Any] = field(default_factory=dict)
    slo_ms: float = 0.0
    planned_rps: float = 0.0
    runs: list[dict[str, Any]] = field(default_factory=list)  # one per (system, load factor)
    vgpu_utilization: dict[str, dict[str, float]] = field(default_factory=dict)  # load factor -> vGPU -> busy
    timings_s: dict[str, float] = field(default_factory=dict)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run the whole flow end to end on this machine (about 3-10 minutes)",
                       description=__doc__.split("\n\n", 1)[1])
    p.add_argument("--out", type=Path, default=Path("demo-out"), help="working and report directory")
    p.add_argument("--model", default="resnet", help="zoo model: resnet, mobilenet or segnet")
    p.add_argument("--input-size", type=int, default=224, help="image height and width (default: %(default)s)")
    p.add_argument("--load-factors", default="0.3,0.45,0.6,0.75,0.9",
                   help="offered load as fractions of the plan's throughput (default: %(default)s)")
    p.add_argument("--duration-s", type=float, default=12.0, help="seconds of load per point")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from poolpipe_common.errors import InputError

    try:
        factors = tuple(float(x) for x in args.load_factors.split(","))
    except ValueError:
        raise InputError(f"--load-factors: expected numbers separated by commas, got {args.load_factors!r}") from None
    if not factors or min(factors) <= 0:
        raise InputError("--load-factors must be positive")
    opts = DemoOptions(args.out, args.model, args.input_size, load_factors=factors, duration_s=args.duration_s,
                       seed=args.seed)
    run_demo(opts)
    return 0


def run_demo(opts: DemoOptions) -> DemoResult:
    from rich.console import Console

    from poolpipe import demo_report

    console = Console()
    out = opts.out
    out.mkdir(parents=True, exist_ok=True)
    result = DemoResult(options={k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(opts).items()})
    t_all = time.monotonic()

    def step(title: str) -> float:
        console.rule(f"[bold]{title}")
        return time.monotonic()

    t = step(f"1/6 build the zoo model '{opts.model}'")
    onnx_path = _build_model(opts, out)
    result.timings_s["build"] = time.monotonic() - t

    t = step(f"2/6 profile {opts.blocks} blocks on the CPU as two device classes "
             f"({FAST}; {SLOW}: {SLOWDOWN:g}x slower)")
    profile_path = _profile(opts, onnx_path, out)
    result.timings_s["profile"] = time.monotonic() - t

    t = step("3/6 plan a pooled pipeline (MILP, HiGHS)")
    plan = _plan(opts, profile_path, out, console)
    result.plan = json.loads((out / "plan.json").read_text())
    result.slo_ms = plan.models[0].slo_us / 1e3
    result.planned_rps = plan.models[0].throughput_rps
    result.timings_s["plan"] = time.monotonic() - t

    t = step("4/6 generate Triton repositories, launch them and the sidecar, load-test through the sidecar")
    _serve_poolpipe(opts, plan, onnx_path, out, result, console)
    result.timings_s["poolpipe"] = time.monotonic() - t

    t = step("5/6 the Triton-only baseline (whole model, Triton's dynamic batcher) at the same loads")
    _serve_baseline(opts, plan, onnx_path, out, result, console)
    result.timings_s["baseline"] = time.monotonic() - t

    step("6/6 summary")
    result.timings_s["total"] = time.monotonic() - t_all
    (out / "summary.json").write_text(json.dumps(asdict(result), indent=1, default=str) + "\n")
    demo_report.print_summary(result, console)
    for png in demo_report.plot(result, out):
        console.print(f"plot: {png}")
    console.print(f"summary: {out / 'summary.json'}; Locust reports under {out / 'loadtest'}")
    return result


def _build_model(opts: DemoOptions, out: Path) -> Path:
    from profiling.zoo import build_zoo_model

    return build_zoo_model(opts.model, out / "models" / f"{opts.model}.onnx", seed=opts.seed, input_hw=opts.input_hw)


def _profile(opts: DemoOptions, onnx_path: Path, out: Path) -> Path:
    from profiling.merge import merge_profiles
    from profiling.profiler import MeasureOptions, measure_profile

    prof_dir = out / "profiles"
    prof_dir.mkdir(parents=True, exist_ok=True)
    fast = measure_profile(onnx_path, MeasureOptions(label=FAST, threads=1, batch_sizes=opts.batch_sizes,
                                                     repeats=10, warmup=3),
                           n_blocks=opts.blocks, model_name=opts.model, progress=True)
    fast.save(prof_dir / f"{FAST}.json")
    slow = measure_profile(onnx_path, MeasureOptions(label=SLOW, threads=1, batch_sizes=opts.batch_sizes,
                                                     repeats=10, warmup=3, emulate_slowdown=SLOWDOWN),
                           like=fast, like_path=str(prof_dir / f"{FAST}.json"), model_name=opts.model,
                           progress=True)
    slow.save(prof_dir / f"{SLOW}.json")
    merged = merge_profiles([(FAST, fast), (SLOW, slow)])
    path = prof_dir / f"{opts.model}.json"
    merged.save(path)
    return path


def _plan(opts: DemoOptions, profile_path: Path, out: Path, console) -> Any:
    from planner.plan_cli import print_plan
    from planner.solve import solve_spec
    from planner.spec import spec_from_dict

    spec = spec_from_dict({
        "cluster": {"gpus": {FAST: 1, SLOW: 2}, "gpus_per_server": {FAST: 1, SLOW: 2}, "bandwidth_gbps": 10},
        "max_partitions": 2,
        "models": [{"profile": str(profile_path), "slo_multiplier": opts.slo_multiplier, "slo_margin": 0.3}],
    }, source="demo spec")
    plan = solve_spec(spec)
    plan.save(out / "plan.json")
    print_plan(plan, spec)
    return plan


def _cluster_file(out: Path) -> Path:
    import yaml

    path = out / "cluster.yaml"
    path.write_text(yaml.safe_dump({"hosts": [
        {"name": "fast", "address": "127.0.0.1", "gpu_type": FAST, "gpus": 1, "bandwidth_gbps": 10,
         "device": "cpu", "cpu_cores": 1, "base_port": 0},
        {"name": "slow", "address": "127.0.0.1", "gpu_type": SLOW, "gpus": 2, "bandwidth_gbps": 10,
         "device": "cpu", "cpu_cores": 2, "base_port": 0, "emulate_slowdown": SLOWDOWN},
    ]}, sort_keys=False))
    return path


def _serve_poolpipe(opts: DemoOptions, plan: Any, onnx_path: Path, out: Path, result: DemoResult, console) -> None:
    from model_repository_gen.generate import generate
    from poolpipe.demo_report import scrape_vgpu_busy
    from runtime.launch import Deployment
    from runtime.sidecar_process import SidecarProcess

    deploy = out / "deploy"
    manifest = generate(plan, {opts.model: onnx_path}, _cluster_file(out), deploy)
    logs = out / "logs"
    logs.mkdir(exist_ok=True)
    with Deployment(deploy, check_hardware=False, log_dir=logs) as dep:
        console.print(f"{len(dep.servers)} Triton servers ready: "
                      + ", ".join(f"{g.id} ({g.gpu_type}) {g.grpc_url}" for g in manifest.vgpus))
        sidecar = SidecarProcess(manifest=deploy / "manifest.json", log_path=logs / "sidecar.log",
                                 extra_args=("--batch-log", str(out / "batches.jsonl")))
        with sidecar:
            console.print(f"sidecar on {sidecar.grpc_url} (gRPC), {sidecar.http_url} (HTTP)")
            for lf in opts.load_factors:
                before = scrape_vgpu_busy(sidecar.metrics_port)
                run = _load(opts, sidecar.grpc_url, lf, result, "poolpipe", out, console)
                after = scrape_vgpu_busy(sidecar.metrics_port)
                result.vgpu_utilization[f"{lf:g}"] = {g: (after.get(g, 0.0) - before.get(g, 0.0)) / run["duration_s"]
                                                      for g in after}


def _serve_baseline(opts: DemoOptions, plan: Any, onnx_path: Path, out: Path, result: DemoResult, console) -> None:
    from ensembles.triton_baseline import start_baseline, write_whole_model
    from model_repository_gen import triton_config as tc

    repo = out / "baseline" / "model_repository"
    batch = max(p.batch for p in plan.models[0].pipelines)
    write_whole_model(repo, onnx_path, opts.model, max_batch_size=batch,
                      batching=tc.DynamicBatching(preferred_batch_sizes=(batch,), max_queue_delay_us=2000),
                      settings=tc.BackendSettings(intra_op_threads=1))
    with start_baseline(repo, log_path=out / "logs" / "triton-baseline.log") as server:
        console.print(f"Triton-only baseline on {server.grpc_url}: whole model on the {FAST} device, dynamic batcher "
                      f"(max batch {batch})")
        for lf in opts.load_factors:
            _load(opts, server.grpc_url, lf, result, "triton", out, console)


def _load(opts: DemoOptions, url: str, lf: float, result: DemoResult, system: str, out: Path, console) -> dict:
    from loadtest.runner import LoadTest, run_loadtest

    rate = lf * result.planned_rps
    s = run_loadtest(LoadTest(url, opts.model, rate, opts.duration_s, "poisson", slo_ms=result.slo_ms,
                              seed=opts.seed), out / "loadtest" / f"{system}-{lf:g}")
    s.update(system=system, load_factor=lf)
    result.runs.append(s)
    att = s["slo_attainment"]
    console.print(f"  {system:8s} load {lf:4.2f} ({rate:6.1f} rps): attainment {att:6.1%}, "
                  f"{s['succeeded']}/{s['sent']} ok, p99 {s['p99_ms']:.1f} ms"
                  + (f", errors: {s['errors']}" if s["errors"] else ""))
    return s
