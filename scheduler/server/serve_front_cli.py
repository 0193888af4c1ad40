"""``poolpipe serve``'s front-end flags with tritonserver's names: TLS (the gRPC port's as tritonserver's, the HTTP
port's in the same style, and the pass-through channel's; parsed into scheduler.server.common.tls settings, checked
at once: one-line errors), readiness and response compression."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from poolpipe_common.errors import InputError
from scheduler.server.common.tls import ClientTls, ServerTls, TlsSettings

TRUE, FALSE = ("true", "on", "1", "yes"), ("false", "off", "0", "no")
PORTS = ("grpc", "http")
PASSTHROUGH_FILES = ("root_cert", "client_cert", "client_key")
# the attributes these flags set (scheduler/server/workers.py passes them on to each worker)
DESTS = frozenset([f"{p}_{x}" for p in PORTS for x in ("use_ssl", "use_ssl_mutual", "server_cert", "server_key",
                                                      "root_cert")]
                  + [f"{side}_use_ssl" for side in ("passthrough", "stage")]
                  + [f"{side}_{x}" for side in ("passthrough", "stage") for x in PASSTHROUGH_FILES]
                  + ["strict_readiness", "grpc_infer_response_compression_level", "grpc_header_forward_pattern",
                     "http_header_forward_pattern", "metrics_config"])
COMPRESSION_LEVELS = ("none", "low", "med", "high")  # tritonserver's, grpc core's levels 0-3


def triton_bool(value: str) -> bool:
    """A boolean as tritonserver reads one (``--grpc-use-ssl=true``, ``=1``, ``=off`` ...)."""
    v = value.lower()
    if v in TRUE or v in FALSE:
        return v in TRUE
    raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")


def _regex(value: str) -> str:
    try:
        re.compile(value)
    except re.error as e:
        raise argparse.ArgumentTypeError(f"not a regular expression: {e}") from None
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--strict-readiness", type=triton_bool, default=True, metavar="BOOL",
                   help="as tritonserver: true (default) answers ready only while every planned model and the "
                        "pass-through Triton are ready; false answers ready while the sidecar is live, even when a "
                        "model is not (each model's own ready state still says so)")
    for port, what in (("grpc", "gRPC metadata"), ("http", "HTTP headers")):
        p.add_argument(f"--{port}-header-forward-pattern", type=_regex, metavar="REGEX",
                       help=f"as tritonserver: {what} whose (lower-case) name matches REGEX anywhere become string "
                            "parameters of the inference request (planned and pass-through models). Every client "
                            "header but hop-by-hop ones reaches the pass-through Triton as gRPC metadata either way")
    p.add_argument("--metrics-config", action="append", default=[], metavar="SETTING=VALUE",
                   help="as tritonserver (repeatable): summary_latencies=true adds Triton's latency summaries "
                        "(nv_inference_request/queue/compute_input/compute_infer/compute_output_summary_us, "
                        "quantiles over the last 60 s) for the planned models; summary_quantiles=0.5:0.05,0.9:0.01,"
                        "0.95:0.001,0.99:0.001 (the default) chooses the quantiles")
    p.add_argument("--grpc-infer-response-compression-level", choices=COMPRESSION_LEVELS, default="none",
                   help="as tritonserver: compress gRPC responses at this level, with an algorithm the client "
                        "accepts (grpc core's levels; here every response of the gRPC port, not only inference's) "
                        "(default: %(default)s). HTTP responses are compressed when the client's Accept-Encoding "
                        "asks for gzip or deflate")
    for port, what in (("grpc", "gRPC"), ("http", "HTTP/REST")):
        p.add_argument(f"--{port}-use-ssl", type=triton_bool, nargs="?", const=True, default=False,
                       metavar="BOOL", help=f"serve the {what} port over TLS (as tritonserver: needs "
                                            f"--{port}-server-cert and --{port}-server-key)")
        p.add_argument(f"--{port}-use-ssl-mutual", type=triton_bool, nargs="?", const=True, default=False,
                       metavar="BOOL", help=f"mutual TLS on the {what} port: clients must present a certificate "
                                            f"signed by --{port}-root-cert (implies --{port}-use-ssl)")
        p.add_argument(f"--{port}-server-cert", type=Path, metavar="FILE",
                       help=f"PEM certificate (chain) of the {what} port")
        p.add_argument(f"--{port}-server-key", type=Path, metavar="FILE",
                       help=f"PEM private key of --{port}-server-cert (unencrypted)")
        p.add_argument(f"--{port}-root-cert", type=Path, metavar="FILE",
                       help=f"PEM root certificate(s) that sign client certificates (--{port}-use-ssl-mutual)")
    p.add_argument("--stage-use-ssl", type=triton_bool, nargs="?", const=True, default=False, metavar="BOOL",
                   help="call the planned models' tritonservers over TLS (servers started with --grpc-use-ssl, e.g. "
                        "by 'poolpipe launch --triton-arg'); needs --stage-protocol grpc (Triton's HTTP endpoint has "
                        "no TLS); each server's certificate must name its address in the manifest")
    _upstream_tls(p, "stage", "the stage servers' certificates", "stage servers")
    p.add_argument("--passthrough-use-ssl", type=triton_bool, nargs="?", const=True, default=False, metavar="BOOL",
                   help="call the --passthrough Triton over TLS (tritonserver --grpc-use-ssl); its certificate is "
                        "checked against --passthrough-root-cert (default: the system's roots) and must name the "
                        "HOST of --passthrough")
    _upstream_tls(p, "passthrough", "the pass-through Triton's certificate", "a pass-through Triton")


def _upstream_tls(p: argparse.ArgumentParser, name: str, signed: str, to_whom: str) -> None:
    """--NAME-root-cert, --NAME-client-cert and --NAME-client-key: the sidecar as a TLS client of an upstream."""
    p.add_argument(f"--{name}-root-cert", type=Path, metavar="FILE", help=f"PEM root certificate(s) that sign {signed}")
    p.add_argument(f"--{name}-client-cert", type=Path, metavar="FILE",
                   help=f"PEM certificate the sidecar presents to {to_whom} with --grpc-use-ssl-mutual")
    p.add_argument(f"--{name}-client-key", type=Path, metavar="FILE", help=f"PEM private key of --{name}-client-cert")


def _server(args: argparse.Namespace, port: str) -> ServerTls | None:
    def get(name: str):
        return getattr(args, f"{port}_{name}")
    mutual, on = get("use_ssl_mutual"), get("use_ssl") or get("use_ssl_mutual")  # mutual preempts, as in Triton
    files = {f"--{port}-{x.replace('_', '-')}": get(x) for x in ("server_cert", "server_key", "root_cert")}
    if not on:
        given = [flag for flag, v in files.items() if v is not None]
        if given:
            raise InputError(f"{given[0]} is given but --{port}-use-ssl is not: the {port} port would stay "
                             f"plaintext; add --{port}-use-ssl (or drop the file flags)")
        return None
    missing = [f for f in (f"--{port}-server-cert", f"--{port}-server-key") if files[f] is None]
    if mutual and files[f"--{port}-root-cert"] is None:
        missing.append(f"--{port}-root-cert")
    if missing:
        needs = f"--{port}-use-ssl-mutual" if mutual else f"--{port}-use-ssl"
        raise InputError(f"{needs} needs {' and '.join(missing)}")
    return ServerTls(get("server_cert"), get("server_key"), get("root_cert"), mutual, f"--{port}")


def _client(args: argparse.Namespace, side: str) -> ClientTls | None:
    """--passthrough-* or --stage-*: a channel's TLS (None: plaintext), the file flags checked against the switch."""
    files = {x: getattr(args, f"{side}_{x}") for x in PASSTHROUGH_FILES}
    if not getattr(args, f"{side}_use_ssl"):
        given = [x for x, v in files.items() if v is not None]
        if given:
            raise InputError(f"--{side}-{given[0].replace('_', '-')} is given but --{side}-use-ssl is not: the "
                             f"channel would stay plaintext; add --{side}-use-ssl")
        return None
    return ClientTls(files["root_cert"], files["client_cert"], files["client_key"], f"--{side}")


