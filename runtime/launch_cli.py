"""``poolpipe launch DIR [--host NAME]``: run a generated deployment's tritonservers in the foreground."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("launch", help="start the tritonservers of a generated deployment",
                       description="Start the tritonservers of one host (or all hosts) of DIR (from 'poolpipe "
                                   "generate') in parallel, wait until all are ready, print their endpoints, and "
                                   "stop them all on Ctrl-C / SIGTERM.")
    p.add_argument("dir", type=Path, help="output directory of 'poolpipe generate'")
    p.add_argument("--host", action="append", help="start only this host's servers (repeatable; default: all)")
    p.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for readiness (default 180)")
    p.add_argument("--no-hardware-check", action="store_true",
                   help="skip the pynvml check of GPU names/count and of the MPS daemon")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    import signal
    import time

    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    from runtime.launch import Deployment

    err = Console(stderr=True)
    dep = Deployment(args.dir, args.host, check_hardware=not args.no_hardware_check, timeout_s=args.timeout)

    def terminate(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, terminate)
    signal.signal(signal.SIGINT, terminate)
    total = len(dep.server_launches)
    dep.preflight()  # hardware and port problems: one-line errors before anything starts
    for g in dep.gpus:
        err.print(f"GPU {g.index}: {g.name}, {g.memory_bytes / 2**30:.1f} GiB")
    try:
        with Progress(TextColumn("starting tritonservers"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=err, transient=False) as progress:
            task = progress.add_task("start", total=total)
            dep.on_ready = lambda _vid, ready, _total: progress.update(task, completed=ready)
            try:
                dep.start(preflight=False)
            except (RuntimeError, TimeoutError) as e:
                err.print(f"poolpipe launch: error: {e}")
                return 1
        for s in dep.server_launches:
            models = ", ".join(sorted(p.name for p in s.repository.iterdir() if p.is_dir()))
            print(f"{s.vgpu}: grpc {s.address}:{s.grpc_port}  http {s.address}:{s.http_port}  "
                  f"metrics {s.address}:{s.metrics_port}  models {models}")
        print(f"ready: {total} tritonserver(s); Ctrl-C to stop", flush=True)
        while True:
            failed = dep.failed()
            if failed:
                vid, rc = next(iter(failed.items()))
                err.print(f"poolpipe launch: error: tritonserver of vGPU {vid} exited with status {rc} "
                          f"(log: {dep.servers[vid].log_path}); stopping all")
                return 1
            time.sleep(0.5)
    except KeyboardInterrupt:
        return 0
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # let the shutdown finish
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        n = len(dep.servers)
        dep.stop()
        if n:
            print(f"stopped {n} tritonserver(s)", file=sys.stderr, flush=True)
