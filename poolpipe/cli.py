"""The ``poolpipe`` command: a thin dispatcher into the packages' subcommand modules.

Each subcommand lives beside the code it drives, in a module exposing
``register(subparsers)`` that adds its parser and sets ``func(args) -> int``. Those modules keep
heavy imports inside ``func`` so that ``poolpipe --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from backends.native import BuildError
from poolpipe_common.errors import InputError

# Each command and the module that registers it; the order is the order shown in --help: the pipeline from
# measurement to serving.
SUBCOMMANDS = {
    "profile": "profiling.profile_cli",          # profile import-ppipe | measure | merge
    "plan": "planner.cli.plan_cli",
    "generate": "model_repository_gen.generate_cli",
    "launch": "runtime.launch_cli",
    "serve": "scheduler.server.serve_cli",
    "simulate": "scheduler.sim.simulate_cli",
    "calibrate": "loadtest.calibrate_cli",
    "loadtest": "loadtest.loadtest_cli",
    "demo": "poolpipe.demo",
}


def invoked(argv: list[str]) -> str | None:
    """The subcommand ``argv`` names (its first word that is not an option), if it is one."""
    first = next((a for a in argv if not a.startswith("-")), None)
    return first if first in SUBCOMMANDS else None


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command's parser; with ``only``, just that subcommand's (the others' modules not imported: `plan`
    starts 0.1-0.2 s sooner without the serving stack's imports)."""
    parser = argparse.ArgumentParser(
        prog="poolpipe",
        description="Serve CNNs on heterogeneous GPU clusters with pooled pipelines behind NVIDIA Triton: "
                    "profile -> plan -> generate -> launch -> serve, plus simulate and loadtest.")
    parser.add_argument("--version", action="version", version="poolpipe " + __import__("poolpipe").__version__)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in (SUBCOMMANDS[only],) if only else SUBCOMMANDS.values():
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(invoked(argv))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except InputError as e:
        print(f"poolpipe {args.command}: error: {e}", file=sys.stderr)
        return 2
    except BuildError as e:  # a native backend's C sources do not compile here (generate, serve --native-grpc-port)
        print(f"poolpipe {args.command}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
