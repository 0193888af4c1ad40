"""``poolpipe launch DIR [--host NAME]``: run a generated deployment's tritonservers in the foreground; on SIGHUP,
migrate them to what DIR names now (runtime.migration)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from poolpipe_common.arg_types import non_negative

if TYPE_CHECKING:
    from rich.console import Console

    from runtime.launch import Deployment
    from runtime.migration import Migration
    from runtime.sidecar_watch import SidecarWatch


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("launch", help="start the tritonservers of a generated deployment",
                       description="Start the tritonservers of one host (or all hosts) of DIR (from 'poolpipe "
                                   "generate') in parallel, wait until all are ready, print their endpoints, and "
                                   "stop them all on Ctrl-C / SIGTERM. On SIGHUP, migrate to the deployment DIR "
                                   "names now (e.g. a symlink re-pointed at a directory generated with 'generate "
                                   "--previous'): start the servers only it has and load its models into the "
                                   "servers both have, then, once the sidecar has reloaded, unload the old models "
                                   "and stop the servers only the old deployment had. A server that exits is "
                                   "restarted on its ports (back-off doubling from --restart-backoff, at most "
                                   "--max-restarts times in a row); servers and shared-memory regions left by a "
                                   "launch that was killed are stopped and removed at start (one line says what).")
    p.add_argument("dir", type=Path, help="output directory of 'poolpipe generate' (a symlink to one, to migrate)")
    p.add_argument("--host", action="append", help="start only this host's servers (repeatable; default: all)")
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds to wait for readiness (default 180, or 1800 where a server's engine may build a "
                        "TensorRT engine on first load: trt, ort-trt, auto; progress is printed every 15 s)")
    p.add_argument("--no-hardware-check", action="store_true",
                   help="skip the pynvml check of GPU names/count and of the MPS daemon")
    p.add_argument("--sidecar", metavar="HOST:PORT",
                   help="the sidecar's HTTP address: after a migration, the old deployment's servers stop once the "
                        "sidecar dispatches to the new one (GET /v2/poolpipe/plan)")
    p.add_argument("--sidecar-use-ssl", action="store_true",
                   help="ask the sidecar over HTTPS (serve --http-use-ssl), trusting the system's roots or "
                        "--sidecar-root-cert; implied by the --sidecar-*-cert flags")
    p.add_argument("--sidecar-root-cert", type=Path, metavar="PEM",
                   help="the CA certificate that signed the sidecar's HTTPS certificate (serve --http-server-cert)")
    p.add_argument("--sidecar-client-cert", type=Path, metavar="PEM",
                   help="launch's client certificate, for a sidecar that asks for one (serve --http-use-ssl-mutual)")
    p.add_argument("--sidecar-client-key", type=Path, metavar="PEM", help="the key of --sidecar-client-cert")
    p.add_argument("--sidecar-restricted-key", metavar="KEY=VALUE",
                   help="the header launch sends on its calls to the sidecar where serve --http-restricted-api "
                        "restricts poolpipe-admin (or model-repository) to <key>=<value>, e.g. admin-key=SECRET")
    p.add_argument("--retire-after", type=float, default=60.0, metavar="S",
                   help="without --sidecar: seconds from a migration's new servers being ready until the old "
                        "deployment's servers stop; reload the sidecar within them (default 60)")
    p.add_argument("--max-restarts", type=non_negative(int), default=5, metavar="N",
                   help="restarts of one server, in a row, before launch gives up and stops all (default 5; 0: "
                        "never restart, stop all when a server exits; a server that served 60 s starts over)")
    p.add_argument("--restart-backoff", type=non_negative(float), default=0.5, metavar="S",
                   help="seconds before the first restart of a server; doubled for each further one, at most 30 "
                        "(default 0.5)")
    p.add_argument("--triton-arg", action="append", default=[], metavar="ARG",
                   help="a tritonserver flag for every server this launch starts (repeatable), e.g. "
                        "--triton-arg=--grpc-use-ssl=true --triton-arg=--grpc-server-cert=host.pem "
                        "--triton-arg=--grpc-server-key=host.key: TLS on the stage servers' gRPC ports, one host's "
                        "certificate per launch --host H (the sidecar then calls them with --stage-protocol grpc "
                        "--stage-use-ssl)")
    p.set_defaults(func=_run)


class Migrator:
    """The SIGHUP side of ``launch``: one migration at a time, retired when the sidecar (or the clock) says."""

    def __init__(self, dep: "Deployment", args: argparse.Namespace, err: "Console",
                 sidecar: "SidecarWatch | None" = None) -> None:
        self.dep, self.args, self.err = dep, args, err
        self.sidecar = sidecar  # --sidecar (over HTTPS with --sidecar-use-ssl); None: retire by the clock
        self.migration: Migration | None = None
        self.retire_at = 0.0
        self.refused = ""  # the sidecar's last refusal, said once

    def begin(self) -> None:
        from poolpipe_common.errors import InputError
        from runtime.migration import begin_migration

        if self.migration is not None:
            self.err.print("poolpipe launch: a migration is under way; SIGHUP ignored until it finishes")
            return
        try:
            self.migration = begin_migration(self.dep, self.args.dir)
        except (InputError, RuntimeError, TimeoutError) as e:
            self.err.print(f"poolpipe launch: migration refused, the running servers serve on: {e}")
            return
        m = self.migration
        self.retire_at = time.monotonic() + self.args.retire_after
        wait = (f"waiting for the sidecar {self.sidecar.url} to serve it" if self.sidecar is not None
                else f"the old servers stop in {self.args.retire_after:.0f} s")
        print(f"migrating to {m.directory}: {m.steps.summary()}; new servers ready; reload the sidecar ({wait})",
              flush=True)

    def poll(self) -> None:
        from runtime.sidecar_watch import SidecarRefused

        m = self.migration
        if m is None:
            return
        try:
            done = (self.sidecar.serves(m.directory) if self.sidecar is not None
                    else time.monotonic() >= self.retire_at)
        except SidecarRefused as e:  # the old servers keep serving: stopping them unasked could fail requests
            if str(e) != self.refused:
                self.refused = str(e)
                print(f"poolpipe launch: {e}; the old servers keep running", file=sys.stderr, flush=True)  # one line
            return
        if done:
            report = m.finish()
            self.migration = None
            print(f"migrated to {m.directory}: {report.line()}", flush=True)


def waiting_line(dep: Deployment, pending: list[str], waited: float) -> str:
    """Progress while servers load: which are not ready, the deadline, the last line of the first one's log."""
    line = f"still loading after {waited:.0f} s of {dep.timeout_s:.0f}: {', '.join(pending)}"
    srv = dep.servers.get(pending[0])
    log = Path(srv.log_path) if srv is not None and srv.log_path else None
    if log is not None and log.is_file():
        last = [x for x in log.read_text(errors="replace").splitlines() if x.strip()][-1:]
        if last:
            line += f"; {pending[0]}: {last[0][:160]}"
    return line


