"""``poolpipe profile``: import reference profiles, measure ONNX models block by block, merge device types."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("profile", help="create block-level latency profiles",
                       description="Create block-level latency profiles (profile.json) for the planner.")
    psub = p.add_subparsers(dest="profile_command", metavar="ACTION", required=True)

    imp = psub.add_parser("import-ppipe", help="convert a model of the PPipe reference layout",
                          description="Convert block-timing/ and boundary-bytes/ CSVs of the PPipe reference "
                                      "layout (data/ppipe) into a profile named after the model.")
    imp.add_argument("--dir", required=True, type=Path,
                     help="reference directory (holds block-timing/, boundary-bytes/)")
    imp.add_argument("--model", required=True, help="model name, e.g. atss_r101_fpn_1x_coco")
    imp.add_argument("--out", required=True, type=Path, help="profile JSON to write")
    imp.set_defaults(func=_import_ppipe)

    m = psub.add_parser("measure", help="measure an ONNX model block by block on this machine",
                        description="Time each block of an ONNX model at each batch size (warm-up, repeats, median) "
                                    "and each boundary tensor's bytes, on one device type; blocks come from "
                                    "pre-partitioning (--blocks N) or from an existing profile (--like).")
    m.add_argument("model", type=Path, metavar="MODEL.onnx")
    m.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    m.add_argument("--engine", default=None,
                   help="ort (ONNX Runtime), ort-trt (ONNX Runtime's TensorRT provider), trt (native TensorRT) or "
                        "torch (onnx2torch), as the partition backend's engine parameter; default: the first of "
                        "trt, ort-trt, ort, torch that runs here on cuda, ort on cpu")
    m.add_argument("--threads", type=int, default=None, help="CPU threads of ONNX Runtime (default: all cores)")
    m.add_argument("--label", default=None, help="device type name in the profile (default: cpu, or the GPU "
                                                 "model on cuda, e.g. L4)")
    which = m.add_mutually_exclusive_group(required=True)
    which.add_argument("--blocks", type=int, help="pre-partition into N blocks of similar time on this device")
    which.add_argument("--like", type=Path, metavar="EXISTING.json", help="reuse the blocks of an existing profile")
    m.add_argument("--batch-sizes", default="1,2,4,8", help="comma-separated batch sizes (default 1,2,4,8)")
    m.add_argument("--vgpu-levels", default="1", help="comma-separated vGPU levels V, each measured with V "
                                                      "concurrent processes (default 1)")
    m.add_argument("--emulate-slowdown", type=float, default=1.0, metavar="K",
                   help="cpu only: record K x the measured times, emulating a device class K times slower "
                        "(serve it with the cluster file's emulate_slowdown: K on a cpu host)")
    m.add_argument("--repeats", type=int, default=20, help="timed runs per block and batch size (median taken)")
    m.add_argument("--warmup", type=int, default=5, help="untimed runs before timing")
    m.add_argument("--latency-quantiles", type=int, default=0, metavar="N",
                   help="also record each block's latency distribution over its timed runs at N evenly spaced "
                        "quantile levels (0 = the median only, the default); for models whose latency varies "
                        "(the orloj policy schedules with it). Needs --repeats >= N")
    m.add_argument("--inputs", type=Path, metavar="FILE.npz",
                   help="time every block over these real inputs instead of random ones: a NumPy .npz with one "
                        "array per model input, named as the input, samples along the first axis (no batch "
                        "dimension), e.g. numpy.savez('inputs.npz', images=frames); each batch size takes batches "
                        "of the samples in turn, so --latency-quantiles spans the inputs as well as the repeats "
                        "(variable-latency models: early exit, content-dependent work)")
    m.add_argument("--max-boundary-tensors", type=int, default=1,
                   help="most tensors allowed to cross a block boundary when pre-partitioning (default 1)")
    m.add_argument("--co-run", nargs="+", action="extend", type=Path, metavar="OTHER.onnx", default=[],
                   help="also fit the interference model (InSS-style, for co-located planning): time each block "
                        "while these models run beside it in other processes at duty cycles 1 and 0.5, and record "
                        "the fitted coefficients in the profile's 'interference' field (on cpu: real CPU "
                        "interference; each process gets --threads/2 threads)")
    m.add_argument("--co-run-repeats", type=int, default=10, help="timed runs per block and co-run setting")
    m.add_argument("--co-run-level", type=int, default=None, metavar="V",
                   help="the vGPU level of the co-located plan: every --co-run process, the measured model's too, "
                        "runs with CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100/V (default: the largest of --vgpu-levels, "
                        "at least 2)")
    m.add_argument("--model-name", default=None,
                   help="model name in the profile (default: the --like profile's model, else the file name stem)")
    m.add_argument("--out", required=True, type=Path, help="profile JSON to write")
    m.set_defaults(func=_measure)

    mg = psub.add_parser("merge", help="join profiles of one model measured on different device types",
                         description="Join the device types of several profiles of one model; their blocks must "
                                     "match (measure later device types with --like).")
    mg.add_argument("profiles", nargs="+", type=Path, metavar="PROFILE.json")
    mg.add_argument("--out", required=True, type=Path, help="merged profile JSON to write")
    mg.set_defaults(func=_merge)


def _import_ppipe(args: argparse.Namespace) -> int:
    from profiling.reference import import_ppipe_profile

    prof = import_ppipe_profile(args.dir, args.model)
    prof.save(args.out)
    levels = ", ".join(f"{d} V={','.join(map(str, prof.levels(d)))}" for d in prof.devices)
    print(f"wrote {args.out}: {prof.model}, {prof.num_blocks} blocks, {levels}")
    return 0


def _int_list(text: str, flag: str, lo: int = 1, hi: int | None = None) -> tuple[int, ...]:
    """Parse '1,2,4' into increasing unique integers within [lo, hi]."""
    from poolpipe_common.errors import InputError

    try:
        vals = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        vals = []
    if not vals or vals[0] < lo or (hi is not None and vals[-1] > hi):
        rng = f"{lo}..{hi}" if hi is not None else f">= {lo}"
        raise InputError(f"{flag} {text!r}: expected comma-separated integers {rng}, e.g. 1,2,4")
    return tuple(vals)


def _default_label(device: str) -> str:
    """'cpu', or the first GPU's type label from the one table (NVIDIA A100-SXM4-80GB -> A100-80, Tesla T4 -> T4)."""
    if device != "cuda":
        return "cpu"
    from profiling.devices import cuda_device_name
    from profiling.gpu_types import gpu_label

    name = cuda_device_name()
    return gpu_label(name) if name else "cuda"


