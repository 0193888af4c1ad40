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
    imp.add_argument("--dir", required=True, type=Path, help="reference directory (holds block-timing/, boundary-bytes/)")
    imp.add_argument("--model", required=True, help="model name, e.g. atss_r101_fpn_1x_coco")
    imp.add_argument("--out", required=True, type=Path, help="profile JSON to write")
    imp.set_defaults(func=_import_ppipe)


def _import_ppipe(args: argparse.Namespace) -> int:
    from planner.reference import import_ppipe_profile

    prof = import_ppipe_profile(args.dir, args.model)
    prof.save(args.out)
    levels = ", ".join(f"{d} V={','.join(map(str, prof.levels(d)))}" for d in prof.devices)
    print(f"wrote {args.out}: {prof.model}, {prof.num_blocks} blocks, {levels}")
    return 0
