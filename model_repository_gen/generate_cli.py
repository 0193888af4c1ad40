"""``poolpipe generate``: Triton model repositories, launch files and manifest.json from a plan."""

from __future__ import annotations

import argparse
from pathlib import Path

from model_repository_gen import k8s_cli


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="write Triton repositories, launch files and manifest.json from a plan",
                       description="Cut each planned model at its partitions' block boundaries and write, per vGPU "
                                   "of the cluster file, a Triton model repository, per host launch.json/launch.sh, "
                                   "and DIR/manifest.json for the sidecar.")
    p.add_argument("--plan", required=True, type=Path, help="plan.json from 'poolpipe plan'")
    p.add_argument("--onnx", action="append", default=[], metavar="NAME=MODEL.onnx",
                   help="the ONNX file of plan model NAME (repeat for each model); not needed for a model that "
                        "only hosts with device: emulated serve (its tensors are invented from the profile)")
    p.add_argument("--cluster", required=True, type=Path, help="cluster file (YAML or JSON) listing the hosts")
    p.add_argument("--out", required=True, type=Path, help="output directory")
    p.add_argument("--fp16-boundaries", action="store_true",
                   help="move tensors between partitions as FP16 (a Cast on each side)")
    p.add_argument("--emulated-tensor-scale", type=float, default=1.0, metavar="F",
                   help="0 < F <= 1: scale the bytes of the invented inputs, boundary tensors and outputs of models "
                        "generated without --onnx (the plan's NIC times stay as profiled); default 1")
    p.add_argument("--emulated-backend", choices=("auto", "native", "python"), default="auto",
                   help="what serves partitions on hosts with device: emulated: 'native' the poolpipe_emulated C "
                        "backend (built from backends/native by the C compiler; the lowest cost per stage call), "
                        "'python' the Python partition backend, 'auto' (default) native where it builds, else python")
    p.add_argument("--previous", type=Path, metavar="DIR",
                   help="the running deployment's directory: generate this one to migrate from it ('poolpipe "
                        "launch' on SIGHUP): vGPUs both have on the same device keep their servers and ports, the "
                        "others get ports it does not use, and partition models get a generation suffix (_gN)")
    p.add_argument("--dynamic-batching", action="append", default=[], metavar="[MODEL=]SPEC",
                   help="Triton's dynamic_batching controls the sidecar honours for MODEL (every planned model without "
                        "MODEL=): SPEC is protobuf text as in config.pbtxt, e.g. 'priority_levels: 2 "
                        "default_priority_level: 2 default_queue_policy { max_queue_size: 64 timeout_action: DELAY "
                        "default_timeout_microseconds: 50000 allow_timeout_override: true }', or @FILE (such text, or "
                        "a config.pbtxt holding a dynamic_batching block); repeat per model")
    p.add_argument("--engine", action="append", default=[], metavar="GPU_TYPE=ENGINE",
                   help="the engine of GPU hosts' partitions of GPU_TYPE where not the one its profile measured "
                        "(trt, ort-trt, ort, torch; cpu: ONNX Runtime on the CPU of a GPU host, only so named; "
                        "auto: the first GPU engine that loads there); repeat per type")
    k8s_cli.add_arguments(p)
    p.set_defaults(func=_run)


def parse_onnx_args(values: list[str]) -> dict[str, Path]:
    """``NAME=PATH`` pairs -> {name: path} (InputError on a malformed or repeated name)."""
    from poolpipe_common.errors import InputError

    out: dict[str, Path] = {}
    for v in values:
        name, sep, path = v.partition("=")
        if not sep or not name or not path:
            raise InputError(f"--onnx {v!r}: expected NAME=MODEL.onnx, with NAME the model's name in the plan")
        if name in out:
            raise InputError(f"--onnx {name}: given twice")
        out[name] = Path(path)
    return out


def _run(args: argparse.Namespace) -> int:
    from model_repository_gen.batcher_flags import controls_for, parse_dynamic_batching_args
    from model_repository_gen.cluster_file import load_cluster
    from model_repository_gen.generate import assign_vgpus, generate, gpu_pools
    from model_repository_gen.gpu_engines import engine_lines, parse_engine_args, resolve_engines
    from model_repository_gen.manifest import load_manifest
    from plans.plan_json import load_plan
    from poolpipe_common.errors import InputError

    onnx_paths = parse_onnx_args(args.onnx)
    batcher, notes = parse_dynamic_batching_args(args.dynamic_batching)
    if args.k8s:
        k8s_cli.options_from_args(args)  # bad flags fail before anything is written
    elif args.passthrough or args.k8s_tls_secret or args.k8s_tls_mutual or args.k8s_stage_tls_secret:
        raise InputError("--passthrough and the --k8s-*tls* flags shape the Kubernetes manifests: add --k8s")
    previous = load_manifest(args.previous) if args.previous else None
    if previous is not None and args.out.resolve() == previous.root:
        raise InputError(f"--out {args.out} is the --previous deployment; generate the next one beside it "
                         "(e.g. DIR-2) and point a symlink or 'poolpipe launch' at it")
    plan = load_plan(args.plan)
    controls = controls_for([m.name for m in plan.models], batcher)
    engines = parse_engine_args(args.engine)
    cluster = load_cluster(args.cluster)
    manifest = generate(plan, onnx_paths, cluster, args.out, args.fp16_boundaries,
                        args.emulated_tensor_scale, previous, controls, args.emulated_backend, engines)
    for line in engine_lines(resolve_engines(list(plan.models), gpu_pools(plan, assign_vgpus(plan, cluster)),
                                             engines)):
        print(line)
    for note in notes:
        print(note)
    per_host: dict[str, int] = {}
    for g in manifest.vgpus:
        per_host[g.host] = per_host.get(g.host, 0) + 1
    hosts = ", ".join(f"{h}: {n}" for h, n in per_host.items())
    stages = sum(len(p.stages) for m in manifest.models for p in m.pipelines)
    print(f"wrote {args.out}: {len(manifest.vgpus)} vGPU server(s) ({hosts}), {len(manifest.models)} model(s), "
          f"{stages} pipeline stage(s); start them with: poolpipe launch {args.out}")
    if previous is not None:
        kept = {g.grpc_url for g in previous.vgpus} & {g.grpc_url for g in manifest.vgpus}
        print(f"generation {manifest.generation}: {len(kept)} server(s) of {args.previous} kept; migrate a running "
              f"'poolpipe launch' by pointing its DIR at {args.out} and sending it SIGHUP, then reload the sidecar")
    if line := k8s_cli.write_from_args(manifest, args.out, args):
        print(line)
    return 0