def _engine(device: str, named: str | None) -> str:
    """The engine named, else the first that runs here; InputError naming every engine's problem on a GPU."""
    from poolpipe_common.errors import InputError
    from profiling.devices import check_engine, default_engine, gpu_names
    from profiling.engines import EngineError

    if named:
        return named
    if device == "cuda" and not gpu_names():
        check_engine(device, "ort")  # the one-line "no GPU visible" error
    try:
        return default_engine(device)
    except EngineError as e:
        raise InputError(f"--device {device}: {e}") from None


def _measure(args: argparse.Namespace) -> int:
    from poolpipe_common.errors import InputError
    from profiling.profile import load_profile
    from profiling.profiler import MeasureOptions, measure_profile

    for flag, val, lo in (("--threads", args.threads, 1), ("--blocks", args.blocks, 1), ("--repeats", args.repeats, 1),
                          ("--warmup", args.warmup, 0), ("--max-boundary-tensors", args.max_boundary_tensors, 1),
                          ("--co-run-repeats", args.co_run_repeats, 1), ("--co-run-level", args.co_run_level, 2)):
        if val is not None and val < lo:
            raise InputError(f"{flag} {val}: must be at least {lo}")
    if args.latency_quantiles and not 2 <= args.latency_quantiles <= args.repeats:
        raise InputError(f"--latency-quantiles {args.latency_quantiles}: must be 0 (off) or 2..--repeats "
                         f"({args.repeats}); more levels than timed runs say nothing more")
    if not args.emulate_slowdown >= 1.0 or (args.emulate_slowdown != 1.0 and args.device != "cpu"):
        raise InputError(f"--emulate-slowdown {args.emulate_slowdown:g}: must be >= 1, and only with --device cpu")
    opts = MeasureOptions(
        device=args.device, engine=_engine(args.device, args.engine),
        label=args.label or _default_label(args.device), threads=args.threads,
        batch_sizes=_int_list(args.batch_sizes, "--batch-sizes"),
        repeats=args.repeats, warmup=args.warmup, vgpu_levels=_int_list(args.vgpu_levels, "--vgpu-levels", 1, 8),
        max_tensors=args.max_boundary_tensors, emulate_slowdown=args.emulate_slowdown,
        quantile_levels=args.latency_quantiles)
    like = load_profile(args.like) if args.like else None
    prof = measure_profile(args.model, opts, n_blocks=args.blocks, like=like, like_path=str(args.like or ""),
                           model_name=args.model_name, inputs_path=args.inputs, co_run=tuple(args.co_run),
                           co_run_repeats=args.co_run_repeats,
                           co_run_level=args.co_run_level or max(2, *opts.vgpu_levels))
    prof.save(args.out)
    total = {v: prof.latency_us(opts.label, v, opts.batch_sizes[0]) for v in opts.vgpu_levels}
    per_level = ", ".join(f"V={v}: {us / 1000:.2f} ms" for v, us in total.items())
    print(f"wrote {args.out}: {prof.model}, {prof.num_blocks} blocks on {opts.label} ({opts.engine}), "
          f"batch {opts.batch_sizes[0]} {per_level}")
    for dev, im in prof.interference.items():
        print(f"interference on {dev} (measured): per_corunner {im.per_corunner:.4f}, per_pressure "
              f"{im.per_pressure:.4f}, sensitivity {im.sensitivity:.4f} (rmse {im.rmse:.4f} over {im.points} points)")
    return 0


def _merge(args: argparse.Namespace) -> int:
    from profiling.merge import merge_profiles
    from profiling.profile import load_profile

    merged = merge_profiles([(str(p), load_profile(p)) for p in args.profiles])
    merged.save(args.out)
    print(f"wrote {args.out}: {merged.model}, {merged.num_blocks} blocks, device types {', '.join(merged.devices)}")
    return 0
