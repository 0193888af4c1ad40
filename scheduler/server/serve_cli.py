"""``poolpipe serve``: the scheduler sidecar, a KServe v2 endpoint (gRPC + HTTP) in front of Triton servers."""

from __future__ import annotations

import argparse
from pathlib import Path

from poolpipe_common.arg_types import non_negative
from poolpipe_common.errors import InputError
from poolpipe_common.overheads import DEFAULT_FRONT_US


def _hostport(value: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT (e.g. 127.0.0.1:8001), got {value!r}")
    return value


def _workers(value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"expected a number of worker processes >= 1, got {value!r}")
    return int(value)


def _worker_of(value: str):  # -> WorkerGroup
    from scheduler.server.peers import WorkerGroup  # noqa: PLC0415

    index, _, ports = value.partition(":")
    try:
        return WorkerGroup(int(index), tuple(int(p) for p in ports.split(",")))
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected I:PORT,PORT,... (set by serve --workers), got {value!r}") from e


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "serve", help="serve planned models (and pass others through) as a Triton-compatible endpoint",
        description="Run the scheduler sidecar: clients talk KServe v2 (gRPC, HTTP) to it as to Triton; "
                    "planned models are batched and dispatched over pooled pipelines of Triton servers, other "
                    "models and management calls go to the --passthrough Triton unchanged.")
    p.add_argument("--manifest", type=Path, help="DIR/manifest.json written by 'poolpipe generate' (or DIR)")
    p.add_argument("--passthrough", type=_hostport, metavar="HOST:PORT",
                   help="gRPC endpoint of a Triton server for models that are not planned")
    p.add_argument("--passthrough-http", type=_hostport, metavar="HOST:PORT",
                   help="the pass-through Triton's HTTP endpoint (its --http-port): the HTTP port forwards a "
                        "pass-through model's inference there as HTTP (body and headers as received; needs "
                        "--passthrough for the other calls). With --native-grpc-port, that port then also serves "
                        "the pass-through Triton's models (those ready at start, but stateful and decoupled ones): "
                        "Triton's front end forwards each request there over HTTP from C, with no Python on the "
                        "path (a Python gRPC proxy hop costs about 0.5 ms)")
    p.add_argument("--grpc-port", type=int, default=8001, help="KServe v2 gRPC port (default: %(default)s, as Triton)")
    p.add_argument("--http-port", type=int, default=8000, help="KServe v2 HTTP/REST port (default: %(default)s)")
    p.add_argument("--metrics-port", type=int, default=8002, help="Prometheus /metrics port (default: %(default)s)")
    p.add_argument("--bind", default="127.0.0.1", help="address to listen on (default: loopback only)")
    p.add_argument("--policy", default="auto",
                   help="scheduling policy: auto (= ppipe, reservation-based adaptive batching), ppipe, fifs, elsa, "
                        "reactive (per-stage batching, no reservations) or orloj (distribution-aware batching for "
                        "models whose profile has latency_quantiles) (default: auto)")
    p.add_argument("--drain-timeout", type=float, default=30.0, metavar="S",
                   help="seconds to let in-flight requests finish on SIGTERM")
    p.add_argument("--overheads-out", type=Path, metavar="FILE",
                   help="on shutdown, write what serving added beyond the profiled compute (lead, tail, wake "
                        "lateness, slowdown) for 'poolpipe simulate --overheads FILE' to predict this sidecar")
    p.add_argument("--front-us", type=non_negative(float), default=None, metavar="US",
                   help="microseconds each deadline comes before the SLO, kept for a request's way outside the "
                        "sidecar's clock (the client's send and gRPC up to the handler, the answer's way back). "
                        "Default: the reserve the manifest's plan was made with (its assumed costs' front_us: "
                        "'poolpipe calibrate' chooses it from the way your clients measured), and after a reload "
                        f"the new plan's; else {DEFAULT_FRONT_US:g}. Raise it for clients across a network")
    p.add_argument("--stage-protocol", choices=("http", "grpc"), default="http",
                   help="how the sidecar calls the planned models' Triton servers: http (KServe v2 REST with binary "
                        "tensors on kept-open connections; about half the sidecar's CPU per call of grpc) or grpc "
                        "(for servers started with --allow-http=false); health checks and shared-memory "
                        "registration use gRPC either way (default: %(default)s)")
    p.add_argument("--batch-log", type=Path, metavar="FILE",
                   help="append one JSON line per executed stage (dispatch, vGPU, batch, measured compute "
                        "start/end; the batch's first arrival, the reserved start, when the input was at hand, sent "
                        "and answered)")
    p.add_argument("--shard", metavar="I/N",
                   help="serve shard I of N (0-based): a disjoint share of every pool's vGPUs (whole physical GPUs, "
                        "balanced by planned throughput); N such sidecars behind one load balancer serve the whole "
                        "plan with no shared state, each taking 1/N of the requests ('poolpipe simulate --shards N' "
                        "shows what it costs)")
    p.add_argument("--workers", type=_workers, default=1, metavar="N",
                   help="run N sidecar worker processes that listen on the same gRPC and HTTP ports (SO_REUSEPORT: "
                        "the kernel spreads client connections over them) and split the plan's vGPUs as --shard "
                        "does, so one command uses N cores; one parent serves --metrics-port (the workers' metrics "
                        "summed), restarts a worker that dies and drains them all on SIGTERM; client shared-memory "
                        "registrations, reloads, readiness and statistics span every worker (default: 1, one "
                        "process). Needs --manifest; a plan supports at most as many workers as its smallest pool "
                        "has physical GPUs")
    p.add_argument("--native-grpc-port", type=int, metavar="PORT",
                   help="also serve the planned models' inference on PORT through Triton's own gRPC front end (a "
                        "tritonserver whose models hand each request to this sidecar over a Unix socket: the "
                        "sidecar then spends no CPU on gRPC; its HTTP endpoint takes --native-http-port). The "
                        "models planned at start; client shared memory registered on PORT works there (Triton's "
                        "own); the sidecar's statistics, metrics, traces and admin stay on --grpc-port/--http-port, "
                        "and so does the pass-through unless --passthrough-http is given. Needs --manifest or "
                        "--passthrough-http, and a C compiler. With --workers N each worker runs its own front end on "
                        "the same ports (Triton's --reuse-grpc-port/--reuse-http-port), as the workers share "
                        "--grpc-port")
    p.add_argument("--native-http-port", type=int, default=0, metavar="PORT",
                   help="the native front end's KServe v2 HTTP port (default: a free port, logged at start)")
    p.add_argument("--worker-of", type=_worker_of, help=argparse.SUPPRESS)  # I:PORT0,PORT1,...: set by the parent
    p.add_argument("--replan", type=Path, metavar="FILE",
                   help="re-plan automatically when the measured mix of models leaves the plan's headroom: FILE "
                        "names the planning spec, the cluster file and where to generate (see "
                        "scheduler/server/control/replanner.py); the sidecar plans in a worker process, launches the "
                        "new servers and reloads onto them (needs --manifest)")
    api_list = "health, metadata, inference, shared-memory, model-config, model-repository, statistics, trace, logging"
    p.add_argument("--grpc-restricted-protocol", action="append", default=[], metavar="SPEC",
                   help="as tritonserver: <api>[,<api>]:<key>=<value> (repeatable, one key per group); gRPC calls of "
                        "those APIs must send the metadata 'triton-grpc-protocol-<key>: <value>', else they are "
                        f"refused with PERMISSION_DENIED naming it. APIs: {api_list}, and poolpipe-admin (the "
                        "sidecar's /v2/poolpipe endpoints; they follow model-repository when not named)")
    p.add_argument("--http-restricted-api", action="append", default=[], metavar="SPEC",
                   help="as tritonserver: <api>[,<api>]:<key>=<value> (repeatable); HTTP calls of those APIs must "
                        "send the header '<key>: <value>', else they get 403 naming it (same APIs as above)")
    p.add_argument("--trace-config", action="append", default=[], metavar="[MODE,]SETTING=VALUE",
                   help="trace planned requests, with tritonserver's syntax (repeatable): level=TIMESTAMPS turns "
                        "tracing on (default OFF), rate=N traces one request in N (default 1000), count=N stops after "
                        "N traces (default -1: never), mode=opentelemetry (the only mode); "
                        "opentelemetry,url=URL is the OTLP/HTTP receiver (default http://localhost:4318/v1/traces), "
                        "opentelemetry,resource=KEY=VALUE, opentelemetry,bsp_schedule_delay=MS, "
                        "bsp_max_queue_size, bsp_max_export_batch_size; the trace extension (/v2/trace/setting) "
                        "changes level, rate and count while serving")
    from scheduler.server import serve_front_cli  # noqa: PLC0415

    serve_front_cli.add_arguments(p)
    p.set_defaults(func=run)