def _stage(args: argparse.Namespace) -> ClientTls | None:
    tls = _client(args, "stage")
    if tls is not None and args.stage_protocol != "grpc":
        raise InputError("--stage-use-ssl needs --stage-protocol grpc: Triton's HTTP endpoint has no TLS, so stage "
                         "calls over HTTP would stay plaintext")
    if tls is not None and args.manifest is None:
        raise InputError("--stage-use-ssl needs --manifest (the planned models' servers)")
    return tls


def _passthrough(args: argparse.Namespace) -> ClientTls | None:
    tls = _client(args, "passthrough")
    if tls is None:
        return None
    if args.passthrough is None:
        raise InputError("--passthrough-use-ssl needs --passthrough HOST:PORT")
    if args.passthrough_http:
        raise InputError("--passthrough-use-ssl and --passthrough-http do not combine: the native front end forwards "
                         "to --passthrough-http in plaintext HTTP")
    return tls


def settings_from_args(args: argparse.Namespace) -> TlsSettings:
    """The TLS settings, every file checked now (one-line InputErrors)."""
    settings = TlsSettings(grpc=_server(args, "grpc"), http=_server(args, "http"), passthrough=_passthrough(args),
                           stage=_stage(args))
    if settings.http is not None and args.native_grpc_port is not None:
        raise InputError("--http-use-ssl and --native-grpc-port do not combine: the native front end's HTTP port "
                         "(tritonserver's own HTTP endpoint) cannot take TLS; serve HTTPS on --http-port without "
                         "--native-grpc-port, or gRPC TLS (--grpc-use-ssl) with it")
    settings.check()
    return settings


def worker_args(args: argparse.Namespace) -> list[str]:
    """The TLS flags as given, for a worker of serve --workers."""
    out: list[str] = []
    for dest in sorted(DESTS):
        value = getattr(args, dest)
        flag = "--" + dest.replace("_", "-")
        if isinstance(value, bool):
            out.append(f"{flag}={'true' if value else 'false'}")
        elif isinstance(value, list):
            for v in value:
                out += [flag, str(v)]
        elif value is not None:
            out += [flag, str(value)]
    return out
