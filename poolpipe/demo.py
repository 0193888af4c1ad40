"""``poolpipe demo``: the whole flow on this machine, then the paper's comparison on an emulated GPU cluster.

Part 1, a real model end to end: builds a zoo CNN, profiles it on the CPU as two device classes, plans a
pooled pipeline (MILP), generates Triton repositories, launches the Triton servers and the sidecar on
loopback and checks that answers through the sidecar equal ONNX Runtime's on the whole model.

Part 2, performance, on an emulated L4 + T4 cluster built from PPipe's measured profiles (data/ppipe):
real tritonservers whose backend holds each batch for the latency the GPU was measured at, so this
machine's cores are spent only on serving. The ppipe plan through the sidecar (poolpipe), the np plan
through the sidecar (NP: whole models, the T4s idle), and Triton-native (the np plan's whole-model
servers behind Triton's dynamic batcher, requests round-robin) at a few load factors, with the
simulator's prediction for poolpipe from the overheads the sidecar measured. The emulated cluster runs
in slow motion (latencies and SLO x time scale, request rates / time scale) so that this 2-core
machine's per-request costs weigh on it as little as a real cluster's would; load factors are unchanged.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

FAST, SLOW = "cpu-fast", "cpu-slow"  # the real model's device classes (labels in the profile and cluster)
SLOWDOWN = 4.0  # the slow class takes this many times the fast class's time


@dataclass(frozen=True)
class DemoOptions:
    out: Path
    model: str = "resnet"
    input_hw: int = 224  # large enough that the plan splits the model over both device classes
    blocks: int = 4
    batch_sizes: tuple[int, ...] = (1, 2, 4)
    slo_multiplier: float = 5.0  # SLO = this x the fastest batch-1 latency (the paper's setting)
    requests: int = 24  # checked against ONNX Runtime in part 1
    paper_model: str = "centernet-update_r50-caffe_fpn_ms-1x_coco"
    slo_factor: float = 3.0  # part 2: SLO = this x the model's batch-1 latency on a whole L4
    l4: int = 4
    t4: int = 12
    time_scale: float = 0.0  # 0 = auto (poolpipe.paper_experiment.PaperExperiment.auto_time_scale)
    load_factors: tuple[float, ...] = (0.4, 0.55, 0.7, 0.85)
    duration_s: float = 12.0
    seed: int = 0


@dataclass
class DemoResult:
    options: dict[str, Any]
    plan: dict[str, Any] = field(default_factory=dict)
    answers: dict[str, Any] = field(default_factory=dict)  # part 1: requests checked, max abs difference
    paper: dict[str, Any] = field(default_factory=dict)  # part 2: SLO, planned rates, time scale
    runs: list[dict[str, Any]] = field(default_factory=list)  # part 2: one per (system, load factor)
    timings_s: dict[str, float] = field(default_factory=dict)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run the whole flow end to end on this machine (about 5 minutes)",
                       description=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("demo-out"), help="working and report directory")
    p.add_argument("--model", default="resnet", help="part 1 zoo model: resnet, mobilenet or segnet")
    p.add_argument("--input-size", type=int, default=DemoOptions.input_hw,
                   help="part 1 image height and width (default: %(default)s)")
    p.add_argument("--paper-model", default=DemoOptions.paper_model, help="part 2 model of data/ppipe")
    p.add_argument("--l4", type=int, default=DemoOptions.l4, help="part 2 emulated L4 GPUs (default: %(default)s)")
    p.add_argument("--t4", type=int, default=DemoOptions.t4, help="part 2 emulated T4 GPUs (default: %(default)s)")
    p.add_argument("--load-factors", default=",".join(f"{x:g}" for x in DemoOptions.load_factors),
                   help="part 2 offered loads as fractions of the ppipe plan's throughput (default: %(default)s)")
    p.add_argument("--duration-s", type=float, default=DemoOptions.duration_s, help="seconds of load per point")
    p.add_argument("--time-scale", type=float, default=DemoOptions.time_scale,
                   help="part 2 slow motion: latencies and SLO x this, rates / this; 0 = auto: >= 8 and the "
                        "ppipe plan at <= 50 req/s (default)")
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
    if args.time_scale < 0 or not args.duration_s > 0:
        raise InputError("--time-scale must be >= 0 (0 = auto) and --duration-s positive")
    if args.l4 < 1 or args.t4 < 0:
        raise InputError("--l4 must be >= 1 and --t4 >= 0")
    opts = DemoOptions(args.out, args.model, args.input_size, paper_model=args.paper_model, l4=args.l4, t4=args.t4,
                       load_factors=factors,
                       duration_s=args.duration_s, time_scale=args.time_scale, seed=args.seed)
    run_demo(opts)
    return 0


def run_demo(opts: DemoOptions) -> DemoResult:
    from rich.console import Console

    from poolpipe import demo_report

    console = Console(width=120)
    out = opts.out
    out.mkdir(parents=True, exist_ok=True)
    result = DemoResult(options={k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(opts).items()})
    t_all = time.monotonic()

    def step(title: str) -> float:
        console.rule(f"[bold]{title}")
        return time.monotonic()

    t = step(f"1/6 build the zoo model '{opts.model}' ({opts.input_hw}x{opts.input_hw})")
    onnx_path = _build_model(opts, out)
    result.timings_s["build"] = time.monotonic() - t

    t = step(f"2/6 profile {opts.blocks} blocks on the CPU as two device classes "
             f"({FAST}; {SLOW}: {SLOWDOWN:g}x slower)")
    profile_path = _profile(opts, onnx_path, out)
    result.timings_s["profile"] = time.monotonic() - t

    t = step("3/6 plan a pooled pipeline (MILP, HiGHS)")
    plan = _plan(opts, profile_path, out, console)
    result.plan = json.loads((out / "plan.json").read_text())
    result.timings_s["plan"] = time.monotonic() - t

    t = step("4/6 generate, launch the Triton servers and the sidecar; answers through the sidecar vs ONNX Runtime")
    result.answers = _check_answers(opts, plan, onnx_path, out, console)
    result.timings_s["answers"] = time.monotonic() - t

    t = step(f"5/6 performance on an emulated {opts.l4} L4 + {opts.t4} T4 cluster ({opts.paper_model}): "
             "poolpipe vs NP vs Triton-native, and the simulator's prediction")
    _paper(opts, out, result, console)
    result.timings_s["paper"] = time.monotonic() - t

    step("6/6 summary")
    result.timings_s["total"] = time.monotonic() - t_all
    (out / "summary.json").write_text(json.dumps(asdict(result), indent=1, default=str) + "\n")
    for png in demo_report.plot(result, out):
        console.print(f"plot: {png}")
    console.print(f"summary: {out / 'summary.json'}; logs under {out / 'logs'} and {out / 'paper'}")
    demo_report.print_summary(result, console)
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
    from planner.cli.report import print_plan
    from planner.entry import plan
    from planner.request import PlanRequest
    from plans.spec.planning_spec import spec_from_dict

    spec = spec_from_dict({
        "cluster": {"gpus": {FAST: 1, SLOW: 2}, "gpus_per_server": {FAST: 1, SLOW: 2}, "bandwidth_gbps": 10},
        "max_partitions": 2,
        "models": [{"profile": str(profile_path), "slo_multiplier": opts.slo_multiplier, "slo_margin": 0.3}],
    }, source="demo spec")
    outcome = plan(spec, PlanRequest(time_limit_s=None))
    outcome.plan.save(out / "plan.json")
    print_plan(outcome.plan, outcome.spec)
    return outcome.plan


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


def _check_answers(opts: DemoOptions, plan: Any, onnx_path: Path, out: Path, console) -> dict[str, Any]:
    """Requests of batch 1 up to the plan's batch through the sidecar (gRPC and HTTP) compared with ONNX Runtime
    on the whole model; raises if any differs."""
    import numpy as np
    import onnxruntime as ort

    from model_repository_gen.generate import generate
    from runtime.launch import Deployment
    from runtime.sidecar_process import SidecarProcess

    deploy = out / "deploy"
    manifest = generate(plan, {opts.model: onnx_path}, _cluster_file(out), deploy)
    logs = out / "logs"
    logs.mkdir(exist_ok=True)
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(opts.seed)
    worst, stages, shed = 0.0, len(plan.models[0].pipelines[0].partitions), 0
    max_batch = max(p.batch for p in manifest.models[0].pipelines)
    with Deployment(deploy, check_hardware=False, log_dir=logs) as dep:
        console.print(f"{len(dep.servers)} Triton servers ready: "
                      + ", ".join(f"{g.id} ({g.gpu_type})" for g in manifest.vgpus))
        with SidecarProcess(manifest=deploy / "manifest.json", log_path=logs / "sidecar.log",
                            extra_args=("--batch-log", str(out / "batches.jsonl"))) as sidecar:
            clients = _clients(sidecar)
            for i in range(opts.requests):
                x = rng.standard_normal((1 + i % max_batch, 3, opts.input_hw, opts.input_hw)).astype(np.float32)
                got, shed = _answered(clients[i % 3 == 2], manifest.models[0], x, shed)
                want = session.run(None, {manifest.models[0].inputs[0].name: x})
                worst = max(worst, max(float(np.abs(g - w).max()) for g, w in zip(got, want)))
    if worst > 1e-3:
        raise RuntimeError(f"answers through the sidecar differ from ONNX Runtime by {worst:g}")
    console.print(f"{opts.requests} requests (batch 1..{max_batch}, gRPC and HTTP) through a {stages}-stage pooled "
                  f"pipeline: answers equal ONNX Runtime's (max abs difference {worst:.1e})"
                  + (f"; {shed} shed on a busy host and sent again" if shed else ""))
    return {"requests": opts.requests, "max_abs_diff": worst, "stages": stages, "shed": shed}


def _answered(client: tuple[Any, Any], info: Any, x: Any, shed: int, tries: int = 12) -> tuple[list[Any], int]:
    """(outputs, sheds so far): a request the sidecar sheds for its SLO (an explicit answer to a host busier than
    the profile it was planned on: the CPU profile is measured on this machine) is sent again, after a pause that
    doubles up to a second (a host three times slower shed five tries in a row within half a second); this part
    checks answers, not speed."""
    import time

    from tritonclient.utils import InferenceServerException

    for attempt in range(tries):
        try:
            return _infer(*client, info, x), shed
        except InferenceServerException as e:
            if "shed" not in str(e) or attempt == tries - 1:
                raise
            shed += 1
            time.sleep(min(1.0, 0.05 * 2 ** attempt))
    raise AssertionError("unreachable")


def _clients(sidecar: Any) -> tuple[tuple[Any, Any], tuple[Any, Any]]:
    """(module, client) for gRPC and for HTTP, each talking to the sidecar."""
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    return ((grpcclient, grpcclient.InferenceServerClient(sidecar.grpc_url)),
            (httpclient, httpclient.InferenceServerClient(sidecar.http_url)))


def _infer(mod: Any, client: Any, info: Any, x: Any) -> list[Any]:
    """The model's outputs for input ``x`` through one client."""
    inp = mod.InferInput(info.inputs[0].name, list(x.shape), info.inputs[0].datatype)
    inp.set_data_from_numpy(x)
    res = client.infer(info.name, [inp])
    return [res.as_numpy(o.name) for o in info.outputs]