def config_from_args(args: argparse.Namespace):  # -> SidecarConfig
    from poolpipe_common.net import port_in_use  # noqa: PLC0415
    from scheduler.server.app import SidecarConfig  # noqa: PLC0415

    if args.manifest is None and args.passthrough is None:
        raise InputError("give --manifest DIR/manifest.json, --passthrough HOST:PORT, or both")
    from scheduler.server.common.restricted import RestrictedApis  # noqa: PLC0415 (one-line errors now)
    RestrictedApis.parse(args.grpc_restricted_protocol, "--grpc-restricted-protocol", grpc_prefix=True)
    RestrictedApis.parse(args.http_restricted_api, "--http-restricted-api", grpc_prefix=False)
    ports = {"--grpc-port": args.grpc_port, "--http-port": args.http_port, "--metrics-port": args.metrics_port}
    shared = ("--grpc-port", "--http-port") if args.worker_of else ()  # a worker shares them with its siblings
    for flag, port in ports.items():
        if not 0 < port < 65536:
            raise InputError(f"{flag}: {port} is not a TCP port (1-65535)")
        if flag not in shared and port_in_use(port, args.bind):
            raise InputError(f"{flag}: port {port} on {args.bind} is already in use; choose another port")
    if len(set(ports.values())) != len(ports):
        raise InputError("--grpc-port, --http-port and --metrics-port must differ")
    from scheduler.server.planned.service import LIVE_POLICIES  # noqa: PLC0415

    if args.policy not in ("auto", *LIVE_POLICIES):
        raise InputError(f"--policy {args.policy}: choose one of auto, {', '.join(LIVE_POLICIES)}")
    from scheduler.server.common.trace_settings import parse_trace_config  # noqa: PLC0415

    trace = parse_trace_config(args.trace_config) if args.trace_config else None
    from scheduler.server.serve_front_cli import COMPRESSION_LEVELS, settings_from_args  # noqa: PLC0415

    tls = settings_from_args(args)
    from scheduler.server.common.latency_summary import parse_metrics_config  # noqa: PLC0415

    summaries = parse_metrics_config(args.metrics_config)
    _check_native(args, ports)
    args.native_http_port = _shared_native_http_port(args, ports)  # the workers' commands pass it on
    manifest, shard = None, (0, 1)
    if args.workers > 1:
        _check_workers(args)
    if args.replan is not None:
        if args.manifest is None:
            raise InputError("--replan needs --manifest (the plan it starts from)")
        if args.shard:
            raise InputError("--replan and --shard do not combine: a shard re-planning alone would re-plan the "
                             "whole cluster for its share of the load")
        from scheduler.server.control.replanner import load_settings  # noqa: PLC0415 (validates now: one-line errors)
        load_settings(args.replan)
    if args.manifest is not None:
        from model_repository_gen.manifest import load_manifest  # noqa: PLC0415 (validates now: one-line errors)
        from scheduler.server.planned.manifest_shard import manifest_shard, parse_shard  # noqa: PLC0415
        loaded = load_manifest(args.manifest)
        manifest = args.manifest
        if args.shard:
            shard = parse_shard(args.shard)
            manifest_shard(loaded, *shard)  # a shard without a complete pipeline fails now, in one line
        if args.workers > 1:
            from scheduler.server.planned.manifest_shard import check_split  # noqa: PLC0415
            check_split(loaded, args.workers)
    elif args.shard:
        raise InputError("--shard needs --manifest: it splits the manifest's vGPUs")
    return SidecarConfig(manifest=manifest, passthrough=args.passthrough, grpc_port=args.grpc_port,
                         http_port=args.http_port, metrics_port=args.metrics_port, bind=args.bind,
                         policy=args.policy, drain_timeout_s=args.drain_timeout,
                         batch_log=args.batch_log, overheads_out=args.overheads_out,
                         # None with a manifest: each plan's own reserve, a reload's too (PlannedService.create)
                         front_us=DEFAULT_FRONT_US if args.front_us is None and manifest is None else args.front_us,
                         shard=shard, replan=args.replan,
                         grpc_restricted=tuple(args.grpc_restricted_protocol),
                         http_restricted=tuple(args.http_restricted_api),
                         trace=trace, group=args.worker_of, native_grpc_port=args.native_grpc_port,
                         native_http_port=args.native_http_port, stage_protocol=args.stage_protocol,
                         passthrough_http=args.passthrough_http, tls=tls,
                         strict_readiness=args.strict_readiness, summaries=summaries,
                         grpc_header_forward_pattern=args.grpc_header_forward_pattern,
                         http_header_forward_pattern=args.http_header_forward_pattern,
                         grpc_compression=COMPRESSION_LEVELS.index(args.grpc_infer_response_compression_level))