def _run(args: argparse.Namespace) -> int:
    import signal

    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    from runtime.launch import Deployment
    from runtime.sidecar_watch import sidecar_watch
    from runtime.supervise import RestartPolicy, Supervisor, reclaim_predecessors, remove_state, write_state

    err = Console(stderr=True)
    # flags it cannot use (certificates, the key): one line, before anything starts
    watch = sidecar_watch(args.sidecar, args.sidecar_use_ssl, args.sidecar_root_cert, args.sidecar_client_cert,
                          args.sidecar_client_key, args.sidecar_restricted_key)
    dep = Deployment(args.dir, args.host, check_hardware=not args.no_hardware_check, timeout_s=args.timeout,
                     triton_args=args.triton_arg)
    dep.check_devices()  # a launch refused for its hardware leaves what dead launches left to one that runs
    reclaimed = reclaim_predecessors()  # before the port check: a dead launch's servers hold their ports
    if reclaimed.launches or reclaimed.shm_regions:
        print(reclaimed.line(), file=sys.stderr, flush=True)

    def terminate(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    hups: list[int] = []
    signal.signal(signal.SIGTERM, terminate)
    signal.signal(signal.SIGINT, terminate)
    signal.signal(signal.SIGHUP, lambda signum, _frame: hups.append(signum))
    total = len(dep.server_launches)
    dep.check_ports()  # port problems: one-line errors before anything starts
    for g in dep.gpus:
        err.print(f"GPU {g.index}: {g.name}, {g.memory_bytes / 2**30:.1f} GiB")
    try:
        with Progress(TextColumn("starting tritonservers"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=err, transient=False) as progress:
            task = progress.add_task("start", total=total)
            dep.on_ready = lambda _vid, ready, _total: progress.update(task, completed=ready)
            dep.on_wait = lambda pending, waited: progress.console.print(waiting_line(dep, pending, waited))
            try:
                dep.start(preflight=False)
            except (RuntimeError, TimeoutError) as e:
                err.print(f"poolpipe launch: error: {e}")
                return 1
        dep.on_ready = dep.on_wait = None
        for s in dep.server_launches:
            models = ", ".join(sorted(p.name for p in s.repository.iterdir() if p.is_dir()))
            print(f"{s.vgpu}: grpc {s.address}:{s.grpc_port}  http {s.address}:{s.http_port}  "
                  f"metrics {s.address}:{s.metrics_port}  models {models}")
        print(f"ready: {total} tritonserver(s); Ctrl-C to stop, SIGHUP to migrate to what {args.dir} names now",
              flush=True)
        migrator = Migrator(dep, args, err, watch)
        supervisor = Supervisor(dep, RestartPolicy(args.max_restarts, args.restart_backoff,
                                                   max(30.0, args.restart_backoff)), lambda s: print(s, flush=True))
        pids: dict[str, int] = {}
        while True:
            error = supervisor.poll()
            if error:
                err.print(f"poolpipe launch: error: {error}; stopping all")
                return 1
            now = {v: s.proc.pid for v, s in dep.servers.items() if s.proc is not None}
            if now != pids:  # started, restarted or migrated: the state a successor reclaims from
                pids = now
                write_state(dep)
            if hups:
                hups.clear()
                migrator.begin()
            migrator.poll()
            time.sleep(0.2)
    except KeyboardInterrupt:
        return 0
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)  # let the shutdown finish
        n = len(dep.servers)
        dep.stop()
        remove_state()
        if n:
            print(f"stopped {n} tritonserver(s)", file=sys.stderr, flush=True)