def _paper(opts: DemoOptions, out: Path, result: DemoResult, console) -> None:
    """Part 2 (poolpipe.paper_experiment) at the demo's load factors; its records become ``result.runs``."""
    from poolpipe.paper_experiment import PaperExperiment, PaperRun

    run = PaperRun(opts.paper_model, opts.slo_factor, opts.l4, opts.t4, trace="poisson", duration_s=opts.duration_s,
                   seed=opts.seed, time_scale=opts.time_scale, grid=tuple(sorted(opts.load_factors)))
    ex = PaperExperiment(run, out / "paper", console.print)
    ex.plans()
    # the rate the ppipe plan promises is measured too: a figure the product prints must hold when measured
    promise_lf = round(ex.promise_lf(ex.ppipe), 4)
    ex.run = replace(ex.run, grid=tuple(sorted({*ex.run.grid, promise_lf})))
    result.paper = {"model": opts.paper_model, "slo_ms": ex.slo_ms, "ppipe_rps": ex.rate,
                    "np_rps": ex.np_plan.models[0].throughput_rps, "time_scale": ex.run.time_scale,
                    "cluster": f"{opts.l4} L4 + {opts.t4} T4 (emulated)",
                    "promise_rps": ex.ppipe.models[0].sustainable_rps, "promise_lf": promise_lf}
    ex.measure_sidecar("ppipe", ex.ppipe)
    ex.measure_sidecar("np", ex.np_plan)
    ex.measure_triton_native()
    ex.predict("ppipe")
    result.runs = ex.records