def _check_native(args: argparse.Namespace, ports: dict[str, int]) -> None:
    """--native-grpc-port: refuse what it cannot serve, in one line."""
    from backends import native_front  # noqa: PLC0415
    from poolpipe_common.net import port_in_use  # noqa: PLC0415

    if args.native_grpc_port is None:
        if args.passthrough_http and not args.passthrough:
            raise InputError("--passthrough-http needs --passthrough (the same Triton's gRPC endpoint, for every "
                             "call but HTTP inference) or --native-grpc-port (whose front end forwards to it)")
        return
    if args.manifest is None and args.passthrough_http is None:
        raise InputError("--native-grpc-port needs --manifest (it serves the planned models) or "
                         "--passthrough-http (the pass-through Triton's models)")
    if args.worker_of:  # a worker of serve --workers: the parent checked the ports, and its siblings share them
        return
    native = {"--native-grpc-port": args.native_grpc_port}
    if args.native_http_port:  # 0: a free port
        native["--native-http-port"] = args.native_http_port
    for flag, port in native.items():
        if not 0 < port < 65536:
            raise InputError(f"{flag}: {port} is not a TCP port (1-65535)")
        if port in ports.values() or port_in_use(port, args.bind):
            raise InputError(f"{flag}: port {port} on {args.bind} is already in use; choose another port")
    if native_front.library() is None:  # built now, before a plan's shm pool exists (a BuildError is one line)
        raise InputError("--native-grpc-port: the native front end could not be built here (the log line above says "
                         "why: no C compiler); serve without the flag")


def _shared_native_http_port(args: argparse.Namespace, ports: dict[str, int]) -> int:
    """--native-http-port as given; with --workers and none given, one free port now, which every worker's front
    end then shares (each picking its own would give the workers' front ends different HTTP ports)."""
    from poolpipe_common.net import free_ports  # noqa: PLC0415

    if args.native_grpc_port is None or args.native_http_port or args.workers == 1:
        return args.native_http_port
    return free_ports(1, set(ports.values()) | {args.native_grpc_port}, args.bind)[0]


def _check_workers(args: argparse.Namespace) -> None:
    """--workers N > 1: refuse what cannot span several processes, in one line."""
    if args.manifest is None:
        raise InputError("--workers needs --manifest: the workers split the manifest's vGPUs (a pass-through-only "
                         "sidecar runs as one process)")
    if args.shard:
        raise InputError("--workers and --shard do not combine: --workers N already serves N shards, one per "
                         "worker (for sidecars on several hosts, give each host --shard I/N instead)")
    if args.replan is not None:
        raise InputError("--workers and --replan do not combine: the re-planner runs in one sidecar process and "
                         "cannot reload the workers' shares together; use --workers 1 with --replan")


def run(args: argparse.Namespace) -> int:
    from scheduler.server.app import Sidecar  # noqa: PLC0415
    from scheduler.server.common import event_loop  # noqa: PLC0415

    config = config_from_args(args)
    if args.workers > 1:
        from scheduler.server.workers import run_workers  # noqa: PLC0415
        return run_workers(args, config)
    if config.group is not None:  # a worker of serve --workers: its log lines name it
        _name_worker_in_log(config.group.index)
    try:
        loop = event_loop.loop_kind()
    except ValueError as e:
        raise InputError(str(e)) from None
    try:
        event_loop.run(Sidecar(config).run_until_signal(), loop)
    except OSError as e:
        raise InputError(f"cannot start the sidecar: {e}") from None
    return 0


def _name_worker_in_log(index: int) -> None:
    import logging  # noqa: PLC0415

    for handler in logging.getLogger().handlers:
        handler.setFormatter(logging.Formatter(f"%(asctime)s %(levelname)s %(name)s[worker {index}]: %(message)s"))
